"""Faults during training on a real cluster, each ending in a successful run from the last checkpoint.

A digits run trains 6000 steps (digits trains at ~270 steps/s here: long enough to break it mid-way) with a
checkpoint every 100 steps. Once the chief has logged a checkpoint at step >= 500, a replica pod is deleted the
way an eviction or an operator would (`kubectl delete pod`, default grace):
- a worker: the job recreates it under the same hostname and training goes on in the same attempt;
- the parameter server or the chief: the job fails at once and Airflow's retry resumes from the last checkpoint.
Then `kill -9` of the process running `train`: its job's lease runs out and `trainyard cleanup`, run every 10 s as
an operator's schedule would, removes its pods and Service within the README's bound.
"""

from __future__ import annotations

import json
import os
import re
import signal
import time
from pathlib import Path

import pytest

from tests.cluster.conftest import NS, leftovers, start_trainyard, trainyard, wait_for

STEPS = 6000
CHECKPOINT = re.compile(r"\[chief\] .*step (\d+) loss .* checkpoint ckpt-\d+")
RESUMED = re.compile(r"\[chief\] .*restored checkpoint .*: resuming at step (\d+)")
CLEANUP_BOUND_SECONDS = 100  # README "Run on your cluster": lease 60 s + a 10 s schedule + pod termination
TRAIN = {"trainyard/pipeline": "digits", "trainyard/stage": "train"}


def checkpoints(log: Path) -> list[int]:
    return [int(m.group(1)) for m in CHECKPOINT.finditer(log.read_text(errors="replace"))]


def replica(core, role: str) -> str:  # noqa: ANN001
    """The live pod of `role`'s replica 0 (a replacement carries an `-r<n>` suffix)."""
    pods = core.list_namespaced_pod(namespace=NS, label_selector=",".join(
        [f"{k}={v}" for k, v in TRAIN.items()] + [f"trainyard/role={role}"])).items
    live = [p for p in pods if p.status.phase == "Running" and p.metadata.deletion_timestamp is None]
    return live[0].metadata.name if live else ""


def break_training(core, run_env: dict[str, str], tmp_path: Path, role: str,  # noqa: ANN001
                   **conf: int) -> tuple[str, int, float]:
    """Start a run, delete `role`'s pod after a checkpoint at step >= 500; the run's output, the last checkpoint
    step seen before the delete, and the seconds from the delete to the next checkpoint."""
    log = tmp_path / f"{role}.log"
    conf = {"steps": STEPS, "force_retrain": True, **conf}  # force_retrain: the volume may hold this very model
    process = start_trainyard("run", "digits", "--conf", json.dumps(conf), env=run_env, log=log)
    try:
        step = wait_for("a checkpoint at step >= 500", lambda: max(checkpoints(log), default=0) >= 500
                        and max(checkpoints(log)), 900, interval=0.2)
        name = replica(core, role)
        assert name, f"no running {role} pod"
        core.delete_namespaced_pod(name=name, namespace=NS)
        deleted = time.monotonic()
        print(f"\n{role} {name} deleted after step {step}")
        wait_for("the next checkpoint", lambda: max(checkpoints(log), default=0) > step, 600, interval=0.2)
        recovery = time.monotonic() - deleted
        print(f"{role}: next checkpoint {recovery:.1f}s after the delete")
        assert process.wait(timeout=1200) == 0, log.read_text(errors="replace")[-8000:]
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
    output = log.read_text(errors="replace")
    assert "finished: success" in output, output[-5000:]
    assert leftovers(core, TRAIN) == []
    return output, step, recovery


def test_a_deleted_worker_is_replaced_and_training_goes_on(core, seeded, run_env, tmp_path: Path) -> None:  # noqa: ANN001
    """The only worker: nothing trains until its replacement (same DNS name, new IP) is reached. With gRPC's
    defaults the chief waited ~30 s for a DNS re-resolution after the new pod was up (measured 30.7 s); with the
    replicas' TF_GRPC_DEFAULT_OPTIONS it is the replacement's start-up (5.8 s)."""
    output, step, recovery = break_training(core, run_env, tmp_path, "worker", workers=1)
    assert "training job finished; worker restarts: 1" in output
    assert not RESUMED.search(output)  # the same attempt went on: nothing was restored
    assert f"step {STEPS} loss" in output
    assert recovery < 20


@pytest.mark.parametrize("role", ["ps", "chief"])
def test_a_deleted_parameter_server_or_chief_fails_the_attempt_and_the_retry_resumes(
        core, seeded, run_env, tmp_path: Path, role: str) -> None:  # noqa: ANN001
    output, step, _ = break_training(core, run_env, tmp_path, role)
    assert re.search(rf"{role}-0 (vanished|exited with code)", output), output[-5000:]
    resumed = [int(s) for s in RESUMED.findall(output)]
    assert resumed and STEPS > resumed[-1] >= step, (resumed, step)
    assert f"step {STEPS} loss" in output


def test_kill_9_of_the_train_process_leaves_nothing_for_long(core, seeded, run_env, tmp_path: Path) -> None:  # noqa: ANN001
    log = tmp_path / "kill.log"
    process = start_trainyard("run", "digits", "--conf", json.dumps({"steps": 10**6, "force_retrain": True}),
                              env=run_env, log=log)
    try:
        wait_for("training under way", lambda: checkpoints(log), 900, interval=0.5)
    finally:
        os.killpg(process.pid, signal.SIGKILL)  # the task's process and everything it started, no cleanup at all
        process.wait()
    killed = time.monotonic()
    assert leftovers(core, TRAIN)  # its pods and Service run on: nobody is left to delete them
    first = trainyard("cleanup", "digits", env=run_env, timeout=120)
    assert first.returncode == 0 and "deleted 0 abandoned" in first.stdout, first.stdout + first.stderr  # leased

    def swept() -> bool:
        done = trainyard("cleanup", "digits", env=run_env, timeout=120)
        assert done.returncode == 0, done.stdout + done.stderr
        return not leftovers(core, TRAIN)

    wait_for("the leftovers to go", swept, CLEANUP_BOUND_SECONDS + 60, interval=10)
    lived = time.monotonic() - killed
    print(f"\nkill -9: leftovers gone {lived:.0f}s after the kill")
    assert lived <= CLEANUP_BOUND_SECONDS
