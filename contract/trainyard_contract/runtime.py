"""What every stage entrypoint (images/*/__main__.py) shares: one shape (`stage_main`), exit codes, typed failures,
arguments, the config from the pod env and the result line. Part of the contract package: the Airflow
side builds the pod env and reads the result with the same names, and every image installs it (no Airflow, no
TensorFlow here)."""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import errno
import json
import logging
import os
import signal
import socket
import sys
import threading
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trainyard_contract.atomic import write_json
from trainyard_contract.results import StageResult
from trainyard_contract.schema import PipelineConfig

log = logging.getLogger("trainyard")

# Exit codes of every stage entrypoint; the operators do not retry 2, 3 and 4 (a retry would fail the same way).
EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_BAD_INPUT, EXIT_ENVIRONMENT = 0, 1, 2, 3, 4
NON_RETRYABLE_EXIT_CODES = frozenset({EXIT_USAGE, EXIT_BAD_INPUT, EXIT_ENVIRONMENT})
EXIT_MEANINGS = {
    EXIT_USAGE: "a usage error (the stage was started with bad arguments)",
    EXIT_BAD_INPUT: "bad input: the data, the config or the model code",
    EXIT_ENVIRONMENT: "the volume is full or not writable: free space or fix its permissions",
}

# The pod environment a stage is started with (built on the Airflow side by trainyard.dag.stages).
CONFIG_ENV = "TRAINYARD_CONFIG_JSON"  # the run's config, with the trigger's Param overrides applied
RUN_ENV = "TRAINYARD_RUN_JSON"  # how the run was started (run type, trigger Params): recorded in its lineage
XCOM_DIR = "/airflow/xcom"  # KubernetesPodOperator's XCom folder; the local backend maps it to a temp folder
XCOM_RETURN = f"{XCOM_DIR}/return.json"


def is_retryable_exit(code: int | None) -> bool:
    """False for the codes a stage uses to say its input is bad: running it again would fail the same way."""
    return code not in NON_RETRYABLE_EXIT_CODES


class StageFailure(Exception):
    """A failure a stage reports in its own words, without a stack trace. `exit_code` says whether a retry may help
    (EXIT_FAILED: it may) and `outcome` how the entrypoint words it: "<command> <outcome>: <the message>"."""

    exit_code = EXIT_FAILED
    outcome = "failed"


class StageError(StageFailure):
    """Bad input the user must fix (the data, the config, the model code): exit EXIT_BAD_INPUT, never retried.
    Stages raise it where they know the input is at fault; any other exception stays a retryable failure."""

    exit_code = EXIT_BAD_INPUT


# errno values that no retry fixes: someone must free space or fix permissions first
ENVIRONMENT_ERRNOS = {errno.ENOSPC: "out of space", errno.EDQUOT: "out of disk quota",
                      errno.EACCES: "permission denied", errno.EPERM: "operation not permitted",
                      errno.EROFS: "read-only file system"}
# the same conditions as TensorFlow's C++ file system (and other libraries) word them in an exception's text
ENVIRONMENT_TEXTS = {"No space left on device": "out of space", "Disk quota exceeded": "out of disk quota",
                     "Permission denied": "permission denied", "Read-only file system": "read-only file system"}


def environment_problem(exc: BaseException) -> str | None:
    """'out of space', 'permission denied', ... when `exc` (or what it was raised from) says the volume cannot be
    written; None for anything else."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, OSError) and current.errno in ENVIRONMENT_ERRNOS:
            return ENVIRONMENT_ERRNOS[current.errno]
        text = str(current)
        for words, name in ENVIRONMENT_TEXTS.items():
            if words in text:
                return name
        current = current.__cause__ or current.__context__
    return None


ERROR_MARKER = "::trainyard-error::"


def report_error(message: str, code: int = EXIT_BAD_INPUT) -> int:
    """Log a stage's failure in its own words and print it once more as the stage's last line, behind a marker
    the launchers look for: the run's failure summary then quotes this line, however long the output before it.
    Returns `code`, for `return report_error(...)`."""
    log.error("%s", message)
    print(f"{ERROR_MARKER}{json.dumps(message[:4000])}", flush=True)  # JSON: one line, newlines kept
    return code


def run_stage(main: Callable[[], int]) -> int:
    """Run a stage entrypoint's `main` so that every way it fails ends with its cause on the marker line: an
    exception nothing caught is logged with its traceback and reported by its exception line; a volume that is
    full or not writable exits EXIT_ENVIRONMENT (not retried: a retry would meet the same full disk)."""
    try:
        return main()
    except (SystemExit, KeyboardInterrupt):
        raise
    except BaseException as exc:  # noqa: BLE001 - the last resort: say what happened, then exit non-zero
        log.exception("the stage failed")
        problem = environment_problem(exc)
        text = f"{type(exc).__name__}: {exc}".splitlines()[0]
        if problem is not None:
            return report_error(f"{problem}: {text}", EXIT_ENVIRONMENT)
        return report_error(text, EXIT_FAILED)


class CauseTracker:
    """Finds a failed stage's cause in its output as the lines go by, keeping only what it needs: the last
    error marker (`report_error`), else the exception line of the last traceback, else the last ERROR log line.
    The launchers keep only a tail of the output; the cause may be far above it."""

    def __init__(self) -> None:
        self.marker: str | None = None
        self.latest: str | None = None
        self._in_traceback = False

    def feed(self, line: str) -> None:
        at = line.find(ERROR_MARKER)
        if at >= 0:
            text = line[at + len(ERROR_MARKER):].strip()
            try:
                decoded = json.loads(text)
            except json.JSONDecodeError:  # cut short (a log line limit): keep what arrived
                decoded = text
            self.marker = decoded if isinstance(decoded, str) else text
            return
        text = line.rstrip()
        if "Traceback (most recent call last):" in text:
            self._in_traceback = True
            return
        if self._in_traceback:
            if not text or text[0] in " \t" or text.startswith(("During handling", "The above exception")):
                return  # a frame, a blank line, or the text between two chained tracebacks
            self.latest, self._in_traceback = text, False
            return
        if " ERROR " in text:
            self.latest = text.split(" ERROR ", 1)[1].strip()

    @property
    def cause(self) -> str | None:
        return self.marker or self.latest


def failure_cause(lines: Iterable[str]) -> str | None:
    tracker = CauseTracker()
    for line in lines:
        tracker.feed(line)
    return tracker.cause


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
    """Exit 143 (128 + SIGTERM) on SIGTERM, even as a container's PID 1 and whichever thread the signal lands on.

    The kernel ignores a signal whose handler is the default for PID 1, which every stage process is in its pod,
    so without a handler a deleted pod (a lost replica, a stopped task, a cleanup sweep) ran out its whole grace
    period: a chief kept training and writing checkpoints into the run folder after its job had failed.

    A Python handler alone is not enough either: the kernel gives a process's signal to any thread that does not
    block it (in a TensorFlow process, most often one of gRPC's many threads), and Python runs the handler in the
    main thread only once that thread next runs Python code. A parameter server asleep in its serve loop or a chief
    waiting in `coordinator.join()` did not, so it outlived SIGTERM (seen on CI). `_watch_for_sigterm` therefore
    also stops the process from a thread of its own. One exit path (`os._exit(143)`, what a shell and the kubelet
    report for a SIGTERM death either way), so the status does not depend on which thread got the signal. Main
    thread only (Python's rule for handlers); a second call changes nothing."""
    if threading.current_thread() is not threading.main_thread() or signal.getsignal(signal.SIGTERM) is _stop_now:
        return
    signal.signal(signal.SIGTERM, _stop_now)
    _watch_for_sigterm()


def _stop_now(signum: int = signal.SIGTERM, frame: Any = None) -> None:
    """Log, flush and exit 143 at once, from any thread (the main thread's handler or the watcher)."""
    log.warning("SIGTERM: stopping now")
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    os._exit(128 + signal.SIGTERM)


def _watch_for_sigterm() -> None:
    """A daemon thread that runs `_stop_now` as soon as any thread of the process receives SIGTERM.

    Python's C-level handler writes each caught signal's number to the wakeup fd from whichever thread the kernel
    chose; this thread is blocked reading it, so it wakes at once even while the main thread waits in a sleep, a
    lock or a C call that let go of the GIL. It stops the process only while `_stop_now` is still SIGTERM's handler:
    an entrypoint that installs its own (the stream scorer drains its batch) keeps its behaviour. A fork's child
    drops the wakeup fd, so its signals never stop the parent."""
    reader, writer = socket.socketpair()  # not inheritable (PEP 446): an exec'd child does not get them
    writer.setblocking(False)  # the C handler must never block
    try:
        signal.set_wakeup_fd(writer.fileno(), warn_on_full_buffer=False)
    except ValueError:  # not the main thread of the main interpreter: the handler alone does what it can
        reader.close()
        writer.close()
        return

    def watch() -> None:
        # `writer` is held here for the life of the process: collected, its fd closes and the signals are lost
        while writer.fileno() >= 0:
            caught = reader.recv(64)
            if signal.SIGTERM in caught and signal.getsignal(signal.SIGTERM) is _stop_now:
                _stop_now()

    def forget_in_child() -> None:
        with contextlib.suppress(ValueError):
            signal.set_wakeup_fd(-1)

    os.register_at_fork(after_in_child=forget_in_child)
    threading.Thread(target=watch, name="sigterm-watch", daemon=True).start()


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
    try:
        return PipelineConfig.model_validate_json(raw)
    except ValueError as exc:  # pydantic's ValidationError: a config the Airflow side's schema did not check
        raise StageError(f"{CONFIG_ENV} is not a config this image accepts: {exc}") from None


Outcome = StageResult | dict[str, Any] | int | None


@dataclass(frozen=True)
class Command:
    """One sub-command of an image's entrypoint (the name is the parser's sub-command, the key in `COMMANDS`).

    `run(args, config)` returns the stage's result (a `StageResult`, or a dict of figures: written as its result
    and logged), None (success, no
    result: a training job's non-chief worker) or an exit code (a server that reports in its own way). `config` is
    the run's config from the pod env, or None for a command that `needs_config=False` (a server, `check-configs`)."""

    run: Callable[[argparse.Namespace, PipelineConfig | None], Outcome]
    needs_config: bool = True


def stage_main(parser: argparse.ArgumentParser, commands: Mapping[str, Command], argv: list[str] | None = None,
               describe: Callable[[argparse.Namespace], str] = lambda args: "") -> int:
    """The one shape of every image's entrypoint: parse, load the config, run the command, write its result; a
    StageFailure is reported in its words with its exit code (a full or read-only volume as EXIT_ENVIRONMENT),
    anything else with its traceback and the cause line (`run_stage`). `describe(args)` adds to the start line."""

    def main() -> int:
        args = parse_args(parser, argv)
        if isinstance(args, int):
            return args
        command = commands[args.command]
        try:
            config = load_config() if command.needs_config else None
            if config is not None:
                log.info("%s: pipeline=%s run=%s run_dir=%s%s", args.command, config.name, args.run_id,
                         args.run_dir, describe(args))
            outcome = command.run(args, config)
        except StageFailure as exc:
            problem = environment_problem(exc)
            if problem is not None:  # a checkpoint or export that met a full or read-only volume
                return report_error(f"{args.command} failed: {problem}: {exc}", EXIT_ENVIRONMENT)
            return report_error(f"{args.command} {exc.outcome}: {exc}", exc.exit_code)
        if isinstance(outcome, int):
            return outcome
        if isinstance(outcome, StageResult):
            outcome = outcome.payload()
        if outcome is not None:
            write_result(args.xcom, outcome)
            log.info("%s succeeded: %s", args.command, outcome)
        return EXIT_OK

    return run_stage(main)


def command_names(parser: argparse.ArgumentParser) -> set[str]:
    """The sub-commands `parser` accepts (a test holds them equal to an entrypoint's `COMMANDS`)."""
    for action in parser._actions:  # argparse keeps its sub-parsers here and nowhere public
        if isinstance(action, argparse._SubParsersAction):
            return set(action.choices)
    return set()


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
