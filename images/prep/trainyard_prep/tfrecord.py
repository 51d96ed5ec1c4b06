"""TFRecord files written without TensorFlow: the framing is four fields, so prepare_data needs no TF import
(4-7 s per stage here) and no TensorFlow in its image, and frames a whole chunk of records per write call.

A record on disk is `uint64 length | uint32 masked_crc32c(length) | data | uint32 masked_crc32c(data)`, little
endian, where `masked_crc32c(x) = rotate_right(crc32c(x), 15) + 0xA282EAD8` (TensorFlow's
`tensorflow/core/lib/hash/crc32c.h` and `core/lib/io/record_writer.cc`). CRC32C comes from google-crc32c's C
extension (hardware CRC instructions where the CPU has them), or, for a chunk of records that share a template
(numeric tables), from per-position lookup tables in numpy (`TemplateCRC`). The files are byte-identical to
`tf.io.TFRecordWriter`'s (tests/unit/test_tfrecord.py).
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType

import google_crc32c
import numpy as np

MASK_DELTA = 0xA282EAD8
_crc32c = google_crc32c.value


def mask(crc: int) -> int:
    return (((crc >> 15) | (crc << 17)) + MASK_DELTA) & 0xFFFFFFFF


def masked_crc32c(data: bytes) -> int:
    return mask(_crc32c(data))


def mask_all(crcs: np.ndarray) -> np.ndarray:
    """`mask` of each CRC, vectorised: little-endian uint32, as the file stores them."""
    crcs = crcs.astype(np.uint64)
    return ((((crcs >> 15) | (crcs << 17)) + MASK_DELTA) & 0xFFFFFFFF).astype("<u4")


def masked_crcs(records: list[bytes]) -> np.ndarray:
    """The masked CRC32C of each record (one C call per record, the mask vectorised)."""
    return mask_all(np.fromiter(map(_crc32c, records), dtype=np.uint64, count=len(records)))


class _Headers:
    """`length | masked_crc32c(length)` per record length; records of a chunk share a few lengths."""

    def __init__(self) -> None:
        self.cache: dict[int, bytes] = {}

    def __call__(self, length: int) -> bytes:
        header = self.cache.get(length)
        if header is None:
            prefix = struct.pack("<Q", length)
            header = self.cache[length] = prefix + struct.pack("<I", masked_crc32c(prefix))
        return header


_header = _Headers()


def frame_records(records: list[bytes]) -> bytes:
    """The on-disk bytes of `records`, in order."""
    if not records:
        return b""
    crcs = masked_crcs(records).tobytes()
    parts: list[bytes] = []
    for index, record in enumerate(records):
        parts += (_header(len(record)), record, crcs[4 * index : 4 * index + 4])
    return b"".join(parts)


@dataclass(frozen=True)
class Rows:
    """Records of one width that equal `template` except at the byte `positions` (where `template` is 0): what
    the numeric Example encoder makes of a chunk, one row per record."""

    matrix: np.ndarray  # uint8 [records, width]
    template: bytes
    positions: np.ndarray  # int64 [k], the bytes that vary


class TemplateCRC:
    """CRC32C of records that differ from a template only at known positions, without a call per record.

    CRC32C is affine over GF(2): for messages of one length, crc(a ^ b ^ c) = crc(a) ^ crc(b) ^ crc(c). A record
    is the template XOR one single-byte message per varying position, so its CRC is crc(template) XOR, per
    position p, table_p[byte]: table_p[x] = crc(template with x at p) ^ crc(template), built from 8 CRCs per
    position (one per bit, combined by linearity). Per chunk that is one table lookup per varying byte, in numpy.
    """

    def __init__(self, template: bytes, positions: np.ndarray):
        self.base = _crc32c(template)
        buffer = bytearray(template)
        bits = np.empty((len(positions), 8), dtype=np.uint32)
        for i, position in enumerate(positions.tolist()):
            for bit in range(8):
                buffer[position] = 1 << bit
                bits[i, bit] = _crc32c(bytes(buffer)) ^ self.base
            buffer[position] = 0
        # table[i, x] = XOR of bits[i, b] over the bits b set in x
        table = np.zeros((len(positions), 256), dtype=np.uint32)
        for bit in range(8):
            has_bit = ((np.arange(256) >> bit) & 1).astype(bool)
            table[:, has_bit] ^= bits[:, bit : bit + 1]
        self.table = table
        self.positions = positions

    def __call__(self, matrix: np.ndarray) -> np.ndarray:
        """The (unmasked) CRC32C of each row of `matrix`."""
        varying = np.ascontiguousarray(matrix[:, self.positions].T)  # [k, records]: one contiguous row per byte
        crcs = np.full(matrix.shape[0], self.base, dtype=np.uint32)
        for i in range(len(self.positions)):
            crcs ^= self.table[i][varying[i]]
        return crcs


_template_crcs: dict[bytes, TemplateCRC] = {}


def template_crc(template: bytes, positions: np.ndarray) -> TemplateCRC:
    """One TemplateCRC per template (a chunk's rows share a handful of layouts, chunk after chunk)."""
    key = template + positions.astype("<i8").tobytes()
    crc = _template_crcs.get(key)
    if crc is None:
        if len(_template_crcs) > 64:
            _template_crcs.clear()
        crc = _template_crcs[key] = TemplateCRC(template, positions)
    return crc


def frame_rows(rows: Rows) -> np.ndarray:
    """The on-disk bytes of equal-width records, as a uint8 array written as it is (no further copy): the framing
    is written column-wise and the CRCs come from the template's tables (`TemplateCRC`)."""
    matrix = rows.matrix
    count, width = matrix.shape
    if count == 0:
        return np.empty(0, dtype=np.uint8)
    masked = mask_all(template_crc(rows.template, rows.positions)(matrix))
    out = np.empty((count, 12 + width + 4), dtype=np.uint8)
    out[:, :12] = np.frombuffer(_header(width), dtype=np.uint8)
    out[:, 12 : 12 + width] = matrix
    out[:, 12 + width :] = masked.view(np.uint8).reshape(count, 4)
    return out


class TFRecordFile:
    """One TFRecord file, written a chunk of framed records at a time (`write_records`, `write_rows`)."""

    def __init__(self, path: Path):
        self.path = path
        self.handle = path.open("wb")
        self.records = 0

    def write_records(self, records: list[bytes]) -> int:
        self.handle.write(frame_records(records))
        self.records += len(records)
        return len(records)

    def write_rows(self, rows: Rows) -> int:
        self.handle.write(frame_rows(rows))
        self.records += rows.matrix.shape[0]
        return rows.matrix.shape[0]

    def write(self, records: Rows | list[bytes]) -> int:
        """Equal-layout rows (`write_rows`) or a list of records (`write_records`)."""
        if isinstance(records, Rows):
            return self.write_rows(records)
        return self.write_records(records)

    def close(self) -> None:
        self.handle.close()

    def __enter__(self) -> TFRecordFile:
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 trace: TracebackType | None) -> None:
        self.close()
