"""What each stage runs: image, entrypoint and arguments, as pure functions of the config and the run.

The same `ContainerSpec` becomes a Kubernetes pod (podspec.py) or a local process (backends/local.py), so no
stage logic is forked per backend.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass, field

from trainyard.layout import RunLayout
from trainyard.schema import PipelineConfig, Resources

XCOM_DIR = "/airflow/xcom"
XCOM_RETURN = f"{XCOM_DIR}/return.json"
CONFIG_ENV = "TRAINYARD_CONFIG_JSON"

# stage name -> (python module run in the image, sub-command)
STAGE_ENTRYPOINTS: dict[str, tuple[str, str]] = {
    "validate": ("trainyard_prep", "validate"),
    "prepare": ("trainyard_prep", "prepare"),
}


@dataclass(frozen=True)
class RunContext:
    """The Airflow run a stage belongs to, reduced to what stages need."""

    pipeline: str
    run_id: str
    data_interval_start: dt.datetime | None = None
    data_interval_end: dt.datetime | None = None


@dataclass(frozen=True)
class ContainerSpec:
    """One container of one stage: everything a launcher needs, nothing backend-specific."""

    stage: str
    role: str
    image: str
    command: list[str]
    args: list[str]
    env: dict[str, str]
    resources: Resources
    labels: dict[str, str] = field(default_factory=dict)


def stage_image(config: PipelineConfig, stage: str) -> tuple[str, Resources]:
    if stage in ("validate", "prepare"):
        return config.prep.image, config.prep.resources
    raise ValueError(f"unknown stage {stage!r}; known: {', '.join(STAGE_ENTRYPOINTS)}")


def stage_container(config: PipelineConfig, run: RunContext, stage: str) -> ContainerSpec:
    """The container that runs `stage` of `run` with the (already overridden) `config`."""
    if stage not in STAGE_ENTRYPOINTS:
        raise ValueError(f"unknown stage {stage!r}; known: {', '.join(STAGE_ENTRYPOINTS)}")
    module, subcommand = STAGE_ENTRYPOINTS[stage]
    image, resources = stage_image(config, stage)
    mount = config.kubernetes.volume.mount_path
    layout = RunLayout.for_run(mount, config.name, run.run_id)
    args = [
        subcommand,
        "--volume", mount,
        "--run-dir", str(layout.run_dir),
        "--run-id", run.run_id,
        "--xcom", XCOM_RETURN,
    ]
    if run.data_interval_end is not None:
        args += ["--window-end", run.data_interval_end.isoformat()]
    return ContainerSpec(
        stage=stage,
        role="main",
        image=image,
        command=["python", "-m", module],
        args=args,
        env={CONFIG_ENV: config.model_dump_json(), "PYTHONUNBUFFERED": "1", "TF_CPP_MIN_LOG_LEVEL": "2",
             "GX_ANALYTICS_ENABLED": "False"},
        resources=resources,
    )
