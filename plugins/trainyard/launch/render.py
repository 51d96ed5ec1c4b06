"""Every Kubernetes manifest one run of a pipeline would create, as plain dicts, for review and GitOps.

The same pure builders the backends use: stage pods, the training job's replica pods and headless Service (with
Kubernetes DNS hosts in TF_CONFIG), the model's TF Serving Deployment and Service, and the stream scorer's and
lander's Deployments.
"""

from __future__ import annotations

import datetime as dt
from pathlib import Path
from typing import Any

from kubernetes.client import ApiClient

from trainyard.dag.registry import STAGES, Stage, mapped_over, stages_for
from trainyard.dag.stages import RunContext
from trainyard.launch.podspec import (
    build_serving_deployment,
    build_serving_service,
    serving_address,
)
from trainyard.launch.stream_spec import build_stream_deployments
from trainyard_contract.schema import PipelineConfig


def render_run(config: PipelineConfig, run_id: str, window_end: dt.datetime | None = None,
               stages: tuple[Stage, ...] = STAGES) -> list[dict[str, Any]]:
    """Each of the config's stages' pods in order (a mapped stage's one per file group; a job's check pod,
    headless Service and replicas), then the serving Deployment and Service when a stage talks to serving.
    Param-dependent flags (force_deploy) are left out."""
    run = RunContext(pipeline=config.name, run_id=run_id, data_interval_end=window_end)
    objects: list[Any] = []
    present = stages_for(config, stages)
    for stage in present:
        extra = ("--endpoint", serving_address(config)) if stage.needs_serving else ()
        # a mapped stage: one pod per file group, as many as prep.parallelism allows (a run with fewer files has
        # fewer groups, and so fewer pods)
        groups: list[int | None] = list(range(config.prep.parallelism)) if mapped_over(stage, present) else [None]
        objects.extend(stage.kind.manifests(config, run, stage, groups, extra))
    if any(stage.needs_serving for stage in stages):
        objects += [build_serving_deployment(config), build_serving_service(config), *build_stream_deployments(config)]
    client = ApiClient()
    return [client.sanitize_for_serialization(obj) for obj in objects]


def write_manifests(manifests: list[dict[str, Any]], out: Path) -> list[Path]:
    """One YAML file per object, `<kind>-<name>.yaml`, written by temp-then-rename."""
    import yaml

    from trainyard_contract.atomic import write_bytes

    paths = []
    for manifest in manifests:
        path = out / f"{manifest['kind'].lower()}-{manifest['metadata']['name']}.yaml"
        write_bytes(path, yaml.safe_dump(manifest, sort_keys=False).encode())
        paths.append(path)
    return paths
