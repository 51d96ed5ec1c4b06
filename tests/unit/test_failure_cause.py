"""A failed stage's cause survives: found anywhere in its output, named when the volume is full, never retried then."""

from __future__ import annotations

import errno
import json
import subprocess
import sys
import textwrap

import pytest

from trainyard.commands.local_run import retry_advice
from trainyard.launch.base import StageFailed
from trainyard.launch.replica_policy import Action, on_replica_exit
from trainyard_contract.runtime import (
    ERROR_MARKER,
    EXIT_BAD_INPUT,
    EXIT_ENVIRONMENT,
    EXIT_FAILED,
    environment_problem,
    failure_cause,
    is_retryable_exit,
)

TRACEBACK = """Traceback (most recent call last):
  File "/app/prepare.py", line 10, in write
    handle.write(data)
OSError: [Errno 28] No space left on device: '/data/runs/r/prepared/.tmp-x/train-0.tfrecord'"""


def test_the_exception_line_is_the_cause_however_far_above_the_end() -> None:
    lines = ["2026-12-06 INFO prepare: pipeline=churn", *TRACEBACK.splitlines(),
             *[f"2026-12-06 INFO shutting down worker thread {i}" for i in range(60)]]
    assert failure_cause(lines) == ("OSError: [Errno 28] No space left on device: "
                                    "'/data/runs/r/prepared/.tmp-x/train-0.tfrecord'")


def test_a_chained_traceback_gives_its_last_exception() -> None:
    lines = [*TRACEBACK.splitlines(), "", "During handling of the above exception, another exception occurred:", "",
             "Traceback (most recent call last):", '  File "x.py", line 1, in <module>',
             "RuntimeError: the export could not be written"]
    assert failure_cause(lines) == "RuntimeError: the export could not be written"


def test_the_stage_marker_wins_and_keeps_its_lines() -> None:
    message = "validate failed: 2 problem(s)\n  - a: 3 nulls\n  - b: out of range"
    lines = ["2026-12-06 ERROR something else", f"{ERROR_MARKER}{json.dumps(message)}",
             *TRACEBACK.splitlines()]
    assert failure_cause(lines) == message
    assert failure_cause(["2026-12-06 10:00:00 ERROR merge failed: no groups", "INFO done"]) == \
        "merge failed: no groups"
    assert failure_cause(["INFO nothing went wrong"]) is None


def test_the_volume_errors_are_named_through_wrapping_exceptions() -> None:
    assert environment_problem(OSError(errno.ENOSPC, "No space left on device")) == "out of space"
    assert environment_problem(PermissionError(errno.EACCES, "Permission denied")) == "permission denied"
    try:
        try:
            raise OSError(errno.EROFS, "Read-only file system")
        except OSError as inner:
            raise RuntimeError("checkpoint failed") from inner
    except RuntimeError as outer:
        assert environment_problem(outer) == "read-only file system"
    # TensorFlow's file system words it in the text of its own error types
    assert environment_problem(RuntimeError("UnknownError: /data/ckpt; No space left on device")) == "out of space"
    assert environment_problem(ValueError("bad value")) is None
    assert not is_retryable_exit(EXIT_ENVIRONMENT)
    verdict = on_replica_exit("worker", EXIT_ENVIRONMENT, restarts_used=0, budget=3)
    assert verdict.action is Action.FAIL


STAGE = textwrap.dedent("""
    import errno, sys
    from trainyard_contract.runtime import run_stage, setup_logging

    def main():
        setup_logging()
        for i in range(50):
            print(f"line {i}", flush=True)
        if sys.argv[1] == "full":
            raise OSError(errno.ENOSPC, "No space left on device", "/data/x")
        raise KeyError("feature 'a'")

    sys.exit(run_stage(main))
""")


@pytest.mark.parametrize(("how", "code", "cause"), [
    ("full", EXIT_ENVIRONMENT, "out of space: OSError: [Errno 28] No space left on device: '/data/x'"),
    ("bug", EXIT_FAILED, "KeyError: \"feature 'a'\""),
])
def test_an_uncaught_error_ends_the_stage_with_its_cause(how: str, code: int, cause: str) -> None:
    done = subprocess.run([sys.executable, "-c", STAGE, how], capture_output=True, text=True, timeout=60)
    assert done.returncode == code, done.stdout + done.stderr
    assert done.stdout.splitlines()[-1].startswith(ERROR_MARKER)
    assert failure_cause((done.stdout + done.stderr).splitlines()) == cause
    assert "Traceback (most recent call last)" in done.stderr  # the traceback is still in the log


def test_the_failure_message_and_summary_end_with_the_cause() -> None:
    failed = StageFailed("pod p exited with code 4; last 2 lines of its output:\n    a\n    b", EXIT_ENVIRONMENT,
                         cause="out of space: OSError: [Errno 28] No space left on device")
    assert str(failed).splitlines()[-1] == "cause: out of space: OSError: [Errno 28] No space left on device"
    assert failed.stage_message == "out of space: OSError: [Errno 28] No space left on device"
    assert not failed.retryable
    job = StageFailed("training job failed: chief exited with code 3\n--- chief ---\nx", EXIT_BAD_INPUT,
                      cause="train failed: m failed on a training batch: InvalidArgumentError: indices[0] = 26 "
                            "is not in [0, 4)")
    assert job.stage_message == ("training job failed: chief exited with code 3: train failed: m failed on a "
                                 "training batch: InvalidArgumentError: indices[0] = 26 is not in [0, 4)")
    assert retry_advice({"exit_code": EXIT_ENVIRONMENT, "retryable": False}) == (
        "a retry would fail the same way: the volume is full or not writable: free space or fix its permissions, "
        "then run again")
    assert retry_advice({"exit_code": 1, "retryable": True}).endswith("running again may help")
