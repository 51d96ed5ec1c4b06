"""The table `trainyard run` ends with: every task of the run, its state, wall time and retries, and for training
the rate it trained at (from `model/training.json`), so a user sees where a run's time went without reading the
log's timestamps. Mapped tasks get one row per index (`prepare_data [1]`)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trainyard_contract import layout
from trainyard_contract.artifacts import TrainingRecord

NOT_RUN = "not run"
DECIDED = frozenset({"skipped", "upstream_failed", "removed"})  # states a task is put in without running
TRAIN_TASK = "train"


@dataclass(frozen=True)
class TaskRow:
    task: str
    state: str
    seconds: float | None  # None: it never started (skipped, upstream failed, not reached)
    retries: int | None


def task_rows(dag_run: Any) -> list[TaskRow]:
    """One row per task instance of `dag_run`: those that started in start order, then the others by name."""
    from airflow.models.taskinstance import TaskInstance
    from airflow.utils.session import create_session

    with create_session() as session:
        instances = session.query(TaskInstance).filter(TaskInstance.dag_id == dag_run.dag_id,
                                                       TaskInstance.run_id == dag_run.run_id).all()
        started = sorted((ti for ti in instances if ti.start_date is not None), key=lambda t: (t.start_date,
                                                                                                t.map_index))
        others = sorted((ti for ti in instances if ti.start_date is None), key=lambda t: (t.task_id, t.map_index))
        rows = []
        for ti in [*started, *others]:
            name = f"{ti.task_id} [{ti.map_index}]" if ti.map_index >= 0 else ti.task_id
            state = str(getattr(ti.state, "value", ti.state)) if ti.state is not None else NOT_RUN
            ran = ti.start_date is not None and state not in DECIDED  # Airflow stamps those with times too
            seconds = (ti.end_date - ti.start_date).total_seconds() if ran and ti.end_date else None
            retries = max(int(ti.try_number or 0) - 1, 0) if ran else None
            rows.append(TaskRow(name, state, seconds, retries))
        return rows


def training_rates(run_dir: Path) -> str | None:
    """`300 steps in 4.9s: 61.2 steps/s, 3917 examples/s` from the run's training record, if it trained."""
    path = Path(run_dir) / layout.TRAINING_RECORD.relpath
    try:
        record = TrainingRecord.model_validate_json(path.read_bytes())
    except (OSError, ValueError):  # not trained (yet), or a record of another version: no rates, still a table
        return None
    steps = record.steps - record.resumed_from_step
    rate = steps / record.seconds if record.seconds > 0 else 0.0
    resumed = f" (resumed at step {record.resumed_from_step})" if record.resumed_from_step else ""
    return (f"{steps} steps in {record.seconds:.1f}s{resumed}: {rate:.1f} steps/s, "
            f"{record.examples_per_second:.0f} examples/s")


def summary_table(rows: list[TaskRow], training: str | None, run_seconds: float) -> list[str]:
    """The table's lines: task, state, wall time, retries, the training rates on the train row, and the run's
    own wall time (tasks that ran side by side overlap, so it is not their sum)."""
    if not rows:
        return [f"no task ran ({run_seconds:.1f}s)"]
    width = max(len("task"), *(len(row.task) for row in rows))
    lines = [f"{'task':<{width}}  {'state':<15}  {'wall':>8}  retries"]
    for row in rows:
        wall = f"{row.seconds:.1f}s" if row.seconds is not None else "-"
        retries = str(row.retries) if row.retries is not None else "-"
        line = f"{row.task:<{width}}  {row.state:<15}  {wall:>8}  {retries:>7}"
        if row.task == TRAIN_TASK and row.state == "success" and training:
            line += f"  {training}"
        lines.append(line.rstrip())
    lines.append(f"{'whole run':<{width}}  {'':<15}  {run_seconds:>7.1f}s")
    return lines
