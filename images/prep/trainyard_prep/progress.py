"""Throughput of the data stages: rows, MB/s and where the time goes (the seconds of each phase, as microseconds
per row), logged as the work runs and returned in the stage's result. Prep only: it never crosses to another
package, so it lives here rather than in the contract."""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Iterable, Iterator
from typing import Any, TypeVar

log = logging.getLogger("trainyard")
T = TypeVar("T")
_END = object()


class Progress:
    """Logs rows and MB/s at most every `every` seconds, and a final line; with `phase`/`timed`, the seconds of
    each phase of the work, reported as microseconds per row (where a stage's time goes)."""

    def __init__(self, what: str, every: float = 5.0):
        self.what, self.every = what, every
        self.rows = 0
        self.bytes = 0
        self.start = self.last = time.monotonic()
        self.phases: dict[str, float] = {}

    def add(self, rows: int, nbytes: int) -> None:
        self.rows += rows
        self.bytes += nbytes
        now = time.monotonic()
        if now - self.last >= self.every:
            self.last = now
            self._log("progress")

    @contextlib.contextmanager
    def phase(self, name: str) -> Iterator[None]:
        started = time.perf_counter()
        try:
            yield
        finally:
            self.phases[name] = self.phases.get(name, 0.0) + time.perf_counter() - started

    def timed(self, name: str, items: Iterable[T]) -> Iterator[T]:
        """`items`, with the time spent producing each one (reading a chunk, say) counted as phase `name`."""
        iterator = iter(items)
        while True:
            with self.phase(name):
                item = next(iterator, _END)
            if item is _END:
                return
            yield item  # type: ignore[misc]

    def done(self) -> dict[str, Any]:
        self._log("done")
        elapsed = max(time.monotonic() - self.start, 1e-9)
        out: dict[str, Any] = {"rows": self.rows, "bytes": self.bytes, "seconds": round(elapsed, 3),
                               "rows_per_second": round(self.rows / elapsed, 1)}
        if self.phases:
            rows = max(self.rows, 1)
            out["us_per_row"] = {name: round(seconds * 1e6 / rows, 3) for name, seconds in self.phases.items()}
        return out

    def _log(self, label: str) -> None:
        elapsed = max(time.monotonic() - self.start, 1e-9)
        log.info("%s %s: %d rows, %.1f MB, %.0f rows/s, %.1f MB/s", self.what, label, self.rows,
                 self.bytes / 1e6, self.rows / elapsed, self.bytes / 1e6 / elapsed)


def combined_throughput(parts: list[dict[str, Any]]) -> dict[str, Any]:
    """Figures of groups that ran side by side (`Progress.done()` each): rows and bytes add up, the seconds are
    the slowest group's, and each phase's microseconds per row are the groups' average weighted by rows.
    One group's figures come back as they are."""
    if len(parts) == 1:
        return dict(parts[0])
    rows = sum(p["rows"] for p in parts)
    seconds = max((p["seconds"] for p in parts), default=0.0)
    out: dict[str, Any] = {"rows": rows, "bytes": sum(p["bytes"] for p in parts), "seconds": seconds,
                           "rows_per_second": round(rows / max(seconds, 1e-9), 1)}
    phases: dict[str, float] = {}
    for part in parts:
        for name, us in part.get("us_per_row", {}).items():
            phases[name] = phases.get(name, 0.0) + us * part["rows"]
    if phases:
        out["us_per_row"] = {name: round(total / max(rows, 1), 3) for name, total in phases.items()}
    return out
