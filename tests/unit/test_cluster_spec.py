"""TF_CONFIG generation (pure) and the training job's replica pods."""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path

import pytest

from trainyard.config.loader import load_pipeline_file
from trainyard.dag.cluster_spec import Replicas, job_name, kubernetes_hosts, local_hosts, tf_config
from trainyard.dag.registry import stage_named
from trainyard.dag.stages import RunContext, train_containers, train_replicas
from trainyard.launch.podspec import build_job_pods

RUN = RunContext(pipeline="digits", run_id="scheduled__2026-12-01T00:00:00+00:00",
                 data_interval_end=dt.datetime(2026, 12, 1, tzinfo=dt.UTC))


def test_kubernetes_hosts_follow_the_headless_service_names() -> None:
    hosts = kubernetes_hosts("job-1", "ml", 2222, Replicas(chief=1, ps=2, worker=3))
    assert hosts == {
        "chief": ["job-1-chief-0.job-1.ml.svc:2222"],
        "ps": ["job-1-ps-0.job-1.ml.svc:2222", "job-1-ps-1.job-1.ml.svc:2222"],
        "worker": [f"job-1-worker-{i}.job-1.ml.svc:2222" for i in range(3)],
    }
    assert json.loads(tf_config(hosts, "worker", 2)) == {"cluster": hosts, "task": {"type": "worker", "index": 2}}
    with pytest.raises(ValueError, match="worker:3 is not in the cluster"):
        tf_config(hosts, "worker", 3)


def test_roles_without_replicas_are_left_out() -> None:
    assert kubernetes_hosts("j", "ns", 1, Replicas(chief=1)) == {"chief": ["j-chief-0.j.ns.svc:1"]}
    assert local_hosts({"chief": [5000], "ps": [], "worker": [5001]}) == {
        "chief": ["127.0.0.1:5000"], "worker": ["127.0.0.1:5001"]}


def test_job_names_are_dns_labels_unique_per_run() -> None:
    a = job_name("digits", "manual__2026-12-02T10-00-00-ab12")
    b = job_name("digits", "manual__2026-12-02T10-00-00-cd34")
    assert a != b
    for name in (a, b, job_name("A_Very_Long_Pipeline_Name" * 3, "run")):
        assert len(name) <= 40 and name == name.lower() and name[0].isalnum() and name[-1].isalnum()
        assert len(f"{name}-worker-63") <= 63


def test_replica_pods_carry_tf_config_gpu_and_placement(pipelines_dir: Path) -> None:
    config = load_pipeline_file(pipelines_dir / "digits.yaml")
    replicas = train_replicas(config)
    assert replicas.tasks() == [("chief", 0), ("ps", 0), ("worker", 0), ("worker", 1)]
    job = job_name(config.name, "r")
    cluster = kubernetes_hosts(job, "trainyard", 2222, replicas)
    pods = build_job_pods(config, RUN, train_containers(config, RUN, stage_named("train"), cluster), job)
    by_name = {p.metadata.name: p for p in pods}
    assert set(by_name) == {f"{job}-chief-0", f"{job}-ps-0", f"{job}-worker-0", f"{job}-worker-1"}
    worker = by_name[f"{job}-worker-1"]
    assert (worker.spec.hostname, worker.spec.subdomain) == (f"{job}-worker-1", job)
    env = {e.name: e.value for e in worker.spec.containers[0].env}
    assert json.loads(env["TF_CONFIG"])["task"] == {"type": "worker", "index": 1}
    assert worker.spec.containers[0].resources.limits["nvidia.com/gpu"] == "1"
    # priority low -> the "older" tier from _defaults.yaml, on the GPU pool
    assert worker.spec.node_selector == {"trainyard.io/gpu-pool": "true", "nvidia.com/gpu.product": "Tesla-T4"}
    assert worker.metadata.labels["trainyard/role"] == "worker" and worker.metadata.labels["trainyard/index"] == "1"
    assert worker.spec.priority_class_name == "trainyard-low"
    assert [(t.key, t.operator, t.effect) for t in worker.spec.tolerations] == [
        ("nvidia.com/gpu", "Exists", "NoSchedule")]
    ps = by_name[f"{job}-ps-0"]
    assert ps.spec.node_selector == {"trainyard.io/cpu-pool": "true"}
    assert ps.spec.priority_class_name == "trainyard-low" and ps.spec.tolerations is None
    assert "nvidia.com/gpu" not in ps.spec.containers[0].resources.requests
    assert ps.spec.containers[0].command == ["python", "-m", "trainyard_trainer"]
