"""The chunk prefetcher keeps order, raises the producer's error where it happened, and stops with its consumer."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import pytest

from trainyard_contract.runtime import StageError
from trainyard_prep.readers import prefetched


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
