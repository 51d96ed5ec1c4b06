"""The stream scorer and lander as the deploy step creates them, on the real cluster, against a Redis pod.

Runs after test_pipelines (the churn model must be served: `churn-serving`). The Deployments are created through
`apply_serving_objects`, what the deploy step calls, as the Airflow ServiceAccount (so the Role is what is tested).
Events go in and results come out through the Redis pod's IP on the cluster's pod network. One of two scorer pods is
deleted without grace mid-stream (a lost node's pod): every event still ends as a result or a dead letter.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
from kubernetes import client as k8s

from tests.cluster.conftest import NS, kubectl, selector, wait_for
from trainyard.config.loader import find_pipeline_file, load_pipeline_file
from trainyard.launch.kubernetes_serving import apply_serving_objects
from trainyard.launch.podspec import restricted_pod_security_context, restricted_security_context
from trainyard.launch.stream_spec import build_stream_deployments, stream_labels
from trainyard_contract import layout
from trainyard_contract.schema import PipelineConfig

REPO = Path(__file__).resolve().parents[2]
REDIS = "trainyard-test-redis"
LOG = logging.getLogger("test.cluster.streams")


@pytest.fixture(scope="module")
def redis_pod(core) -> Iterator[str]:  # noqa: ANN001
    """A Redis pod and its ClusterIP Service; yields the pod's IP (the host reaches the pod network)."""
    labels = {"app.kubernetes.io/name": REDIS}
    pod = k8s.V1Pod(
        metadata=k8s.V1ObjectMeta(name=REDIS, namespace=NS, labels=labels),
        spec=k8s.V1PodSpec(
            automount_service_account_token=False, security_context=restricted_pod_security_context(),
            containers=[k8s.V1Container(
                name="redis", image="trainyard/redis-test:7.0", image_pull_policy="IfNotPresent",
                ports=[k8s.V1ContainerPort(container_port=6379)], security_context=restricted_security_context(),
                resources=k8s.V1ResourceRequirements(requests={"cpu": "100m", "memory": "128Mi"},
                                                     limits={"memory": "512Mi"}),
                readiness_probe=k8s.V1Probe(tcp_socket=k8s.V1TCPSocketAction(port=6379), period_seconds=1),
                volume_mounts=[k8s.V1VolumeMount(name="scratch", mount_path="/tmp")])],
            volumes=[k8s.V1Volume(name="scratch", empty_dir=k8s.V1EmptyDirVolumeSource())]))
    service = k8s.V1Service(metadata=k8s.V1ObjectMeta(name=REDIS, namespace=NS),
                            spec=k8s.V1ServiceSpec(selector=labels, ports=[k8s.V1ServicePort(port=6379)]))
    kubectl("-n", NS, "delete", "pod,service", REDIS, "--ignore-not-found", "--grace-period=0", "--wait=true")
    core.create_namespaced_pod(namespace=NS, body=pod)
    core.create_namespaced_service(namespace=NS, body=service)

    def ready() -> str | None:
        status = core.read_namespaced_pod(REDIS, NS).status
        conditions = {c.type: c.status for c in status.conditions or []}
        return status.pod_ip if conditions.get("Ready") == "True" else None

    try:
        yield wait_for("the Redis pod ready", ready, 180)
    finally:
        kubectl("-n", NS, "delete", "pod,service", REDIS, "--ignore-not-found", "--grace-period=0", check=False)


@pytest.fixture(scope="module")
def stream_config(pipelines_with_stream: Path) -> PipelineConfig:
    return load_pipeline_file(find_pipeline_file(pipelines_with_stream, "churn"))


@pytest.fixture(scope="module")
def pipelines_with_stream(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("pipelines")
    for path in (REPO / "pipelines_config").glob("*.yaml"):
        (folder / path.name).write_text(path.read_text())
    churn = folder / "churn.yaml"
    churn.write_text(churn.read_text() + f"""
stream:
  broker: redis://{REDIS}.{NS}.svc:6379/0
  source: churn:events
  sink: churn:scores
  dead_letter: churn:dead
  replicas: 2
  claim_idle_ms: 2000
  resources: {{cpu: 100m, memory: 1Gi}}
  land: {{source: churn:labelled, dead_letter: churn:labelled-dead, max_rows: 200, max_seconds: 2}}
""")
    return folder


def churn_rows(seeded: Path, count: int) -> list[dict]:
    import pandas as pd

    files = sorted((seeded / layout.DATASETS / "churn").glob("date=*/*.parquet"))
    frame = pd.read_parquet(files[0]).head(count)
    rows = json.loads(frame.to_json(orient="records"))
    return [{**row, "key": f"c{index}"} for index, row in enumerate(rows)]


def test_the_scorer_and_lander_deployments_on_the_cluster(core, apps, airflow_kubeconfig: Path, seeded: Path,  # noqa: ANN001
                                                          redis_pod: str, stream_config: PipelineConfig) -> None:
    from kubernetes import config as kube_config

    serving = apps.read_namespaced_deployment("churn-serving", NS)
    assert serving.status.available_replicas, "churn is not served: run test_pipelines first (the cluster suite)"
    as_airflow = kube_config.new_client_from_config(config_file=str(airflow_kubeconfig))
    apply_serving_objects(k8s.CoreV1Api(as_airflow), k8s.AppsV1Api(as_airflow), stream_config, LOG)
    try:
        for deployment in build_stream_deployments(stream_config):
            name = deployment.metadata.name
            wait_for(f"{name} available", lambda n=name, d=deployment: (
                apps.read_namespaced_deployment(n, NS).status.available_replicas or 0) == d.spec.replicas, 300)
        broker = redis.Redis(host=redis_pod, port=6379, decode_responses=True, socket_timeout=30)
        rows = churn_rows(seeded, 2000)
        events = [{k: v for k, v in row.items() if k != "churned"} for row in rows]
        bad = [{"key": "bad-1", "plan": "pro"}, "not json"]
        pipe = broker.pipeline(transaction=False)
        for event in events + bad:
            pipe.xadd("churn:events", {"data": event if isinstance(event, str) else json.dumps(event)})
        pipe.execute()
        wait_for("a quarter of the events scored", lambda: broker.xlen("churn:scores") >= 500, 120, 0.2)
        scorers = core.list_namespaced_pod(NS, label_selector=selector(stream_labels(stream_config, "score"))).items
        victim = scorers[0].metadata.name
        core.delete_namespaced_pod(victim, NS, grace_period_seconds=0)  # a lost pod: no SIGTERM drain
        wait_for("every event answered", lambda: len(answered(broker)) == len(events) + len(bad), 240)
        wait_for("nothing pending", lambda: broker.xpending("churn:events", "trainyard-score")["pending"] == 0, 60)
        results = [json.loads(f["data"]) for _, f in broker.xrange("churn:scores")]
        duplicates = len(results) + broker.xlen("churn:dead") - len(events) - len(bad)
        print(f"\ncluster stream: {len(results)} results, {broker.xlen('churn:dead')} dead letters, {duplicates} "
              f"duplicate(s), one of two scorer pods deleted without grace ({victim})")
        assert {r["key"] for r in results} == {e["key"] for e in events}
        assert all(r["model"] == "churn" and r["classes"] in ("stay", "churn") for r in results)
        assert {f["key"] for _, f in broker.xrange("churn:dead")} == {"bad-1", ""}

        pipe = broker.pipeline(transaction=False)
        for row in rows[:300]:
            pipe.xadd("churn:labelled", {"data": json.dumps(row)})
        pipe.execute()
        wait_for("the labelled events landed", lambda: broker.xpending("churn:labelled", "trainyard-land")[
            "pending"] == 0 and int(broker.xinfo_groups("churn:labelled")[0]["lag"] or 0) == 0, 120)
        landed = kubectl("-n", NS, "exec", "deployment/churn-stream-land", "--", "python", "-c",
                         "import glob, pyarrow.parquet as pq; print(sum(pq.read_metadata(p).num_rows for p in "
                         "glob.glob('/data/datasets/churn/date=*/*.parquet') if '_trainyard_key' in "
                         "pq.read_schema(p).names))").stdout.decode()  # the seeded files have no keys
        assert int(landed.strip()) == 300, landed
    finally:
        for deployment in build_stream_deployments(stream_config):
            apps.delete_namespaced_deployment(deployment.metadata.name, NS)


def answered(broker: redis.Redis) -> set[str]:
    return {f["key"] for stream in ("churn:scores", "churn:dead") for _, f in broker.xrange(stream)}
