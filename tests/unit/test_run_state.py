"""Local run state: the per-pipeline run lock is taken atomically, and a killed run's work folders do not stay."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

from trainyard.commands.local_run import RunLock
from trainyard.launch.local import remove_orphaned_work, work_folder, work_root

RACER = """
import sys, time
from pathlib import Path
from trainyard.commands.local_run import RunLock
lock = RunLock(Path(sys.argv[1]))
sys.stdin.readline()  # every racer waits here, then all try at once
won = lock.acquire()
if won:
    lock.take("run-" + sys.argv[2])
print("won" if won else "lost", flush=True)
time.sleep(1.5)
"""


def test_two_runs_started_together_cannot_both_take_the_lock(tmp_path: Path) -> None:
    """Was check-then-write: every racer read "no holder", and all of them ran."""
    path = tmp_path / "trainyard-run" / "digits.json"
    racers = [subprocess.Popen([sys.executable, "-c", RACER, str(path), str(i)], stdin=subprocess.PIPE,
                               stdout=subprocess.PIPE, text=True) for i in range(6)]
    for racer in racers:
        racer.stdin.write("go\n")
        racer.stdin.flush()
    outcomes = [racer.communicate(timeout=60)[0].strip() for racer in racers]
    assert sorted(outcomes) == ["lost"] * 5 + ["won"]


def test_a_killed_holder_frees_the_lock_and_leaves_its_run_named(tmp_path: Path) -> None:
    path = tmp_path / "trainyard-run" / "digits.json"
    code = ("import os, signal, sys; from pathlib import Path; from trainyard.commands.local_run import RunLock\n"
            "lock = RunLock(Path(sys.argv[1])); assert lock.acquire(); lock.take('run-killed')\n"
            "os.kill(os.getpid(), signal.SIGKILL)")
    assert subprocess.run([sys.executable, "-c", code, str(path)], timeout=60).returncode == -signal.SIGKILL
    lock = RunLock(path)
    assert lock.acquire()  # the kernel dropped the dead holder's lock
    assert lock.holder()["run_id"] == "run-killed"  # what the next `trainyard run` marks failed
    assert not RunLock(path).acquire()  # and now this process holds it
    lock.release()
    assert RunLock(path).acquire()


def test_work_folders_a_killed_run_left_are_removed_by_the_next_one(tmp_path: Path) -> None:
    """Was: a SIGKILLed `trainyard run` left its /tmp/trainyard-job-* folders forever."""
    code = ("import os, signal; from trainyard.launch.local import work_folder\n"
            "with work_folder('job') as work:\n"
            "    (work / 'chief').mkdir(); (work / 'chief' / 'ckpt').write_bytes(b'x' * 4096)\n"
            "    print(work, flush=True); os.kill(os.getpid(), signal.SIGKILL)")
    env = {**os.environ, "TMPDIR": str(tmp_path)}
    killed = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, env=env)
    left = Path(killed.stdout.strip())
    assert killed.returncode == -signal.SIGKILL and left.is_dir() and left.parent.parent == tmp_path
    mine = left.parent / f"pod-{os.getpid()}-live"
    mine.mkdir()  # a live owner's folder stays
    assert remove_orphaned_work(left.parent) == [left.name]
    assert not left.exists() and mine.is_dir()


def test_a_work_folder_is_private_and_removed_after_use(tmp_path: Path, monkeypatch) -> None:  # noqa: ANN001
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    import tempfile

    monkeypatch.setattr(tempfile, "tempdir", None)  # re-read TMPDIR
    with work_folder("pod") as work:
        assert work.parent == work_root() and work.name.startswith(f"pod-{os.getpid()}-")
        assert work_root().stat().st_mode & 0o077 == 0
    assert not work.exists()
