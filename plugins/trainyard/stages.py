"""What each stage runs: image, entrypoint and arguments, as pure functions of the config and the run.

The same `ContainerSpec` becomes a Kubernetes pod (podspec.py) or a local process (backends/local.py), so no
stage logic is forked per backend.
"""

from __future__ import annotations

import datetime as dt
import json
from dataclasses import dataclass, field
from typing import Any

from trainyard.cluster_spec import Replicas, tf_config
from trainyard.layout import RunLayout
from trainyard.schema import PipelineConfig, Resources

XCOM_DIR = "/airflow/xcom"
XCOM_RETURN = f"{XCOM_DIR}/return.json"
CONFIG_ENV = "TRAINYARD_CONFIG_JSON"
RUN_ENV = "TRAINYARD_RUN_JSON"  # how the run was started (run type, trigger Params): recorded in its lineage

# stage name -> (python module run in the image, sub-command)
STAGE_ENTRYPOINTS: dict[str, tuple[str, str]] = {
    "validate": ("trainyard_prep", "validate"),
    "prepare": ("trainyard_prep", "prepare"),
    "check_model": ("trainyard_trainer", "check"),
    "train": ("trainyard_trainer", "train"),
    "evaluate": ("trainyard_trainer", "evaluate"),
    "decide": ("trainyard_trainer", "decide"),
    "deploy": ("trainyard_serving", "deploy"),
}


@dataclass(frozen=True)
class RunContext:
    """The Airflow run a stage belongs to, reduced to what stages need."""

    pipeline: str
    run_id: str
    data_interval_start: dt.datetime | None = None
    data_interval_end: dt.datetime | None = None
    run_type: str | None = None
    params: dict[str, Any] = field(default_factory=dict)

    def trigger(self) -> dict[str, Any] | None:
        """What started this run and with which Param values; None when nothing is known (a bare context)."""
        if self.run_type is None and not self.params:
            return None
        return {"run_type": self.run_type, "params": self.params}


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
    if stage in ("check_model", "train"):
        return config.training.image, config.training.chief
    if stage in ("evaluate", "decide"):
        return config.evaluation.image, config.evaluation.resources
    if stage == "deploy":
        return config.deploy.client_image, config.deploy.client_resources
    raise ValueError(f"unknown stage {stage!r}; known: {', '.join(STAGE_ENTRYPOINTS)}")


def stage_container(config: PipelineConfig, run: RunContext, stage: str,
                    extra_args: tuple[str, ...] = ()) -> ContainerSpec:
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
    args += list(extra_args)
    env = {CONFIG_ENV: config.model_dump_json(), "PYTHONUNBUFFERED": "1", "TF_CPP_MIN_LOG_LEVEL": "2",
           "GX_ANALYTICS_ENABLED": "False"}
    trigger = run.trigger()
    if trigger is not None:
        env[RUN_ENV] = json.dumps(trigger, sort_keys=True, default=str)
    return ContainerSpec(
        stage=stage,
        role="main",
        image=image,
        command=["python", "-m", module],
        args=args,
        env=env,
        resources=resources,
    )


def train_replicas(config: PipelineConfig) -> Replicas:
    training = config.training
    return Replicas(chief=1, ps=training.ps.replicas, worker=training.workers.replicas)


def role_resources(config: PipelineConfig, role: str) -> Resources:
    """Workers get the GPU resources from the config; the chief and parameter servers are CPU."""
    training = config.training
    return {"chief": training.chief, "ps": training.ps.resources, "worker": training.workers.resources}[role]


def train_containers(config: PipelineConfig, run: RunContext, cluster: dict[str, list[str]]) -> list[ContainerSpec]:
    """One container per replica of the training job, each with its TF_CONFIG, from the same builder."""
    base = stage_container(config, run, "train")
    specs = []
    for role, index in train_replicas(config).tasks():
        env = {**base.env, "TF_CONFIG": tf_config(cluster, role, index)}
        specs.append(ContainerSpec(stage="train", role=role, image=base.image, command=base.command, args=base.args,
                                   env=env, resources=role_resources(config, role),
                                   labels={"trainyard/index": str(index)}))
    return specs
