"""`trainyard run`: one pipeline run through Airflow (`dag.test()`) in this process, with the checks and the
summary a person needs: an Airflow home that is ready (or made ready), the pipeline's DAG shim in the dags folder,
the whole output kept in a log file, and after a failure the failed task, the stage's own message, whether a retry
would help, the run folder and the log.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

FAILURE_XCOM = "trainyard_failure"  # the stage's own error, pushed by the operator before it fails


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

    lines: list[str] = []
    with create_session() as session:
        failed = session.query(TaskInstance).filter(
            TaskInstance.dag_id == dag_run.dag_id, TaskInstance.run_id == dag_run.run_id,
            TaskInstance.state == "failed").all()
        for ti in sorted(failed, key=lambda t: t.start_date or dt.datetime.max.replace(tzinfo=dt.UTC)):
            record = session.query(XComModel).filter(
                XComModel.dag_id == ti.dag_id, XComModel.run_id == ti.run_id, XComModel.task_id == ti.task_id,
                XComModel.key == FAILURE_XCOM).first()
            value = XComModel.deserialize_value(record) if record is not None else None
            lines.append(f"failed task: {ti.task_id} (attempt {ti.try_number})")
            if isinstance(value, dict):
                lines.append(f"error: {value.get('message', '?')}")
                lines.append("a retry would fail the same way: fix the data or the config, then run again"
                             if not value.get("retryable", True) else
                             "not bad input (infrastructure, a lost replica, a bug): running again may help")
            else:
                lines.append("error: not a stage failure (see the task's traceback in the log)")
    return lines or ["no task failed (the run ended early: see the log)"]
