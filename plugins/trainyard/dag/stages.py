"""What each stage runs: image, entrypoint and arguments, as pure functions of its declaration, the config and
the run.

The same `ContainerSpec` becomes a Kubernetes pod (podspec.py) or a local process (launch/local.py), so no
stage logic is forked per backend. The declarations live in registry.py; the pod environment's names in the
contract's runtime module, which the stage entrypoints read them with.
"""

from __future__ import annotations

import datetime as dt
import json
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import PurePosixPath
from typing import Any

from trainyard.dag.cluster_spec import Replicas, job_name, tf_config
from trainyard.dag.registry import Stage
from trainyard_contract.layout import RunLayout, run_key, volume_root
from trainyard_contract.runtime import CONFIG_ENV, RUN_ENV, XCOM_RETURN
from trainyard_contract.schema import PipelineConfig, Resources


@dataclass(frozen=True)
class RunContext:
    """The Airflow run a stage belongs to, reduced to what stages need; its identity (the folder-safe key, the
    training job's name, the run folder) is computed here once, never re-derived from the run id elsewhere."""

    pipeline: str
    run_id: str
    data_interval_start: dt.datetime | None = None
    data_interval_end: dt.datetime | None = None
    run_type: str | None = None
    params: dict[str, Any] = field(default_factory=dict)

    @cached_property
    def key(self) -> str:
        """The run's folder name and `trainyard/run` label (`layout.run_key`)."""
        return run_key(self.run_id)

    @cached_property
    def job_name(self) -> str:
        """The training job's name: its headless Service and the replicas' hostnames."""
        return job_name(self.pipeline, self.key)

    def layout(self, root: str | PurePosixPath) -> RunLayout:
        """The run's paths on a volume mounted at `root`."""
        return RunLayout(volume_root(root), self.pipeline, self.key)

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
    index: int | None = None  # a mapped task's file group, or a replica's index in its role (`trainyard/index`)


def stage_container(config: PipelineConfig, run: RunContext, stage: Stage, extra_args: tuple[str, ...] = (),
                    *, check: bool = False, group: int | None = None) -> ContainerSpec:
    """The container that runs `stage` of `run` with the (already overridden) `config`; `check` builds a job
    stage's one-pod check instead (its kind's `check_step`); `group` is the file group of a
    mapped task (`--group`, and the `trainyard/index` label)."""
    step = stage.kind.check_step
    if check and step is None:
        raise ValueError(f"stage {stage.name!r} declares no check command")
    mount = config.kubernetes.volume.mount_path
    layout = run.layout(mount)
    args = [
        step.command if check and step else stage.command,
        "--volume", mount,
        "--run-dir", str(layout.run_dir),
        "--run-id", run.run_id,
        "--xcom", XCOM_RETURN,
    ]
    if run.data_interval_end is not None:
        args += ["--window-end", run.data_interval_end.isoformat()]
    args += list(extra_args)
    if group is not None:
        args += ["--group", str(group)]
    runtime = stage.runtime(config)
    env = {**dict(stage.image.env), "TF_CPP_MIN_LOG_LEVEL": "2", "GX_ANALYTICS_ENABLED": "False",
           **runtime.env,  # the config's, over the image's defaults; the names Trainyard sets it refuses
           CONFIG_ENV: config.model_dump_json(), "PYTHONUNBUFFERED": "1"}
    trigger = run.trigger()
    if trigger is not None:
        env[RUN_ENV] = json.dumps(trigger, sort_keys=True, default=str)
    return ContainerSpec(
        stage=step.name if check and step else stage.name,
        role="main",
        image=config.kubernetes.image(runtime.image),
        command=["python", "-m", stage.image.module],
        args=args,
        env=env,
        resources=runtime.resources,
        index=group,
    )


def train_replicas(config: PipelineConfig) -> Replicas:
    training = config.training
    return Replicas(chief=1, ps=training.ps.replicas, worker=training.workers.replicas)


def role_resources(config: PipelineConfig, role: str) -> Resources:
    """Workers get the GPU resources from the config; the chief and parameter servers are CPU."""
    training = config.training
    return {"chief": training.runtime.resources, "ps": training.ps.resources,
            "worker": training.workers.resources}[role]


# gRPC channel settings for every replica (TensorFlow reads TF_GRPC_DEFAULT_OPTIONS for its own channels). A
# replaced replica keeps its DNS name but gets a new IP: by default gRPC re-resolves a name at most every 30 s
# and backs off reconnects up to 120 s, so on the real cluster the chief stalled ~30 s on a dead worker's old IP
# after its replacement was already up. Re-resolve after 1 s, retry connects within 1-2 s.
GRPC_OPTIONS = ",".join([
    "grpc.dns_min_time_between_resolutions_ms=1000",
    "grpc.initial_reconnect_backoff_ms=500",
    "grpc.min_reconnect_backoff_ms=500",
    "grpc.max_reconnect_backoff_ms=2000",
])


def train_containers(config: PipelineConfig, run: RunContext, stage: Stage,
                     cluster: dict[str, list[str]]) -> list[ContainerSpec]:
    """One container per replica of the training job, each with its TF_CONFIG, from the same builder."""
    base = stage_container(config, run, stage)
    specs = []
    for role, index in train_replicas(config).tasks():
        env = {**base.env, "TF_CONFIG": tf_config(cluster, role, index), "TF_GRPC_DEFAULT_OPTIONS": GRPC_OPTIONS}
        specs.append(ContainerSpec(stage=base.stage, role=role, image=base.image, command=base.command,
                                   args=base.args, env=env, resources=role_resources(config, role),
                                   index=index))
    return specs
