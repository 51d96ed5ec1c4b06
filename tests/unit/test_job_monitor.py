"""The local job monitor's rules, with real (tiny) processes standing in for replicas."""

from __future__ import annotations

import logging
import subprocess
import sys
import time
from pathlib import Path

from trainyard.launch.local import JobMonitor

LOG = logging.getLogger("test.monitor")


class Replica:
    """The part of LocalProcess the monitor uses: name, role, process, output, start()."""

    def __init__(self, name: str, role: str, exit_codes: list[int]):
        self.name, self.role, self.output = name, role, None
        self.exit_codes = exit_codes  # one per start
        self.starts = 0
        self.process: subprocess.Popen[bytes] | None = None
        self.start()

    def start(self, output: Path | None = None) -> None:
        code = self.exit_codes[min(self.starts, len(self.exit_codes) - 1)]
        script = "import time; time.sleep(30)" if code is None else f"raise SystemExit({code})"
        self.process = subprocess.Popen([sys.executable, "-c", script])
        self.starts += 1

    def stop(self) -> None:
        if self.process and self.process.poll() is None:
            self.process.kill()
            self.process.wait()


def watch(replicas: list[Replica], budget: int, seconds: float = 3.0) -> tuple[JobMonitor, list[str]]:
    fatal_calls: list[str] = []
    monitor = JobMonitor(replicas, budget, LOG, on_fatal=lambda: fatal_calls.append("stop chief"))
    monitor.POLL_SECONDS = 0.05
    monitor.start()
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline and monitor.fatal is None:
        time.sleep(0.05)
    monitor.stop()
    for replica in replicas:
        replica.stop()
    return monitor, fatal_calls


def test_a_lost_worker_is_restarted_within_the_budget() -> None:
    worker = Replica("w0", "worker", [1, None])  # dies once, then runs
    monitor, fatal = watch([worker, Replica("ps0", "ps", [None])], budget=2)
    assert (monitor.restarts, worker.starts, monitor.fatal, fatal) == (1, 2, None, [])


def test_an_exhausted_budget_stops_the_job() -> None:
    monitor, fatal = watch([Replica("w0", "worker", [1])], budget=2)
    assert monitor.restarts == 2
    assert monitor.fatal == "w0 exited with code 1 (restart budget of 2 exhausted)" and fatal == ["stop chief"]


def test_a_lost_parameter_server_stops_the_job_at_once() -> None:
    monitor, fatal = watch([Replica("ps0", "ps", [-9 % 256]), Replica("w0", "worker", [None])], budget=5)
    assert monitor.restarts == 0 and monitor.fatal.startswith("ps0 exited") and fatal == ["stop chief"]


def test_a_worker_that_finishes_cleanly_is_not_restarted() -> None:
    worker = Replica("w0", "worker", [0])
    monitor, fatal = watch([worker], budget=3, seconds=1.0)
    assert (monitor.restarts, worker.starts, monitor.fatal) == (0, 1, None)


def test_a_worker_that_reports_bad_input_is_not_restarted() -> None:
    worker = Replica("w0", "worker", [3, None])  # EXIT_BAD_INPUT: a restart would fail the same way
    monitor, fatal = watch([worker], budget=3)
    assert (monitor.restarts, worker.starts, fatal) == (0, 1, ["stop chief"])
    assert monitor.fatal == "w0 exited with code 3 (bad input or config: a restart would fail the same way)"
    assert monitor.fatal_code == 3
