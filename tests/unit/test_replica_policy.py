"""The replica restart rule both job monitors apply (the contract's replica_policy), as a table."""

from __future__ import annotations

import pytest

from trainyard.launch.replica_policy import Action, on_replica_exit


@pytest.mark.parametrize(
    ("role", "code", "used", "budget", "action", "reason"),
    [
        ("worker", 1, 0, 2, Action.RESTART, "exited with code 1; restarting it (1 of 2 restarts)"),
        ("worker", None, 1, 2, Action.RESTART, "vanished (evicted or deleted); restarting it (2 of 2 restarts)"),
        ("worker", -9, 0, 1, Action.RESTART, "was killed by signal 9; restarting it (1 of 1 restarts)"),
        ("worker", 137, 2, 2, Action.FAIL, "exited with code 137 (restart budget of 2 exhausted)"),
        ("worker", 3, 0, 5, Action.FAIL, "exited with code 3 (bad input or config: a restart would fail the same way)"),
        ("worker", 2, 0, 5, Action.FAIL, "exited with code 2 (bad input or config: a restart would fail the same way)"),
        ("worker", 0, 0, 0, Action.FINISHED, "exited with code 0 (finished its steps)"),
        ("ps", 1, 0, 5, Action.FAIL, "exited with code 1 (a parameter server cannot be replaced)"),
        ("ps", None, 0, 5, Action.FAIL, "vanished (evicted or deleted) (a parameter server cannot be replaced)"),
        ("ps", 0, 0, 5, Action.FINISHED, "exited with code 0 (finished its steps)"),
    ],
)
def test_the_rule(role: str, code: int | None, used: int, budget: int, action: Action, reason: str) -> None:
    verdict = on_replica_exit(role, code, used, budget)
    assert (verdict.action, verdict.reason) == (action, reason)


def test_the_chief_is_not_the_policy_s_to_judge() -> None:
    with pytest.raises(ValueError, match="the chief's end is the job's end"):
        on_replica_exit("chief", 1, 0, 2)
