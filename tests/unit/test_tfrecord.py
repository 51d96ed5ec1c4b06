"""prepare_data writes TFRecord files without TensorFlow: they must be the bytes TensorFlow's own writer writes."""

from __future__ import annotations

import contextlib
from pathlib import Path

import google_crc32c
import numpy as np
import pandas as pd
import pytest
import tensorflow as tf

from trainyard_prep.encoding import ExampleEncoder
from trainyard_prep.tfrecord import Rows, TemplateCRC, TFRecordFile, masked_crc32c


def tensorflow_file(path: Path, records: list[bytes]) -> bytes:
    with tf.io.TFRecordWriter(str(path)) as writer:
        for record in records:
            writer.write(record)
    return path.read_bytes()


def test_records_of_any_length_are_framed_as_tensorflow_frames_them(tmp_path: Path) -> None:
    records = [b"", b"x", bytes(range(256)) * 3, "Zürich".encode(), b"\x00" * 70_000]
    with TFRecordFile(tmp_path / "ours.tfrecord") as ours:
        assert ours.write_records(records[:2]) == 2
        assert ours.write_records(records[2:]) == 3
        assert ours.write_records([]) == 0
    assert (tmp_path / "ours.tfrecord").read_bytes() == tensorflow_file(tmp_path / "tf.tfrecord", records)
    read = [r.numpy() for r in tf.data.TFRecordDataset(str(tmp_path / "ours.tfrecord"))]
    assert read == records


def template_rows(count: int, width: int, varying: list[int], seed: int = 0) -> Rows:
    """Records equal to a random template except at `varying`, where each record has random bytes."""
    rng = np.random.default_rng(seed)
    template = rng.integers(0, 256, size=width, dtype=np.uint8)
    positions = np.array(varying, dtype=np.int64)
    template[positions] = 0
    matrix = np.broadcast_to(template, (count, width)).copy()
    matrix[:, positions] = rng.integers(0, 256, size=(count, len(positions)), dtype=np.uint8)
    return Rows(matrix, template.tobytes(), positions)


def test_rows_sharing_a_template_are_framed_as_tensorflow_frames_them(tmp_path: Path) -> None:
    rows = template_rows(1000, 37, [0, 5, 6, 7, 8, 36])
    with TFRecordFile(tmp_path / "ours.tfrecord") as ours:
        ours.write_rows(Rows(rows.matrix[:600], rows.template, rows.positions))
        ours.write_rows(Rows(rows.matrix[600:], rows.template, rows.positions))
        ours.write_rows(Rows(rows.matrix[:0], rows.template, rows.positions))
        assert ours.records == 1000
    expected = tensorflow_file(tmp_path / "tf.tfrecord", [row.tobytes() for row in rows.matrix])
    assert (tmp_path / "ours.tfrecord").read_bytes() == expected


@pytest.mark.parametrize(("width", "varying"), [(1, [0]), (40, list(range(40))), (300, [3, 150, 299])])
def test_template_crcs_equal_a_crc32c_of_each_record(width: int, varying: list[int]) -> None:
    rows = template_rows(500, width, varying, seed=width)
    crcs = TemplateCRC(rows.template, rows.positions)(rows.matrix)
    assert crcs.tolist() == [google_crc32c.value(row.tobytes()) for row in rows.matrix]


def test_the_crc_is_tensorflows_masked_crc32c() -> None:
    # crc32c("123456789") = 0xE3069283 (RFC 3720's check value), masked as TensorFlow's crc32c::Mask does
    crc = 0xE3069283
    assert masked_crc32c(b"123456789") == ((((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF)


def test_a_corrupted_record_is_refused_by_tensorflows_reader(tmp_path: Path) -> None:
    path = tmp_path / "ours.tfrecord"
    with TFRecordFile(path) as ours:
        ours.write_records([b"hello world"] * 3)
    data = bytearray(path.read_bytes())
    data[12 + 3] ^= 0xFF  # a byte of the first record's data: its CRC no longer matches
    path.write_bytes(bytes(data))
    with pytest.raises(tf.errors.DataLossError):
        list(tf.data.TFRecordDataset(str(path)))


@pytest.mark.parametrize("columns", [
    [("a", "float"), ("b", "float"), ("label", "int")],  # one layout: Rows and template CRCs
    [("a", "float"), ("count", "int"), ("label", "int")],  # varints of several lengths: records one by one
    [("city", "string"), ("a", "float"), ("label", "int")],  # text: the mixed encoder
])
def test_every_encoder_path_writes_what_tensorflows_writer_writes(tmp_path: Path, columns: list) -> None:
    rng = np.random.default_rng(1)
    frame = pd.DataFrame({"a": rng.normal(size=300), "b": rng.normal(size=300),
                          "count": rng.integers(0, 10**9, size=300), "city": rng.choice(["Lyon", "Oslo", ""], 300),
                          "label": rng.integers(0, 3, size=300)})
    encoder = ExampleEncoder(columns)
    with encoder.open_writers([tmp_path / "shard"]) as (writer,):
        assert writer.write(encoder.encode(frame)) == 300
    expected = tensorflow_file(tmp_path / "tf.tfrecord", encoder.impl.encode(frame))
    assert (tmp_path / "shard").read_bytes() == expected


def test_writes_behind_keep_each_files_order_within_the_byte_budget(tmp_path: Path) -> None:
    """Several files fed in turns through one WriteBehind: each file holds its own records in order, the same
    bytes as writing them directly; once with every buffer queued before the thread writes any (it waits for
    the lock the test holds), once with a budget smaller than two buffers, pages dropped behind every 30 kB."""
    from trainyard_prep.tfrecord import WriteBehind

    rng = np.random.default_rng(2)
    batches = [[bytes(rng.integers(0, 256, size=int(n), dtype=np.uint8)) for n in rng.integers(1, 3000, size=40)]
               for _ in range(30)]
    for label, behind in (("queued", WriteBehind(budget=1 << 30)), ("budget", WriteBehind(50_000, drop_every=30_000))):
        files = [TFRecordFile(tmp_path / f"{label}-{i}", behind) for i in range(3)]
        direct = [TFRecordFile(tmp_path / f"{label}-direct-{i}") for i in range(3)]
        with behind.changed if label == "queued" else contextlib.nullcontext():
            for turn, batch in enumerate(batches):
                files[turn % 3].write_records(batch)
                direct[turn % 3].write_records(batch)
            if label == "queued":
                assert len(behind.pending) == len(batches)  # nothing written yet: the order is the thread's
        for writer in files:
            writer.flush()
        assert behind.pending_bytes == 0 and not behind.pending
        behind.close()
        for writer in files + direct:
            writer.close()
        for i in range(3):
            assert (tmp_path / f"{label}-{i}").read_bytes() == (tmp_path / f"{label}-direct-{i}").read_bytes()
    assert sorted(behind.dropped_to.values())[0] >= 30_000  # every file was synced and dropped at least once
    assert (tmp_path / "budget-0").stat().st_size > 50_000  # many times the budget went through


def test_a_failed_write_behind_is_raised_in_the_stages_thread(tmp_path: Path) -> None:
    """/dev/full refuses every write (ENOSPC) as a full volume would: the error reaches the writer's caller at
    the next write, flush or close, and the writer is not left waiting."""
    from trainyard_prep.tfrecord import WriteBehind

    behind = WriteBehind(budget=1 << 20)
    full = TFRecordFile(tmp_path / "shard", behind)
    full.handle.close()
    full.handle = open("/dev/full", "wb", buffering=0)  # noqa: SIM115 - closed below
    try:
        full.write_records([b"x" * 1000])
        with pytest.raises(OSError, match="writing a shard failed: .*No space left on device"):
            for _ in range(100):  # bounded: the thread's error shows up at one of the next calls
                full.write_records([b"x" * 1000])
                full.flush()
        with pytest.raises(OSError, match="No space left"):
            behind.close()
        assert not behind.thread.is_alive()
    finally:
        full.close()


def test_rows_of_several_frame_blocks_are_framed_record_by_record_alike() -> None:
    """frame_rows works FRAME_ROWS records at a time: across block boundaries its bytes equal the per-record
    framing (one CRC32C call per record, itself checked against TensorFlow's writer above)."""
    from trainyard_prep.tfrecord import FRAME_ROWS, frame_records, frame_rows

    rows = template_rows(2 * FRAME_ROWS + 11, 23, [1, 2, 3, 20], seed=4)
    assert frame_rows(rows).tobytes() == frame_records([row.tobytes() for row in rows.matrix])
