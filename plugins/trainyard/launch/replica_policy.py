"""What a training job does when one of its replicas ends: one pure rule for both job monitors.

The local backend's `JobMonitor` and the Kubernetes backend's `KubernetesJob` watch the replicas differently
(process exit codes, pod phases) and ask this module what to do, so the two cannot drift apart. The rule is shaped
like Kubeflow's TFJob `restartPolicy: ExitCode`: a worker is replaced while the restart budget lasts unless its exit
code says a retry cannot help; a parameter server holds variables and cannot be replaced (the attempt fails, and
Airflow's retry resumes from the last checkpoint); the chief's end is the job's end and is handled by the monitor
itself. The permanent codes are not TFJob's: TFJob treats 1, 2, 126, 127, 128 and 139 as permanent, Trainyard only
its own stage codes 2 (usage), 3 (bad input) and 4 (volume full or not writable), `runtime.NON_RETRYABLE_EXIT_CODES`.
Any other end (1, a signal such as 139's SIGSEGV, a vanished pod) is retried while the budget lasts.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

from trainyard_contract.runtime import is_retryable_exit


class Action(Enum):
    FINISHED = "finished"  # exited 0: a multi_worker_mirrored worker that ran its steps, not a loss
    RESTART = "restart"  # replace the replica in place (same address, same TF_CONFIG)
    FAIL = "fail"  # stop the job; the task fails with `reason`


@dataclass(frozen=True)
class Verdict:
    action: Action
    reason: str


def describe_exit(exit_code: int | None) -> str:
    """How a replica ended, in words: an exit code, a signal (negative on the local backend), or gone."""
    if exit_code is None:
        return "vanished (evicted or deleted)"
    if exit_code < 0:
        return f"was killed by signal {-exit_code}"
    return f"exited with code {exit_code}"


def on_replica_exit(role: str, exit_code: int | None, restarts_used: int, budget: int) -> Verdict:
    """The verdict for a parameter server or worker that ended with `exit_code` (None: its pod is gone)."""
    if role == "chief":
        raise ValueError("the chief's end is the job's end; the monitor handles it, not the replica policy")
    how = describe_exit(exit_code)
    if exit_code == 0:
        return Verdict(Action.FINISHED, f"{how} (finished its steps)")
    if role != "worker":
        return Verdict(Action.FAIL, f"{how} (a parameter server cannot be replaced)")
    if not is_retryable_exit(exit_code):
        return Verdict(Action.FAIL, f"{how} (bad input or config: a restart would fail the same way)")
    if restarts_used >= budget:
        return Verdict(Action.FAIL, f"{how} (restart budget of {budget} exhausted)")
    return Verdict(Action.RESTART, f"{how}; restarting it ({restarts_used + 1} of {budget} restarts)")
