"""Which partitions a run reads."""

from __future__ import annotations

import datetime as dt
from pathlib import Path

from trainyard_prep.inputs import Partition, select_window

PARTS = [Partition(dt.date(2026, 11, d), Path(f"date=2026-11-{d:02d}")) for d in range(1, 6)]


def days(parts: list[Partition]) -> list[int]:
    return [p.day.day for p in parts]


def test_daily_interval_with_one_day_window_reads_that_day() -> None:
    end = dt.datetime(2026, 11, 3, tzinfo=dt.UTC)
    assert days(select_window(PARTS, end, 1)) == [2]


def test_no_window_reads_everything_before_the_end() -> None:
    assert days(select_window(PARTS, dt.datetime(2026, 11, 4, tzinfo=dt.UTC), None)) == [1, 2, 3]
    assert days(select_window(PARTS, None, None)) == [1, 2, 3, 4, 5]


def test_manual_run_midday_includes_today() -> None:
    end = dt.datetime(2026, 11, 5, 16, 30, tzinfo=dt.UTC)
    assert days(select_window(PARTS, end, 2)) == [4, 5]
