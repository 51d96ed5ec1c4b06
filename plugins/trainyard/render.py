"""Every Kubernetes manifest one run of a pipeline would create, as plain dicts, for review and GitOps.

The same pure builders the backends use: stage pods, the training job's replica pods and headless Service (with
Kubernetes DNS hosts in TF_CONFIG), and the model's TF Serving Deployment and Service.
"""

from __future__ import annotations

import datetime as dt
from pathlib import Path
from typing import Any

from kubernetes.client import ApiClient

from trainyard.cluster_spec import job_name, kubernetes_hosts
from trainyard.layout import run_key
from trainyard.podspec import (
    build_headless_service,
    build_job_pods,
    build_serving_deployment,
    build_serving_service,
    build_stage_pod,
    serving_address,
)
from trainyard.schema import PipelineConfig
from trainyard.stages import RunContext, stage_container, train_containers, train_replicas

SINGLE_POD_STAGES = ("validate", "prepare", "check_model", "evaluate", "decide", "deploy")


def render_run(config: PipelineConfig, run_id: str, window_end: dt.datetime | None = None) -> list[dict[str, Any]]:
    run = RunContext(pipeline=config.name, run_id=run_id, data_interval_end=window_end)
    serving = serving_address(config)
    objects: list[Any] = []
    for stage in SINGLE_POD_STAGES:
        extra = ("--endpoint", serving) if stage == "deploy" else ()
        objects.append(build_stage_pod(config, run, stage_container(config, run, stage, extra)))
    job = job_name(config.name, run_key(run_id))
    cluster = kubernetes_hosts(job, config.kubernetes.namespace, config.training.port, train_replicas(config))
    objects.append(build_headless_service(config, run, job))
    objects.extend(build_job_pods(config, run, train_containers(config, run, cluster), job))
    objects.append(build_serving_deployment(config))
    objects.append(build_serving_service(config))
    client = ApiClient()
    return [client.sanitize_for_serialization(obj) for obj in objects]


def write_manifests(manifests: list[dict[str, Any]], out: Path) -> list[Path]:
    """One YAML file per object, `<kind>-<name>.yaml`, written by temp-then-rename."""
    import yaml

    from trainyard.atomic import write_bytes

    paths = []
    for manifest in manifests:
        path = out / f"{manifest['kind'].lower()}-{manifest['metadata']['name']}.yaml"
        write_bytes(path, yaml.safe_dump(manifest, sort_keys=False).encode())
        paths.append(path)
    return paths
