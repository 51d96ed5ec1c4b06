"""Config -> Airflow DAG. Runs at parse time, so it does no I/O beyond reading the config, and imports nothing heavy.

A DAG shim in `dags/` calls `dag_from_config(name)`; a bad config raises ConfigError there, so Airflow shows an
import error naming the file, line and field for that one DAG while every other pipeline still loads.
"""

from __future__ import annotations

import datetime as dt
from pathlib import Path

from airflow.providers.standard.operators.empty import EmptyOperator
from airflow.sdk import DAG, Asset

from trainyard.config_loader import display_path, find_pipeline_file, load_pipeline_file
from trainyard.operators import DecideOperator, StageOperator, TrainJobOperator, TrainTeardownOperator
from trainyard.params import build_params
from trainyard.schema import AssetSchedule, PipelineConfig
from trainyard.settings import pipelines_dir

STAGES = (
    ("validate_data", "validate", "Great Expectations suite from the config on the run's input partitions."),
    ("prepare_data", "prepare", "Deterministic split into TFRecord shards with schema, stats and manifest."),
    ("train", "train", "Distributed TensorFlow job (chief + parameter servers + workers); exports the SavedModel."),
    ("evaluate", "evaluate", "Metrics on the eval split beside the served model's; report with plots."),
    ("decide", "decide", "Thresholds met and better than the champion (or forced): deploy, else skip; reasons logged."),
    ("deploy", "deploy", "Publish version N+1, wait until AVAILABLE, smoke-test Predict, roll back on failure."),
)

TEARDOWN_DOC = "Deletes any replica pod or Service of this run's training job left behind (runs whatever train did)."


def describe_schedule(config: PipelineConfig) -> str:
    if isinstance(config.schedule, AssetSchedule):
        return f"on new data (Asset `{config.schedule.uri}`)"
    return f"`{config.schedule}`" if config.schedule else "manual"


def render_doc(config: PipelineConfig, source: str) -> str:
    data, training = config.data, config.training
    window = f"the last {data.window.days} day(s)" if data.window else "every partition up to the run's end"
    rows = "\n".join(f"| `{task_id}` | {what} |" for task_id, _, what in STAGES)
    rows += f"\n| `teardown_train` | {TEARDOWN_DOC} |"
    return f"""### {config.name}

{config.description or "A Trainyard pipeline."}

*Config:* `{source}` · *owner:* {config.owner} · *backend:* {config.backend or "local (default)"} ·
*schedule:* {describe_schedule(config)} · *pools:* `{training.pool}` (train), `{config.deploy.pool}` (deploy)

| task | what it does |
|---|---|
{rows}

* **Data:** `{data.source}` ({data.format}, partitions `{data.partition_key}=YYYY-MM-DD`), {window};
  {len(data.column_names())} feature column(s), label `{data.label.name}` ({len(data.label.classes)} classes);
  eval split {data.split.eval_fraction:.0%}, {data.shards.train} train / {data.shards.eval} eval shard(s).
* **Training:** `{training.strategy}`, {training.workers.replicas} worker(s), {training.ps.replicas} PS,
  model `{training.model.module}`, {training.steps} steps of batch {training.batch_size}.
* **Run folder:** `runs/{config.name}/<run_key>/` on the shared volume.

Trigger with parameters to override steps, learning rate, batch size, replicas or the data window for one run.
"""


def data_asset(schedule: AssetSchedule) -> Asset:
    """The Airflow Asset of a dataset folder on the shared volume; its events start asset-scheduled pipelines."""
    return Asset(uri=schedule.uri, name=schedule.uri, group="trainyard")


def dag_schedule(config: PipelineConfig) -> str | list[Asset] | None:
    if isinstance(config.schedule, AssetSchedule):
        return [data_asset(config.schedule)]
    return config.schedule


def build_dag(config: PipelineConfig, source: str = "") -> DAG:
    """One DAG for one validated config."""
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
        doc_md=render_doc(config, source),
        default_args={
            "owner": config.owner,
            "retries": config.retries,
            "retry_delay": dt.timedelta(seconds=15),
        },
    ) as dag:
        previous = None
        for task_id, stage, what in STAGES:
            if stage == "train":
                task = TrainJobOperator(task_id=task_id, config=config, doc_md=what, pool=config.training.pool,
                                        execution_timeout=dt.timedelta(hours=12))
                task >> TrainTeardownOperator(task_id="teardown_train", config=config, doc_md=TEARDOWN_DOC)
            elif stage == "decide":
                task = DecideOperator(task_id=task_id, config=config, doc_md=what)
                skip = EmptyOperator(task_id="skip_deploy", doc_md="The model did not earn a deploy (see decide).")
                task >> skip
            else:
                pool = {"pool": config.deploy.pool} if stage == "deploy" else {}
                task = StageOperator(task_id=task_id, config=config, stage=stage, doc_md=what, **pool)
            if previous is not None:
                previous >> task
            previous = task
    return dag


def dag_from_file(path: Path) -> DAG:
    return build_dag(load_pipeline_file(path), display_path(path))


def dag_from_config(name: str, folder: Path | None = None) -> DAG:
    """The DAG of pipeline `name` from the pipelines folder (`TRAINYARD_PIPELINES_DIR` or `pipelines_config/`)."""
    return dag_from_file(find_pipeline_file(folder or pipelines_dir(), name))
