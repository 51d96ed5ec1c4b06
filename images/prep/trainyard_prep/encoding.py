"""Rows -> serialized `tf.train.Example` records, fast.

Building one Example proto per row in Python costs tens of microseconds per row and would dominate prepare_data.
For scalar numeric features (the common tabular case) the wire format is a fixed template per column with only the
value bytes changing, so `NumericExampleEncoder` writes whole chunks with numpy: each column's key/length prefix and
its little-endian float32 or varint int64 value go straight into one byte buffer. With text columns,
`MixedExampleEncoder` joins those numeric entries with cached per-value text entries.

Columns are (name, dtype) pairs in the stored dtypes (`Feature.stored_dtype`, and the label's: int class index or
float value), the label last; frames hold them already typed. Both encoders produce the bytes protobuf's own
serializer produces for the same Example (tests/unit/test_encoding.py compares them with a protobuf reference).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from trainyard_contract.runtime import StageError
from trainyard_prep.tfrecord import Rows, TFRecordFile, WriteBehind


def varint_encode(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(bytes[n, 10], lengths[n]) of the protobuf varint of each int64 (negatives as 10-byte two's complement)."""
    unsigned = values.astype(np.int64).view(np.uint64)
    shifts = (np.arange(10, dtype=np.uint64) * np.uint64(7))[None, :]
    groups = ((unsigned[:, None] >> shifts) & np.uint64(0x7F)).astype(np.uint8)
    # exact length: one byte, plus one for every further 7-bit group that still has bits set
    lengths = 1 + ((unsigned[:, None] >> shifts[:, 1:]) != 0).sum(axis=1)
    continuation = np.arange(10)[None, :] < (lengths[:, None] - 1)
    groups[continuation] |= 0x80
    return groups, lengths


def _varint_bytes(value: int) -> bytes:
    """The varint of one non-negative length (pure Python: called once per record)."""
    out = bytearray()
    while value > 0x7F:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


Columns = Sequence[tuple[str, str]]
BLOCK_ROWS = 4096  # rows encoded and framed at a time: a block of records (~0.3-2 MB) stays in the CPU's cache


class NumericExampleEncoder:
    """Vectorised Example encoder for scalar float/int columns.

    Rows whose int values have the same varint lengths share one byte layout (with small labels and no int
    features, that is every row). Per layout a template row is built once, then each column's value bytes are
    written into a (rows, width) matrix with contiguous slice assignments, and the records are its rows.
    """

    def __init__(self, columns: Columns):
        self.columns = list(columns)
        for name, _ in self.columns:
            if len(name.encode()) > 100:
                raise StageError(f"feature name {name[:20]}... is longer than 100 bytes")

    def _column_values(self, frame: pd.DataFrame) -> list[np.ndarray]:
        """Per column: float32 little-endian bytes [rows, 4], or int64 values. The float columns are converted
        in one block (one pass over the chunk, not one per column)."""
        floats = [name for name, dtype in self.columns if dtype == "float"]
        block = np.ascontiguousarray(frame[floats].to_numpy(dtype="<f4")).view(np.uint8) if floats else None
        position = {name: i for i, name in enumerate(floats)}
        values = []
        for name, dtype in self.columns:
            if dtype == "float":
                j = position[name]
                values.append(block[:, 4 * j : 4 * j + 4])
                continue
            column = frame[name]
            if column.isna().any():
                raise StageError(f"{name}: int column has empty values; declare it nullable (or dtype float)")
            values.append(np.asarray(column, dtype=np.int64))
        return values

    def _blocks(self, frame: pd.DataFrame) -> Iterator[tuple[np.ndarray, Rows]]:
        """(row numbers, the records as Rows) per byte layout; one block when every row shares one."""
        n = len(frame)
        values = self._column_values(frame)
        varints = {i: varint_encode(v) for i, v in enumerate(values) if v.dtype == np.int64}
        lengths_by_row = np.stack([lengths for _, lengths in varints.values()], axis=1) if varints else (
            np.zeros((n, 0), dtype=np.int64))
        # one integer per row (4 bits per varint length, 1..10); usually every row has the same layout
        keys = (lengths_by_row << (4 * np.arange(lengths_by_row.shape[1]))).sum(axis=1)
        if (keys == keys[0]).all():
            layouts, layout_of_row = lengths_by_row[:1], np.zeros(n, dtype=np.int64)
        else:
            _, first, layout_of_row = np.unique(keys, return_index=True, return_inverse=True)
            layouts, layout_of_row = lengths_by_row[first], layout_of_row.reshape(-1)
        for layout_index, layout in enumerate(layouts):
            rows = np.flatnonzero(layout_of_row == layout_index)
            every = len(rows) == n  # one layout: columns are copied as they are, not gathered by row
            lengths = dict(zip(varints, layout.tolist(), strict=True))
            template, slots = self._template(lengths)
            matrix = np.empty((len(rows), len(template)), dtype=np.uint8)
            sources = {column: varints[column][0][:, :width] if column in varints else values[column]
                       for column, (offset, width) in slots.items()}
            blank = np.frombuffer(template, dtype=np.uint8)
            # block by block, so the block stays in the CPU's cache while every column is written into it (a
            # column written over the whole matrix at once touches every row's cache line once per column)
            for start in range(0, len(rows), BLOCK_ROWS):
                block = matrix[start : start + BLOCK_ROWS]
                block[:] = blank
                picked = slice(start, start + BLOCK_ROWS) if every else rows[start : start + BLOCK_ROWS]
                for column, (offset, width) in slots.items():
                    block[:, offset : offset + width] = sources[column][picked]
            varying = np.concatenate([np.arange(offset, offset + width) for offset, width in slots.values()])
            yield rows, Rows(matrix, template, varying)

    def encode_chunk(self, frame: pd.DataFrame) -> Rows | list[bytes]:
        """The records as one Rows matrix when every row has the same byte layout, else as a list; the layouts
        are worked out once either way."""
        if len(frame) == 0:
            return []
        blocks = list(self._blocks(frame))
        if len(blocks) == 1:
            return blocks[0][1]
        return self._records(blocks, len(frame))

    def encode(self, frame: pd.DataFrame) -> list[bytes]:
        n = len(frame)
        if n == 0:
            return []
        return self._records(self._blocks(frame), n)

    @staticmethod
    def _records(blocks: Iterable[tuple[np.ndarray, Rows]], n: int) -> list[bytes]:
        """The records of every block, back in row order."""
        records: list[bytes] = [b""] * n
        for rows, block in blocks:
            data, width = block.matrix.tobytes(), block.matrix.shape[1]
            for position, row in enumerate(rows.tolist()):
                records[row] = data[position * width : (position + 1) * width]
        return records

    def _template(self, varint_lengths: dict[int, int]) -> tuple[bytes, dict[int, tuple[int, int]]]:
        """The bytes of one record with zeroed values, and where each column's value bytes go."""
        body = bytearray()
        slots: dict[int, tuple[int, int]] = {}
        for index, (name, dtype) in enumerate(self.columns):
            key = name.encode()
            if dtype == "float":
                # entry: 0A len | 0A klen key | 12 08 | 12 06 | 0A 04 <f32>
                body += bytes([0x0A, 2 + len(key) + 2 + 8, 0x0A, len(key)]) + key
                body += bytes([0x12, 0x08, 0x12, 0x06, 0x0A, 0x04])
                slots[index] = (len(body), 4)
                body += bytes(4)
            else:
                vl = varint_lengths[index]
                # entry: 0A len | 0A klen key | 12 (4+vl) | 1A (2+vl) | 0A vl | <varint>
                body += bytes([0x0A, 2 + len(key) + 2 + 4 + vl, 0x0A, len(key)]) + key
                body += bytes([0x12, 4 + vl, 0x1A, 2 + vl, 0x0A, vl])
                slots[index] = (len(body), vl)
                body += bytes(vl)
        header = b"\x0a" + _varint_bytes(len(body))
        return header + bytes(body), {c: (offset + len(header), w) for c, (offset, w) in slots.items()}


def _length_prefixed(tag: int, payload: bytes) -> bytes:
    return bytes([tag]) + _varint_bytes(len(payload)) + payload


def bytes_entry(key: bytes, value: bytes) -> bytes:
    """One `Features.feature` map entry holding a one-value BytesList (what protobuf writes for it)."""
    feature = _length_prefixed(0x0A, _length_prefixed(0x0A, value))  # Feature.bytes_list { value }
    return _length_prefixed(0x0A, _length_prefixed(0x0A, key) + _length_prefixed(0x12, feature))


class MixedExampleEncoder:
    """Text columns beside numeric ones: the numeric entries come from `NumericExampleEncoder` (vectorised), each
    text cell's entry from a per-column cache (categorical values repeat), joined per row. About 1 µs per text
    cell instead of a protobuf message per row."""

    def __init__(self, columns: Columns):
        self.columns = list(columns)
        numeric = [(n, d) for n, d in self.columns if d in ("float", "int")]
        self.numeric = NumericExampleEncoder(numeric) if numeric else None
        self.text = [n for n, d in self.columns if d == "string"]
        self.cache: dict[str, dict[str, bytes]] = {name: {} for name in self.text}
        for name in self.text:
            if len(name.encode()) > 100:
                raise StageError(f"feature name {name[:20]}... is longer than 100 bytes")

    def _entries(self, name: str, values: list[Any]) -> list[bytes]:
        cache, key = self.cache[name], name.encode()
        if len(cache) > 100_000:  # a free-text column: do not keep every value
            cache.clear()
        out = []
        for value in values:
            entry = cache.get(value)
            if entry is None:
                text = "" if value is None or (isinstance(value, float) and value != value) else str(value)
                entry = cache[value] = bytes_entry(key, text.encode())
            out.append(entry)
        return out

    def encode(self, frame: pd.DataFrame) -> list[bytes]:
        n = len(frame)
        if n == 0:
            return []
        bodies: list[bytes] = [b""] * n
        if self.numeric is not None:
            bodies = [strip_header(record) for record in self.numeric.encode(frame)]
        parts = [bodies] + [self._entries(name, frame[name].tolist()) for name in self.text]
        records = []
        for pieces in zip(*parts, strict=True):
            body = b"".join(pieces)
            records.append(b"\x0a" + _varint_bytes(len(body)) + body)
        return records


def strip_header(record: bytes) -> bytes:
    """An Example's Features body: the record without its leading `0A <varint length>`."""
    position = 1
    while record[position] & 0x80:
        position += 1
    return record[position + 1 :]


class ExampleEncoder:
    """The vectorised numeric encoder when every column is numeric, the mixed one with text columns; writes
    records to TFRecord files without TensorFlow (tfrecord.py)."""

    def __init__(self, columns: Columns):
        numeric = all(dtype in ("float", "int") for _, dtype in columns)
        self.impl = NumericExampleEncoder(columns) if numeric else MixedExampleEncoder(columns)

    @contextmanager
    def open_writers(self, paths: Sequence[Path]) -> Iterator[list[TFRecordFile]]:
        """One TFRecordFile per path, sharing one write-behind thread; on the way out every pending write is
        done (or its error raised) before the files close."""
        behind = WriteBehind()
        writers: list[TFRecordFile] = []
        try:
            for path in paths:
                path.parent.mkdir(parents=True, exist_ok=True)
                writers.append(TFRecordFile(path, behind))
            yield writers
            behind.close()
        finally:
            if behind.thread.is_alive():  # leaving on an error: stop the thread; the stage's error is the one raised
                with contextlib.suppress(OSError):
                    behind.close()
            for writer in writers:
                writer.close()

    def encode(self, frame: pd.DataFrame) -> Rows | list[bytes]:
        """A chunk's records, for `TFRecordFile.write`: one Rows matrix when every row has the same byte layout
        (numeric columns), else a list of records."""
        if isinstance(self.impl, NumericExampleEncoder):
            return self.impl.encode_chunk(frame)
        return self.impl.encode(frame)
