"""The chunk prefetcher keeps order, raises the producer's error where it happened, and stops with its consumer."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from trainyard_contract.runtime import StageError
from trainyard_prep.readers import chunks_of_files, prefetched


def test_items_come_in_order_and_the_producer_runs_one_ahead() -> None:
    produced: list[int] = []

    def items() -> Iterator[int]:
        for i in range(5):
            produced.append(i)
            yield i

    stream = prefetched(items())
    assert next(stream) == 0
    deadline = time.monotonic() + 5
    while len(produced) < 2 and time.monotonic() < deadline:  # 1 is read while 0 is being used
        time.sleep(0.01)
    time.sleep(0.2)
    assert produced == [0, 1]  # and not 2: one chunk ahead, no more
    assert list(stream) == [1, 2, 3, 4]


def test_an_error_of_the_producer_is_raised_after_the_items_before_it() -> None:
    def items() -> Iterator[int]:
        yield 1
        raise StageError("part-3.csv: malformed CSV")

    stream = prefetched(items())
    assert next(stream) == 1
    with pytest.raises(StageError, match="part-3.csv: malformed CSV"):
        next(stream)


def test_stopping_early_stops_the_producer() -> None:
    started = threading.Event()

    def endless() -> Iterator[int]:
        i = 0
        while True:
            started.set()
            yield i
            i += 1

    before = threading.active_count()
    stream = prefetched(endless())
    assert next(stream) == 0 and started.is_set()
    stream.close()  # the consumer stops (an exception in the stage, say)
    assert threading.active_count() == before


def test_files_read_as_one_stream_keep_going_past_a_bad_file(tmp_path: Path) -> None:
    """chunks_of_files: every chunk of every file in order, the next file read ahead like any chunk, and a file
    that cannot be read ends its part with its error while the next file follows."""
    good = tmp_path / "a.csv"
    good.write_text("x,y\n" + "".join(f"{i},{i * 2}\n" for i in range(5)))
    empty = tmp_path / "b.csv"
    empty.write_text("")
    last = tmp_path / "c.csv"
    last.write_text("x,y\n7,8\n")
    stream = list(prefetched(chunks_of_files([good, empty, last], chunk_rows=2)))
    assert [(item.file, None if item.frame is None else item.frame["x"].tolist()) for item in stream] == [
        (0, [0, 1]), (0, [2, 3]), (0, [4]), (1, None), (2, [7])]
    assert stream[3].error is not None and "b.csv: file is empty" in str(stream[3].error)
    assert [item.error for item in stream if item.file != 1] == [None] * 4
    assert stream[1].frame.index.tolist() == [2, 3]  # row numbers within its own file
    assert stream[4].frame.index.tolist() == [0]
