"""Scheduling on a real cluster: jobs that cannot run say why and leave nothing; teams and GPU tiers hold.

Every call here is made as a namespace's ServiceAccount (`trainyard-airflow`), the way Airflow makes it:
- a job on a pool nobody has fails after the startup timeout, naming the pool and the scheduler's reason;
- a job over the namespace's quota is refused at once with the API's 403;
- a second team (its own namespace, Role and quota) is refused over its quota while the first team's run goes on,
  and neither ServiceAccount may read or delete the other's pods;
- a low-priority pipeline's GPU worker lands on the node of its tier (the node is labelled Tesla-T4); a
  high-priority one is reported unschedulable with its tier (H100) named.
"""

from __future__ import annotations

import copy
import json
import logging
import time
from pathlib import Path

import pytest
import yaml

from tests.cluster.conftest import (
    AIRFLOW_SA,
    NS,
    PROFILE,
    REPO,
    kubectl,
    leftovers,
    service_account_kubeconfig,
    start_trainyard,
    wait_for,
)

TEAM_B = "trainyard-team-b"
LOG = logging.getLogger("trainyard.cluster-test")


def digits_config(monkeypatch: pytest.MonkeyPatch, **changes: dict):  # noqa: ANN201
    """The digits config under the small profile, with `changes` deep-merged in (section -> values)."""
    from trainyard.config.loader import deep_merge, find_pipeline_file, load_pipeline_file
    from trainyard_contract.schema import PipelineConfig

    monkeypatch.setenv("TRAINYARD_PROFILE", PROFILE)
    config = load_pipeline_file(find_pipeline_file(REPO / "pipelines_config", "digits"))
    return PipelineConfig.model_validate(deep_merge(config.model_dump(), changes))


def job_objects(config, run_id: str, idle: bool = False):  # noqa: ANN001, ANN201
    """The training job of a run of `config` as the train task builds it: pods, headless Service, run labels.
    `idle`: every replica only sleeps (no run folder needed: the placement is what is tested)."""
    from trainyard.dag.cluster_spec import job_name, kubernetes_hosts
    from trainyard.dag.registry import stage_named
    from trainyard.dag.stages import RunContext, train_containers, train_replicas
    from trainyard.launch.podspec import build_headless_service, build_job_pods, job_selector
    from trainyard_contract.layout import run_key

    run = RunContext(pipeline=config.name, run_id=run_id)
    stage = stage_named("train")
    job = job_name(config.name, run_key(run_id))
    cluster = kubernetes_hosts(job, config.kubernetes.namespace, config.training.port, train_replicas(config))
    pods = build_job_pods(config, run, train_containers(config, run, stage, cluster), job)
    for pod in pods if idle else []:
        pod.spec.containers[0].command = ["python"]
        pod.spec.containers[0].args = ["-c", "import time; time.sleep(300)"]
    return pods, build_headless_service(config, run, stage, job), job_selector(config, run, stage)


def as_service_account(monkeypatch: pytest.MonkeyPatch, kubeconfig: Path) -> None:
    """Airflow's connection `kubernetes_default` in this process: the ServiceAccount's kubeconfig."""
    monkeypatch.setenv("AIRFLOW_CONN_KUBERNETES_DEFAULT", json.dumps(
        {"conn_type": "kubernetes", "extra": {"kube_config_path": str(kubeconfig)}}))


def run_job(config, run_id: str, idle: bool = False):  # noqa: ANN001, ANN201
    """Launch the job through the Kubernetes backend; the StageFailed it raises and how long it took."""
    from trainyard.launch.base import StageFailed
    from trainyard.launch.kubernetes import KubernetesLauncher

    pods, service, labels = job_objects(config, run_id, idle)
    started = time.monotonic()
    with pytest.raises(StageFailed) as info:
        KubernetesLauncher(config).run_pods(pods, LOG, 1, service=service)
    return str(info.value), time.monotonic() - started, labels


def gone(core, labels: dict[str, str], namespace: str = NS) -> None:  # noqa: ANN001
    """Nothing of the job is left once deletion (eventual: pods terminate, then go) has finished."""
    wait_for(f"no pods or Services left by {labels}", lambda: not leftovers(core, labels, namespace), 120)


def test_a_job_on_a_pool_nobody_has_fails_with_the_reason_and_leaves_nothing(
        core, monkeypatch: pytest.MonkeyPatch, airflow_kubeconfig: Path) -> None:  # noqa: ANN001
    as_service_account(monkeypatch, airflow_kubeconfig)
    config = digits_config(monkeypatch, kubernetes={"startup_timeout_seconds": 30, "node_pools": {
        "cpu": {"trainyard.io/cpu-pool": "nobody-has-this"}}})
    message, took, labels = run_job(config, "cluster-nopool")
    first = message.splitlines()[0]
    print(f"\nno pool: failed after {took:.0f}s: {first}")
    assert "still Pending after 30s (it needs the CPU pool (nodes labelled trainyard.io/cpu-pool=nobody-has-this))" \
        in first, first
    assert "Unschedulable" in first or "FailedScheduling" in first, first
    assert "node(s) didn't match" in first, first  # the scheduler's own words
    assert "api_version" not in message and took < 30 + 30
    gone(core, labels)


def test_a_job_over_the_quota_is_refused_at_once_and_leaves_nothing(
        core, monkeypatch: pytest.MonkeyPatch, airflow_kubeconfig: Path) -> None:  # noqa: ANN001
    as_service_account(monkeypatch, airflow_kubeconfig)
    config = digits_config(monkeypatch, training={"workers": {"resources": {"gpu": 16}}})
    message, took, labels = run_job(config, "cluster-overquota")
    first = message.splitlines()[0]
    print(f"\nover quota: refused after {took:.1f}s: {first}")
    assert "403 Forbidden" in first and "exceeded quota" in first and "requests.nvidia.com/gpu" in first, first
    assert took < 30
    gone(core, labels)


def team_manifests(namespace: str, gpus: str) -> list[dict]:
    """The project's own k8s/ namespace, RBAC and quota documents for another team's namespace."""
    documents = []
    for name in ("00-namespace.yaml", "30-rbac.yaml", "40-quota.yaml"):
        for document in yaml.safe_load_all((REPO / "k8s" / name).read_text()):
            document = copy.deepcopy(document)
            if document["kind"] == "Namespace":
                document["metadata"]["name"] = namespace
            else:
                document["metadata"]["namespace"] = namespace
            for subject in document.get("subjects", []):
                subject["namespace"] = namespace
            if document["kind"] == "ResourceQuota":
                document["spec"]["hard"]["requests.nvidia.com/gpu"] = gpus
            documents.append(document)
    return documents


@pytest.fixture
def team_b(core) -> str:  # noqa: ANN001
    text = yaml.safe_dump_all(team_manifests(TEAM_B, "0"))
    kubectl("apply", "-f", "-", stdin=text.encode())
    wait_for("team B's ServiceAccount", lambda: kubectl("-n", TEAM_B, "get", "sa", AIRFLOW_SA,
                                                         check=False).returncode == 0, 60)
    yield TEAM_B
    kubectl("delete", "namespace", TEAM_B, "--wait=true", "--timeout=120s", check=False)


def can_i(verb: str, resource: str, namespace: str, account_namespace: str) -> str:
    done = kubectl("auth", "can-i", verb, resource, "-n", namespace,
                   f"--as=system:serviceaccount:{account_namespace}:{AIRFLOW_SA}", check=False)
    return done.stdout.decode().strip()


def test_two_teams_quotas_and_permissions_hold(core, seeded, team_b: str, run_env: dict[str, str],  # noqa: ANN001
                                               monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    team_a_run = start_trainyard("run", "digits", "--conf", '{"steps": 2000, "force_retrain": true}', env=run_env,
                                 log=tmp_path / "a.log")
    try:
        wait_for("team A's training job", lambda: leftovers(core, {"trainyard/pipeline": "digits",
                                                                   "trainyard/stage": "train"}), 600)
        b_config = service_account_kubeconfig(core, team_b, AIRFLOW_SA, tmp_path / "b.conf")
        as_service_account(monkeypatch, b_config)
        config = digits_config(monkeypatch, kubernetes={"namespace": team_b},
                               training={"workers": {"resources": {"gpu": 1}}})
        message, took, labels = run_job(config, "team-b-run")
        first = message.splitlines()[0]
        print(f"\nteam B over its quota: refused after {took:.1f}s: {first}")
        assert "403 Forbidden" in first and "exceeded quota" in first and "limited: requests.nvidia.com/gpu=0" \
            in first, first
        gone(core, labels, team_b)
        assert team_a_run.poll() is None  # the other team's run goes on
        assert team_a_run.wait(timeout=1200) == 0, (tmp_path / "a.log").read_text()[-5000:]
    finally:
        if team_a_run.poll() is None:
            team_a_run.kill()
    for verb in ("get", "list", "delete", "create"):
        assert can_i(verb, "pods", team_b, NS) == "no"  # team A's account in team B's namespace
        assert can_i(verb, "pods", NS, team_b) == "no"  # and the other way round
    assert can_i("delete", "pods", NS, NS) == can_i("create", "pods", team_b, team_b) == "yes"  # each in its own


def test_gpu_tiers_place_each_priority_on_its_own_nodes(core, monkeypatch: pytest.MonkeyPatch,  # noqa: ANN001
                                                        airflow_kubeconfig: Path) -> None:
    """The node carries the low tier's product label (Tesla-T4), not the high tier's (H100)."""
    from trainyard.launch.kubernetes import KubernetesLauncher

    as_service_account(monkeypatch, airflow_kubeconfig)
    low = digits_config(monkeypatch, training={"priority": "low", "workers": {"resources": {"gpu": 1}}})
    pods, _, labels = job_objects(low, "cluster-tier-low", idle=True)
    worker = next(p for p in pods if p.metadata.labels["trainyard/role"] == "worker")
    sa_core = KubernetesLauncher(low).core
    sa_core.create_namespaced_pod(namespace=NS, body=worker)
    try:
        placed = wait_for("the low tier's worker scheduled", lambda: sa_core.read_namespaced_pod(
            worker.metadata.name, NS).spec.node_name, 120)
        node = core.read_node(placed).metadata.labels
        assert node.get("nvidia.com/gpu.product") == "Tesla-T4" and worker.spec.priority_class_name == "trainyard-low"
        assert worker.spec.tolerations and worker.spec.node_selector["nvidia.com/gpu.product"] == "Tesla-T4"
    finally:
        sa_core.delete_namespaced_pod(name=worker.metadata.name, namespace=NS, grace_period_seconds=0)
    gone(core, labels)

    high = digits_config(monkeypatch, kubernetes={"startup_timeout_seconds": 20},
                         training={"priority": "high", "workers": {"resources": {"gpu": 1}}})
    message, took, labels = run_job(high, "cluster-tier-high", idle=True)
    first = message.splitlines()[0]
    print(f"\nhigh tier on a T4-only cluster: failed after {took:.0f}s: {first}")
    assert "(it needs the GPU tier 'newest' (nodes labelled trainyard.io/gpu-pool=true, " \
           "nvidia.com/gpu.product=NVIDIA-H100-80GB-HBM3 with nvidia.com/gpu free))" in first, first
    assert "Unschedulable" in first or "FailedScheduling" in first, first
    gone(core, labels)
