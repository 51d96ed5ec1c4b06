"""Config -> Airflow DAG. Runs at parse time, so it does no I/O beyond reading the config, and imports nothing heavy.

A DAG shim in `dags/` calls `dag_from_config(name)`; a bad config raises ConfigError there, so Airflow shows an
import error naming the file, line and field for that one DAG while every other pipeline still loads.
"""

from __future__ import annotations

import datetime as dt
from pathlib import Path
from typing import Any

from airflow.sdk import DAG, Asset, BaseOperator

from trainyard.config.loader import display_path, find_pipeline_file, load_pipeline_file
from trainyard.dag.params import build_params
from trainyard.dag.registry import STAGES, Stage, mapped_over, stages_for
from trainyard.settings import pipelines_dir
from trainyard_contract.schema import AssetSchedule, PipelineConfig


def describe_schedule(config: PipelineConfig) -> str:
    if isinstance(config.schedule, AssetSchedule):
        return f"on new data (Asset `{config.schedule.uri}`)"
    return f"`{config.schedule}`" if config.schedule else "manual"


def artifact_list(artifacts: tuple[object, ...]) -> str:
    return ", ".join(f"`{a}`" for a in artifacts) or "-"


def stage_rows(stages: tuple[Stage, ...]) -> str:
    """The DAG doc's task table, from the stage declarations (with the tasks their kinds add)."""
    rows = []
    for i, stage in enumerate(stages):
        mapped = " One task (and pod) per file group." if mapped_over(stage, stages) else ""
        rows.append(f"| `{stage.task_id}` | {stage.hardware.upper()} | {stage.doc}{mapped} | "
                    f"{artifact_list(stage.reads)} | {artifact_list(stage.writes)} |")
        next_stage = stages[i + 1] if i + 1 < len(stages) else None
        rows += [f"| `{added.task_id}` | - | {added.doc} | - | - |" for added in stage.kind.added(stage, next_stage)]
    return "\n".join(rows)


def render_doc(config: PipelineConfig, source: str, stages: tuple[Stage, ...] = STAGES) -> str:
    data, training = config.data, config.training
    window = f"the last {data.window.days} day(s)" if data.window else "every partition up to the run's end"
    rows = stage_rows(stages_for(config, stages))
    fan_out = (f" Data stages fan out over up to {config.prep.parallelism} CPU pods (groups of whole files)."
               if config.prep.fans_out else "")
    return f"""### {config.name}

{config.description or "A Trainyard pipeline."}

*Config:* `{source}` · *owner:* {config.owner} · *backend:* {config.backend or "local (default)"} ·
*schedule:* {describe_schedule(config)} · *pools:* `{training.pool}` (train), `{config.deploy.pool}` (deploy)

| task | on | what it does | reads | writes |
|---|---|---|---|---|
{rows}

* **Data:** `{data.source}` ({data.format}, partitions `{data.partition_key}=YYYY-MM-DD`), {window};
  {len(data.column_names())} feature column(s), label `{data.label.name}` ({describe_label(data.label)});
  eval split {data.split.eval_fraction:.0%}, {data.shards.train} train / {data.shards.eval} eval shard(s).{fan_out}
* **Training:** `{training.strategy}`, {training.workers.replicas} worker(s), {training.ps.replicas} PS,
  model `{training.model.module}`, {training.steps} steps of batch {training.batch_size}.
* **Run folder:** `runs/{config.name}/<run_key>/` on the shared volume (reads and writes above are relative to it).

Trigger with parameters to override steps, learning rate, batch size, replicas or the data window for one run.
"""


def describe_label(label: Any) -> str:
    if label.task == "regression":
        bounds = "" if label.min is None and label.max is None else f", within [{label.min}, {label.max}]"
        return f"regression{bounds}"
    return f"classification, {label.num_classes} classes"


def data_asset(schedule: AssetSchedule) -> Asset:
    """The Airflow Asset of a dataset folder on the shared volume; its events start asset-scheduled pipelines."""
    return Asset(uri=schedule.uri, name=schedule.uri, group="trainyard")


def dag_schedule(config: PipelineConfig) -> str | list[Asset] | None:
    if isinstance(config.schedule, AssetSchedule):
        return [data_asset(config.schedule)]
    return config.schedule


def stage_task(config: PipelineConfig, stage: Stage, next_stage: Stage | None,
               over: BaseOperator | None = None) -> Any:
    """The operator the stage's kind gives; mapped over the result list of `over` (one task per group) if given."""
    common: dict[str, Any] = {"task_id": stage.task_id, "config": config, "stage": stage, "doc_md": stage.doc,
                              "retries": stage.retries(config)}
    if stage.pool(config):
        common["pool"] = stage.pool(config)
    if stage.timeout(config) is not None:
        common["execution_timeout"] = stage.timeout(config)
    return stage.kind.operator(stage, next_stage, common, over)


def build_dag(config: PipelineConfig, source: str = "", stages: tuple[Stage, ...] = STAGES) -> DAG:
    """One DAG for one validated config: a chain of the declared stages (with the tasks their kinds add)."""
    start = dt.datetime.combine(config.start_date, dt.time(), tzinfo=dt.UTC)
    with DAG(
        dag_id=config.name,
        description=(config.description or f"Trainyard pipeline {config.name}")[:200],
        schedule=dag_schedule(config),
        start_date=start,
        catchup=config.catchup,
        max_active_runs=config.max_active_runs,
        tags=sorted({"trainyard", *config.tags}),
        params=build_params(config),
        doc_md=render_doc(config, source, stages),
        default_args={
            "owner": config.owner,
            "retries": config.retries,
            "retry_delay": dt.timedelta(seconds=15),
        },
    ) as dag:
        previous = None
        present = stages_for(config, stages)
        tasks: dict[str, Any] = {}
        for i, stage in enumerate(present):
            next_stage = present[i + 1] if i + 1 < len(present) else None
            over = mapped_over(stage, present)
            task = stage_task(config, stage, next_stage, tasks[over.task_id] if over else None)
            tasks[stage.task_id] = task
            for added in stage.kind.added(stage, next_stage):  # a job's teardown, a branch's skip
                task >> stage.kind.added_operator(added, config, stage)
            if previous is not None:
                previous >> task
            previous = task
    return dag


def dag_from_file(path: Path) -> DAG:
    return build_dag(load_pipeline_file(path), display_path(path))


def dag_from_config(name: str, folder: Path | None = None) -> DAG:
    """The DAG of pipeline `name` from the pipelines folder (`TRAINYARD_PIPELINES_DIR` or `pipelines_config/`)."""
    return dag_from_file(find_pipeline_file(folder or pipelines_dir(), name))
