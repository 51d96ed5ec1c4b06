"""What every stage entrypoint (images/*/__main__.py) shares: exit codes, arguments, the config from the pod env,
the result line, progress logging. Part of the contract package: the Airflow side builds the pod env and reads the
result with the same names, and every image installs it (no Airflow, no TensorFlow here)."""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import json
import logging
import os
import time
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any, TypeVar

from trainyard_contract.atomic import write_json
from trainyard_contract.schema import PipelineConfig

log = logging.getLogger("trainyard")
T = TypeVar("T")
_END = object()

# Exit codes of every stage entrypoint; the operators do not retry 2 and 3 (a retry would fail the same way).
EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_BAD_INPUT = 0, 1, 2, 3
NON_RETRYABLE_EXIT_CODES = frozenset({EXIT_USAGE, EXIT_BAD_INPUT})

# The pod environment a stage is started with (built on the Airflow side by trainyard.stages).
CONFIG_ENV = "TRAINYARD_CONFIG_JSON"  # the run's config, with the trigger's Param overrides applied
RUN_ENV = "TRAINYARD_RUN_JSON"  # how the run was started (run type, trigger Params): recorded in its lineage
XCOM_DIR = "/airflow/xcom"  # KubernetesPodOperator's XCom folder; the local backend maps it to a temp folder
XCOM_RETURN = f"{XCOM_DIR}/return.json"


def is_retryable_exit(code: int | None) -> bool:
    """False for the codes a stage uses to say its input is bad: running it again would fail the same way."""
    return code not in NON_RETRYABLE_EXIT_CODES


class StageError(Exception):
    """A problem with the stage's input (data, config) that the user must fix; printed without a stack trace."""


def setup_logging() -> None:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s", force=True)
    for noisy in ("great_expectations", "absl", "tensorflow"):
        logging.getLogger(noisy).setLevel(logging.WARNING)


def add_run_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--volume", required=True, type=Path, help="root of the shared volume")
    parser.add_argument("--run-dir", required=True, type=Path, help="this run's folder on the volume")
    parser.add_argument("--run-id", required=True, help="the Airflow run id")
    parser.add_argument("--xcom", type=Path, help="where to write the small JSON result (KPO's return.json)")
    parser.add_argument("--window-end", type=dt.datetime.fromisoformat, help="data interval end (ISO 8601)")


def exit_on_sigterm() -> None:
    """Die on SIGTERM even as a container's PID 1.

    The kernel ignores a signal whose handler is the default for PID 1, which every stage process is in its pod,
    so without a handler a deleted pod (a lost replica, a stopped task, a cleanup sweep) ran out its whole grace
    period: a chief kept training and writing checkpoints into the run folder after its job had failed. Outside a
    container the process still dies by the signal itself, as it always did. Main thread only (Python's rule)."""
    import signal
    import sys
    import threading

    if threading.current_thread() is not threading.main_thread():
        return

    def stop(signum: int, frame: Any) -> None:
        log.warning("SIGTERM: stopping now")
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):
                stream.flush()
        if os.getpid() != 1:
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
            os.kill(os.getpid(), signal.SIGTERM)
        os._exit(128 + signal.SIGTERM)

    signal.signal(signal.SIGTERM, stop)


def parse_args(parser: argparse.ArgumentParser, argv: list[str] | None) -> argparse.Namespace | int:
    """Set up logging, stop on SIGTERM (see `exit_on_sigterm`) and parse; argparse's own exit (usage error 2,
    --help 0) becomes a return code."""
    setup_logging()
    exit_on_sigterm()
    try:
        return parser.parse_args(argv)
    except SystemExit as exc:
        return int(exc.code or 0)


def load_config() -> PipelineConfig:
    raw = os.environ.get(CONFIG_ENV)
    if not raw:
        raise StageError(f"{CONFIG_ENV} is not set: this entrypoint is started by Trainyard with the run's config")
    return PipelineConfig.model_validate_json(raw)


def load_trigger() -> dict[str, Any] | None:
    """How this run was started (run type, the trigger form's Param values), for the run's lineage."""
    raw = os.environ.get(RUN_ENV)
    if not raw:
        return None
    try:
        value = json.loads(raw)
    except json.JSONDecodeError as exc:
        raise StageError(f"{RUN_ENV} is not valid JSON: {exc}") from None
    return value if isinstance(value, dict) else None


RESULT_MARKER = "::trainyard-result::"


def write_result(path: Path | None, payload: dict[str, Any]) -> None:
    """Write the stage's small JSON result to `path` (the local backend's XCom) and print it once as a marker
    line, which is how the Kubernetes backend reads it: from the pod's log, for stage pods and the chief alike."""
    if path is not None:
        write_json(path, payload)
    print(f"{RESULT_MARKER}{json.dumps(payload, sort_keys=True, default=str)}", flush=True)


def result_from_log(lines: Iterable[str]) -> dict[str, Any] | None:
    """The last result marker in a pod's log lines (timestamps or prefixes before the marker are ignored)."""
    found = None
    for line in lines:
        at = line.find(RESULT_MARKER)
        if at >= 0:
            found = json.loads(line[at + len(RESULT_MARKER):])
    return found


def relative_to_volume(volume: Path, path: Path) -> str:
    return str(path.relative_to(volume))


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
