"""`trainyard run`: one pipeline run through Airflow (`dag.test()`) in this process, with the checks and the
summary a person needs: an Airflow home that is ready (or made ready), the pipeline's DAG shim in the dags folder,
the whole output kept in a log file, and after a failure the failed task, the stage's own message, whether a retry
would help, the run folder and the log. Ctrl-C stops the run (the launcher reaps the stage's processes, the task
fails without retry, the run is marked failed); a run a killed `trainyard run` left behind is marked failed by the
next one, found through a per-pipeline lock file that names the process and the run.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO


@dataclass(frozen=True)
class Problem:
    """Why a run cannot start, in one line, and what to do about it."""

    message: str


def airflow_home_problem() -> Problem | None:
    """None when the metadata database is ready; a fresh (empty) database is initialised on the spot."""
    import subprocess

    from airflow import settings as airflow_settings
    from sqlalchemy import inspect

    tables = set(inspect(airflow_settings.engine).get_table_names())
    home = airflow_settings.AIRFLOW_HOME
    if not tables & {"dag", "dag_run", "task_instance"}:
        print(f"trainyard run: initialising the Airflow database of {home} (first run; `airflow db migrate`)")
        done = subprocess.run([str(Path(sys.executable).with_name("airflow")), "db", "migrate"],
                              capture_output=True, text=True)
        if done.returncode != 0:
            tail = (done.stdout + done.stderr).strip().splitlines()[-1:] or ["no output"]
            return Problem(f"`airflow db migrate` failed for {home}: {tail[0]}")
        airflow_settings.engine.dispose()
        return None
    from airflow.utils.db import check_migrations

    try:
        check_migrations(timeout=0)
    except TimeoutError:
        return Problem(f"the Airflow database of {home} is not migrated to this Airflow: run `airflow db migrate`")
    return None


def shim_problem(pipeline: str) -> Problem | None:
    """None when the dags folder defines the pipeline's DAG; else the one file that is missing or broken."""
    from airflow.configuration import conf
    from airflow.dag_processing.dagbag import DagBag

    folder = Path(conf.get("core", "dags_folder"))
    bag = DagBag(dag_folder=str(folder))
    if pipeline in bag.dag_ids:
        return None
    for path, error in bag.import_errors.items():
        if Path(path).stem == pipeline:
            return Problem(f"{path} does not import: {str(error).strip().splitlines()[-1]}")
    return Problem(f"no DAG shim for pipeline {pipeline!r} in the dags folder: {folder / (pipeline + '.py')} is "
                   f"missing (create it with `trainyard new {pipeline}`, or copy dags/digits.py and change the name)")


class Tee:
    """Writes to the terminal and to a log file at once."""

    def __init__(self, stream: TextIO, log: TextIO):
        self.stream, self.log = stream, log

    def write(self, text: str) -> int:
        self.log.write(text)
        return self.stream.write(text)

    def flush(self) -> None:
        self.log.flush()
        self.stream.flush()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.stream, name)


@contextlib.contextmanager
def tee_output(path: Path) -> Iterator[Path]:
    """Everything this process prints (the task logs dag.test writes to the terminal) also goes to `path`."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as log:
        stdout, stderr = sys.stdout, sys.stderr
        sys.stdout, sys.stderr = Tee(stdout, log), Tee(stderr, log)
        try:
            yield path
        finally:
            sys.stdout, sys.stderr = stdout, stderr


def failure_summary(dag_run: Any) -> list[str]:
    """One line each: the failed task(s), the stage's own message, and whether a retry would help."""
    from airflow.models.taskinstance import TaskInstance
    from airflow.models.xcom import XComModel
    from airflow.utils.session import create_session

    from trainyard.dag.operators import FAILURE_XCOM

    lines: list[str] = []
    with create_session() as session:
        failed = session.query(TaskInstance).filter(
            TaskInstance.dag_id == dag_run.dag_id, TaskInstance.run_id == dag_run.run_id,
            TaskInstance.state == "failed").all()
        for ti in sorted(failed, key=lambda t: (t.start_date or dt.datetime.max.replace(tzinfo=dt.UTC), t.map_index)):
            record = session.query(XComModel).filter(
                XComModel.dag_id == ti.dag_id, XComModel.run_id == ti.run_id, XComModel.task_id == ti.task_id,
                XComModel.map_index == ti.map_index, XComModel.key == FAILURE_XCOM).first()
            value = XComModel.deserialize_value(record) if record is not None else None
            group = f"[{ti.map_index}] (file group {ti.map_index})" if ti.map_index >= 0 else ""
            lines.append(f"failed task: {ti.task_id}{group} (attempt {ti.try_number})")
            if isinstance(value, dict):
                lines.append(f"error: {value.get('message', '?')}")
                lines.append(retry_advice(value))
            else:
                lines.append("error: not a stage failure (see the task's traceback in the log)")
    return lines or ["no task failed (the run ended early: see the log)"]


def retry_advice(failure: dict[str, Any]) -> str:
    """What to do about a failed stage, by its exit code: fix the input, fix the volume, or run again."""
    from trainyard_contract.runtime import EXIT_ENVIRONMENT, EXIT_MEANINGS

    if failure.get("exit_code") == EXIT_ENVIRONMENT:
        return f"a retry would fail the same way: {EXIT_MEANINGS[EXIT_ENVIRONMENT]}, then run again"
    if not failure.get("retryable", True):
        return "a retry would fail the same way: fix the data, the config or the model code, then run again"
    return "not bad input (infrastructure, a lost replica, a bug): running again may help"


def skip_notes(dag_run: Any) -> list[str]:
    """One line per stage that skipped itself and said why (`train skipped: nothing new: ...`)."""
    from airflow.models.xcom import XComModel
    from airflow.utils.session import create_session

    from trainyard.dag.operators import SKIP_XCOM

    with create_session() as session:
        records = session.query(XComModel).filter(XComModel.dag_id == dag_run.dag_id,
                                                  XComModel.run_id == dag_run.run_id,
                                                  XComModel.key == SKIP_XCOM).all()
        return [f"{record.task_id} skipped: {XComModel.deserialize_value(record)}" for record in records]


class Interrupted(KeyboardInterrupt):
    """Ctrl-C during `trainyard run`: the running stage is stopped and the run ends failed, without retries."""


INTERRUPTED: list[bool] = []  # set once Ctrl-C arrived during `trainyard run`


def interrupt_handler(signum: int, frame: Any) -> None:
    """The first Ctrl-C stops the running stage (its processes are stopped and reaped by the launcher) and the
    run; a second one is Python's own KeyboardInterrupt."""
    import signal

    INTERRUPTED.append(True)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    raise Interrupted()


def publish_note(run_dir: Path) -> str:
    """What the deploy step of an interrupted run did, from its journal (`deploy/result.json`)."""
    from pydantic import ValidationError

    from trainyard_contract import layout
    from trainyard_contract.artifacts import DeployJournal

    try:
        journal = DeployJournal.model_validate_json((run_dir / layout.DEPLOY_RESULT).read_bytes())
    except (OSError, ValidationError):
        return "nothing was published"
    state, version = journal.state, journal.version
    if state == "verified":
        return f"version {version} had been published and verified before the stop"
    if state == "interrupted":
        return journal.reason or f"version {version} was published and not verified"
    if state == "published":
        return (f"version {version} was published and NOT verified; the next deploy or server start removes it "
                "(see deploy/result.json)")
    if state == "rolled_back":
        return f"version {version} was published, failed its checks and was removed"
    return "nothing was published"


def mark_failed(dag_id: str, run_id: str) -> int:
    """End a run that nobody will finish: its unfinished task instances and the run itself become failed, so
    `max_active_runs` no longer counts it and unpausing the DAG does not resume it. Returns the tasks changed."""
    from airflow.models.dagrun import DagRun
    from airflow.models.taskinstance import TaskInstance
    from airflow.utils.session import create_session
    from airflow.utils.state import DagRunState, TaskInstanceState

    unfinished = [None, TaskInstanceState.SCHEDULED, TaskInstanceState.QUEUED, TaskInstanceState.RUNNING,
                  TaskInstanceState.UP_FOR_RETRY, TaskInstanceState.UP_FOR_RESCHEDULE, TaskInstanceState.DEFERRED,
                  TaskInstanceState.RESTARTING]
    with create_session() as session:
        changed = 0
        for ti in session.query(TaskInstance).filter(TaskInstance.dag_id == dag_id, TaskInstance.run_id == run_id):
            if ti.state in unfinished:
                ti.state = TaskInstanceState.FAILED if ti.state is not None else TaskInstanceState.UPSTREAM_FAILED
                changed += 1
        for run in session.query(DagRun).filter(DagRun.dag_id == dag_id, DagRun.run_id == run_id):
            run.state = DagRunState.FAILED
    return changed


class RunLock:
    """Which process runs which run of a pipeline right now: `<AIRFLOW_HOME>/trainyard-run/<pipeline>.lock`, held
    with an exclusive `flock` for as long as the `trainyard run` lives (the kernel drops it when the process dies,
    however it dies), and `<pipeline>.json` beside it naming the process and the run. Taking the lock is one atomic
    step, so two runs started together cannot both pass. The lock file itself is never deleted: a process could
    otherwise lock a deleted file while another locks its replacement."""

    def __init__(self, path: Path):
        self.path = path  # the holder's JSON
        self._fd: int | None = None

    @classmethod
    def for_pipeline(cls, pipeline: str) -> RunLock:
        from airflow import settings as airflow_settings

        return cls(Path(airflow_settings.AIRFLOW_HOME) / "trainyard-run" / f"{pipeline}.json")

    @property
    def lock_path(self) -> Path:
        return self.path.with_suffix(".lock")

    def acquire(self) -> bool:
        """Take the lock without waiting; False while another live process holds it."""
        import fcntl
        import os

        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.lock_path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            return False
        self._fd = fd
        return True

    def holder(self) -> dict[str, Any] | None:
        import json

        try:
            return json.loads(self.path.read_text())
        except (OSError, ValueError):
            return None

    def take(self, run_id: str) -> None:
        """Record this process and run as the holder (the lock must be held)."""
        import json
        import os

        from trainyard_contract.atomic import write_bytes

        if self._fd is None and not self.acquire():
            raise RuntimeError(f"{self.lock_path} is held by another process")
        write_bytes(self.path, json.dumps({"pid": os.getpid(), "run_id": run_id}).encode())

    def release(self) -> None:
        import os

        self.path.unlink(missing_ok=True)
        if self._fd is not None:
            os.close(self._fd)  # drops the flock
            self._fd = None


def stale_run_problem(pipeline: str) -> tuple[Problem | None, list[str], RunLock | None]:
    """(a Problem when another `trainyard run` of the pipeline is alive, notes about a run a dead one left, the
    pipeline's run lock, now held by this process, when there is no Problem).

    A `trainyard run` that was killed (SIGKILL, a closed terminal) leaves its run `running` in the metadata
    database; with `max_active_runs: 1` that blocks the pipeline's next runs, and unpausing the DAG would resume
    it. Such a run is marked failed here, and said so."""
    lock = RunLock.for_pipeline(pipeline)
    if not lock.acquire():
        holder = lock.holder() or {}
        return Problem(f"another `trainyard run {pipeline}` is running (pid {holder.get('pid', '?')}, run "
                       f"{holder.get('run_id', '?')}); wait for it, or stop it with Ctrl-C"), [], None
    holder = lock.holder()
    notes = []
    run_id = holder.get("run_id") if holder else None
    if run_id:
        changed = mark_failed(pipeline, run_id)
        notes.append(f"run {run_id} was left running by a `trainyard run` that died (pid {holder.get('pid')}); "
                     f"marked it failed ({changed} unfinished task(s))")
    lock.path.unlink(missing_ok=True)
    return None, notes, lock
