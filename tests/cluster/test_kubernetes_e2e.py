"""The example pipeline end to end on a real cluster, through the Kubernetes backend.

Runs only when asked: `TRAINYARD_KUBE_TEST=1 KUBECONFIG=... make cluster-test`, against a cluster prepared as the
README's "Kubernetes" section says (k8s/ applied, a RWX storage class, the images built and loaded, e.g.
`kind load docker-image trainyard/prep:0.1.0 ...`). Skipped everywhere else, CI included.
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = [
    pytest.mark.cluster,
    pytest.mark.skipif(not (os.environ.get("TRAINYARD_KUBE_TEST") and os.environ.get("KUBECONFIG")),
                       reason="needs a cluster: set TRAINYARD_KUBE_TEST=1 and KUBECONFIG"),
]
NS = "trainyard"
SEED = ("from pathlib import Path; from trainyard_prep.example_data import write_digits; "
        "write_digits(Path('/data/datasets/digits'), days=5)")


@pytest.fixture
def cluster_env(monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    connection = {"conn_type": "kubernetes", "extra": {"kube_config_path": os.environ["KUBECONFIG"]}}
    monkeypatch.setenv("AIRFLOW_CONN_KUBERNETES_DEFAULT", json.dumps(connection))
    monkeypatch.setenv("TRAINYARD_BACKEND", "kubernetes")
    return dict(os.environ)


@pytest.fixture
def core(cluster_env: dict[str, str]):  # noqa: ANN201
    from kubernetes import client, config

    config.load_kube_config(config_file=os.environ["KUBECONFIG"])
    return client.CoreV1Api(), client.AppsV1Api()


def run_to_completion(core_api, pod) -> str:  # noqa: ANN001
    core_api.create_namespaced_pod(namespace=NS, body=pod)
    name = pod.metadata.name
    try:
        for _ in range(300):
            phase = core_api.read_namespaced_pod(name=name, namespace=NS).status.phase
            if phase in ("Succeeded", "Failed"):
                assert phase == "Succeeded", core_api.read_namespaced_pod_log(name=name, namespace=NS)
                return phase
            time.sleep(2)
        raise AssertionError(f"seed pod {name} did not finish in 10 minutes")
    finally:
        core_api.delete_namespaced_pod(name=name, namespace=NS)


def test_example_pipeline_on_kubernetes(core, cluster_env: dict[str, str]) -> None:
    from trainyard.config_loader import find_pipeline_file, load_pipeline_file
    from trainyard.podspec import build_pod
    from trainyard.registry import stage_named
    from trainyard.stages import RunContext, stage_container

    core_api, apps_api = core
    config = load_pipeline_file(find_pipeline_file(Path("pipelines_config"), "digits"))
    run = RunContext(pipeline="digits", run_id="cluster-seed")
    seed = stage_container(config, run, stage_named("validate"))
    seed = dataclasses.replace(seed, command=["python"], args=["-c", SEED], stage="seed")
    run_to_completion(core_api, build_pod(config, run, seed, name="trainyard-e2e-seed"))

    done = subprocess.run([sys.executable, "-m", "trainyard.cli", "run", "digits", "--conf",
                           '{"window_days": 4, "steps": 120, "workers": 1}'],
                          capture_output=True, text=True, timeout=3600, env=cluster_env)
    assert done.returncode == 0, done.stdout[-5000:] + done.stderr[-5000:]
    assert "finished: success" in done.stdout and "[chief]" in done.stdout + done.stderr
    leftovers = core_api.list_namespaced_pod(namespace=NS, label_selector="trainyard/stage=train").items
    assert leftovers == []  # every replica pod was deleted after its log was read
    deployment = apps_api.read_namespaced_deployment(name="digits-serving", namespace=NS)
    assert deployment.status.available_replicas == deployment.spec.replicas


def test_an_unschedulable_training_job_times_out_and_leaves_nothing(core, cluster_env: dict[str, str]) -> None:
    """No node has what the replicas ask for (16 GPUs per worker, a node pool nobody labelled): the job fails after
    the startup timeout with the scheduler's reason, and no pod or Service of the job is left."""
    import logging

    from trainyard.backends.base import StageFailed
    from trainyard.backends.kubernetes import KubernetesLauncher
    from trainyard.config_loader import find_pipeline_file, load_pipeline_file
    from trainyard.podspec import build_headless_service, build_job_pods, job_selector
    from trainyard.registry import stage_named
    from trainyard.stages import RunContext, train_containers, train_replicas
    from trainyard_contract.cluster_spec import job_name, kubernetes_hosts
    from trainyard_contract.layout import run_key
    from trainyard_contract.schema import PipelineConfig

    core_api, _ = core
    data = load_pipeline_file(find_pipeline_file(Path("pipelines_config"), "digits")).model_dump()
    data["kubernetes"]["startup_timeout_seconds"] = 30
    data["kubernetes"]["node_pools"] = {"cpu": {"trainyard.io/pool": "nobody-has-this"},
                                        "gpu": {"trainyard.io/pool": "nobody-has-this"}}
    data["training"]["workers"]["resources"]["gpu"] = 16
    config = PipelineConfig.model_validate(data)
    run = RunContext(pipeline=config.name, run_id="cluster-unschedulable")
    stage = stage_named("train")
    job = job_name(config.name, run_key(run.run_id))
    cluster = kubernetes_hosts(job, NS, config.training.port, train_replicas(config))
    pods = build_job_pods(config, run, train_containers(config, run, stage, cluster), job)

    with pytest.raises(StageFailed, match=r"still Pending after 30s: .*(Unschedulable|FailedScheduling)") as info:
        KubernetesLauncher(config).run_job(pods, logging.getLogger("cluster-test"), 1, "/data/x",
                                           service=build_headless_service(config, run, stage, job))
    assert "api_version" not in str(info.value)  # the reason, never the pod object
    selector = ",".join(f"{k}={v}" for k, v in job_selector(config, run, stage).items())
    for _ in range(60):  # deletion is eventual: pods terminate, then go
        if not core_api.list_namespaced_pod(namespace=NS, label_selector=selector).items:
            break
        time.sleep(2)
    assert core_api.list_namespaced_pod(namespace=NS, label_selector=selector).items == []
    assert core_api.list_namespaced_service(namespace=NS, label_selector=selector).items == []
