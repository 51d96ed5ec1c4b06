"""The Kubernetes launcher: stage pods through the real KubernetesPodOperator code, serving objects, teardown,
the connection wiring, and a Role that allows every API call the backend makes. The cluster is an autospec'd
CoreV1Api/AppsV1Api (no cluster here); every call is asserted by verb, namespace and body."""

from __future__ import annotations

import contextlib
import json
import logging
import re
from pathlib import Path
from types import SimpleNamespace
from unittest.mock import MagicMock, call, create_autospec

import kubernetes_validate
import pytest
import yaml
from airflow.providers.cncf.kubernetes.hooks.kubernetes import KubernetesHook
from kubernetes.client import AppsV1Api
from kubernetes.client import models as k8s
from kubernetes.client.exceptions import ApiException

from tests.unit.k8s_fakes import FakeCluster, result_log
from tests.unit.test_render import K8S_VERSION, assert_restricted
from trainyard.config.loader import load_pipeline_file
from trainyard.dag.registry import stage_named
from trainyard.dag.stages import RunContext, stage_container
from trainyard.launch import launcher_for
from trainyard.launch.base import StageFailed
from trainyard.launch.kubernetes import KubernetesLauncher
from trainyard.launch.podspec import build_serving_deployment, build_serving_service, build_stage_pod

REPO = Path(__file__).resolve().parents[2]
RUN = RunContext(pipeline="digits", run_id="manual__2026-12-03T00:00:00+00:00")
LOG = logging.getLogger("test.k8s.backend")
NS = "trainyard"


@pytest.fixture
def config():
    return load_pipeline_file(REPO / "pipelines_config" / "digits.yaml")


def stage_cluster(exit_code: int, payload: dict | None) -> FakeCluster:
    """A cluster where a created pod runs to `exit_code` at once, its log ending with the result line."""
    fake = FakeCluster()
    create = fake._create

    def run(namespace: str, body: dict, **kwargs: object) -> k8s.V1Pod:
        pod = create(namespace, body)
        name = pod.metadata.name
        text = result_log(payload) if payload is not None else "bad input: column pixel_3 missing\n"
        fake.logs[name] = text  # the fake API adds timestamps when asked (KPO asks)
        fake.set(name, "Succeeded" if exit_code == 0 else "Failed", exit_code=exit_code)
        return pod

    fake.core.create_namespaced_pod.side_effect = run
    fake.core.read_namespaced_pod.side_effect = lambda name, namespace, **_: fake.pods[name]
    fake.core.list_namespaced_event.return_value = k8s.CoreV1EventList(items=[])
    fake.core.patch_namespaced_pod.return_value = None
    return fake


def launcher(config, fake: FakeCluster, apps: AppsV1Api | None = None) -> KubernetesLauncher:
    hook = create_autospec(KubernetesHook, instance=True)
    hook.is_in_cluster = False
    return KubernetesLauncher(config, hook=hook, core=fake.core,
                              apps=apps or create_autospec(AppsV1Api, instance=True))


def task_context(task_id: str = "validate_data") -> dict:
    ti = MagicMock(dag_id="digits", task_id=task_id, try_number=1, map_index=-1)
    return {"ti": ti, "run_id": RUN.run_id, "dag": SimpleNamespace(), "task_state_store": None}


def test_a_stage_pod_runs_through_kubernetes_pod_operator(config) -> None:
    fake = stage_cluster(0, {"rows": 1797, "valid": True})
    spec = stage_container(config, RUN, stage_named("validate"))

    result = launcher(config, fake).run_stage(RUN, spec, LOG, task_context())  # the seam: a spec, not a pod

    assert result == {"rows": 1797, "valid": True}
    (created,) = fake.core.create_namespaced_pod.call_args_list
    body = created.kwargs["body"]
    assert created.kwargs["namespace"] == NS
    kubernetes_validate.validate(body, K8S_VERSION, strict=True)
    assert_restricted(body["spec"], "validate pod")
    labels = body["metadata"]["labels"]
    assert labels["trainyard/pipeline"] == "digits" and labels["trainyard/stage"] == "validate"
    assert labels["trainyard/run"] and labels["dag_id"] == "digits" and labels["task_id"] == "validate_data"
    assert body["spec"]["nodeSelector"] == {"trainyard.io/cpu-pool": "true"}
    assert [c["name"] for c in body["spec"]["containers"]] == ["main"]  # no XCom sidecar, no pods/exec
    assert body["spec"]["volumes"][0]["persistentVolumeClaim"]["claimName"] == "trainyard-data"
    name = body["metadata"]["name"]
    assert name.startswith(build_stage_pod(config, RUN, spec).metadata.name[:40])  # KPO may add a suffix
    assert call(name=name, namespace=NS, container="main", tail_lines=2000, _preload_content=False) in \
        fake.core.read_namespaced_pod_log.call_args_list
    follows = [c for c in fake.core.read_namespaced_pod_log.call_args_list if c.kwargs.get("follow")]
    assert follows and follows[0].kwargs["container"] == "main"  # logs streamed into the task log
    (deleted,) = fake.core.delete_namespaced_pod.call_args_list
    assert deleted.args[:2] == (name, NS) or deleted.kwargs.get("name") == name
    assert fake.undeleted() == []


def test_each_mapped_group_task_runs_its_own_pod_with_its_group(config, monkeypatch: pytest.MonkeyPatch) -> None:
    """The mapped validate_data task of file group 1, as Airflow runs it: the operator builds the group's pod, KPO
    creates it with the task's map index among its labels (so a reattach finds this group's pod, not another's)."""
    from trainyard.dag.operators import StageOperator

    fake = stage_cluster(0, {"group": 1, "rows": 600, "files": 2})
    config = config.model_copy(update={"prep": config.prep.model_copy(update={"parallelism": 2})})
    operator = StageOperator(task_id="validate_data", config=config, stage=stage_named("validate"), group=1)
    monkeypatch.setattr(StageOperator, "launcher", lambda self, c: launcher(c, fake))
    context = task_context()
    context["ti"].map_index = 1
    context.update(params={}, dag_run=SimpleNamespace(run_id=RUN.run_id, run_after=None, run_type="manual"))

    assert operator.execute(context) == {"group": 1, "rows": 600, "files": 2}

    (created,) = fake.core.create_namespaced_pod.call_args_list
    body = created.kwargs["body"]
    kubernetes_validate.validate(body, K8S_VERSION, strict=True)
    labels = body["metadata"]["labels"]
    assert (labels["trainyard/stage"], labels["trainyard/index"], labels["map_index"]) == ("validate", "1", "1")
    assert body["spec"]["containers"][0]["args"][0] == "validate"
    assert body["spec"]["containers"][0]["args"][-2:] == ["--group", "1"]
    assert "-validate-g1-" in body["metadata"]["name"]
    assert fake.undeleted() == []


def test_a_bad_input_exit_code_fails_without_retry_and_deletes_the_pod(config) -> None:
    fake = stage_cluster(3, None)
    pod = build_stage_pod(config, RUN, stage_container(config, RUN, stage_named("validate")))

    with pytest.raises(StageFailed) as info:
        launcher(config, fake).run_pod(pod, LOG, task_context())
    assert info.value.exit_code == 3 and not info.value.retryable
    assert fake.undeleted() == []


def test_serving_objects_are_created_when_missing(config) -> None:
    fake = FakeCluster()
    apps = create_autospec(AppsV1Api, instance=True)
    apps.read_namespaced_deployment.side_effect = ApiException(status=404, reason="NotFound")
    fake.core.read_namespaced_service.side_effect = ApiException(status=404, reason="NotFound")

    endpoint = launcher(config, fake, apps).ensure_serving(config, LOG)

    assert endpoint == "digits.trainyard.svc:8500"
    assert apps.create_namespaced_deployment.call_args_list == [call(namespace=NS,
                                                                     body=build_serving_deployment(config))]
    service = build_serving_service(config)
    assert fake.core.create_namespaced_service.call_args_list == [call(namespace=NS, body=service)]
    assert not apps.patch_namespaced_deployment.called and not fake.core.patch_namespaced_service.called


def test_serving_objects_are_patched_to_the_config_when_present(config) -> None:
    fake = FakeCluster()
    fake._create_service(NS, build_serving_service(config))
    apps = create_autospec(AppsV1Api, instance=True)

    launcher(config, fake, apps).ensure_serving(config, LOG)

    deployment = build_serving_deployment(config)
    assert apps.patch_namespaced_deployment.call_args_list == [call(name="digits-serving", namespace=NS,
                                                                    body=deployment)]
    assert fake.core.patch_namespaced_service.call_args_list == [call(name="digits", namespace=NS,
                                                                      body=build_serving_service(config))]
    assert not apps.create_namespaced_deployment.called


def test_a_forbidden_serving_read_is_an_error_not_a_create(config) -> None:
    fake = FakeCluster()
    apps = create_autospec(AppsV1Api, instance=True)
    apps.read_namespaced_deployment.side_effect = ApiException(status=403, reason="Forbidden")
    with pytest.raises(ApiException, match="Forbidden"):
        launcher(config, fake, apps).ensure_serving(config, LOG)
    assert not apps.create_namespaced_deployment.called


def test_the_teardown_task_deletes_leftover_replicas_and_the_service(config) -> None:
    fake = FakeCluster()
    labels = {"trainyard/run": "r1", "trainyard/stage": "train"}
    for name in ("job-ps-0", "job-worker-0"):
        fake._create(NS, k8s.V1Pod(metadata=k8s.V1ObjectMeta(name=name, labels=labels),
                                   spec=k8s.V1PodSpec(containers=[k8s.V1Container(name="ps", image="x")])))
    fake.core.delete_namespaced_service.side_effect = ApiException(status=404, reason="NotFound")  # already gone

    count = launcher(config, fake).cleanup_job({"trainyard/run": "r1", "trainyard/stage": "train"}, "job", LOG)

    assert count == 2 and fake.undeleted() == []
    assert fake.core.list_namespaced_pod.call_args_list == [
        call(namespace=NS, label_selector="trainyard/run=r1,trainyard/stage=train")]
    assert fake.core.delete_namespaced_service.call_args_list == [call(name="job", namespace=NS)]


def test_the_launcher_reaches_the_cluster_through_the_configured_connection(config, tmp_path: Path,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "test",
        "clusters": [{"name": "test", "cluster": {"server": "https://127.0.0.1:6443"}}],
        "users": [{"name": "test", "user": {"token": "not-a-real-token"}}],
        "contexts": [{"name": "test", "context": {"cluster": "test", "user": "test"}}]}))
    monkeypatch.setenv("AIRFLOW_CONN_TRAINYARD_TEST", json.dumps(
        {"conn_type": "kubernetes", "extra": {"kube_config_path": str(kubeconfig)}}))
    configured = config.model_copy(update={"kubernetes": config.kubernetes.model_copy(
        update={"connection_id": "trainyard_test"})})

    built = launcher_for("kubernetes", configured)

    assert isinstance(built, KubernetesLauncher)
    assert built.core.api_client.configuration.host == "https://127.0.0.1:6443"
    assert built.apps.api_client is built.core.api_client  # one connection for the whole task


API_VERBS = {"create": "create", "read": "get", "list": "list", "delete": "delete", "patch": "patch",
             "replace": "update"}
RESOURCES = {"pod": "pods", "service": "services", "deployment": "deployments", "event": "events"}


def used_permissions(*mocks: object) -> set[tuple[str, str]]:
    """(resource, verb) of every namespaced API method called on these autospec'd clients."""
    used = set()
    for mock in mocks:
        for name, _, _ in mock.mock_calls:
            method = name.split(".")[0]
            if not method:
                continue
            match = re.match(r"(create|read|list|delete|patch|replace)_namespaced_(\w+?)(_log)?$", method)
            assert match, f"unexpected API call {method}"
            verb, kind, log = match.groups()
            used.add((RESOURCES[kind] + ("/log" if log else ""), API_VERBS[verb]))
    return used


def test_the_role_grants_exactly_what_the_backend_uses(config, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every path the backend has, run against the fakes; the Role must allow each call and nothing more."""
    from airflow.providers.cncf.kubernetes.utils import pod_manager

    from trainyard.dag.cluster_spec import job_name, kubernetes_hosts
    from trainyard.dag.stages import train_containers, train_replicas
    from trainyard.launch.kubernetes_job import KubernetesJob
    from trainyard.launch.podspec import build_headless_service, build_job_pods, job_selector
    from trainyard_contract.layout import run_key

    mocks: list[object] = []
    pod = build_stage_pod(config, RUN, stage_container(config, RUN, stage_named("validate")))
    for exit_code, payload in ((0, {"rows": 1}), (3, None)):  # a stage pod that succeeds, one that fails
        fake = stage_cluster(exit_code, payload)
        with contextlib.suppress(StageFailed):
            launcher(config, fake).run_pod(pod, LOG, task_context())
        mocks.append(fake.core)
    clock = iter(range(0, 10**9, 10**4))
    monkeypatch.setattr(pod_manager, "time", SimpleNamespace(time=lambda: next(clock)))
    never_starts = pending_cluster()
    with pytest.raises(StageFailed):
        launcher(config, never_starts).run_pod(pod, LOG, task_context())
    mocks.append(never_starts.core)
    for present in (False, True):  # serving objects created, then patched
        serving, apps = FakeCluster(), create_autospec(AppsV1Api, instance=True)
        if present:
            serving._create_service(NS, build_serving_service(config))
        else:
            apps.read_namespaced_deployment.side_effect = ApiException(status=404, reason="NotFound")
        launcher(config, serving, apps).ensure_serving(config, LOG)
        mocks += [serving.core, apps]
    # the training job: a reused Service, a replaced worker, a pod stuck Pending; then the teardown sweep
    stage = stage_named("train")
    job = job_name(config.name, run_key(RUN.run_id))
    cluster = kubernetes_hosts(job, NS, config.training.port, train_replicas(config))
    pods = build_job_pods(config, RUN, train_containers(config, RUN, stage, cluster), job)
    service = build_headless_service(config, RUN, stage, job)
    fake = FakeCluster()
    fake._create_service(NS, service)
    worker = f"{job}-worker-0"
    fake.script = [lambda f: None, FakeCluster.all_running, lambda f: f.set(worker, "Failed", exit_code=1),
                   lambda f: f.set(f"{worker}-r1", "Pending", scheduled=False)]
    stub = KubernetesJob(fake.core, NS, LOG, restart_budget=2, selector=job_selector(config, RUN, stage),
                         startup_timeout=0, poll_seconds=0, sleep=lambda s: None)
    with pytest.raises(StageFailed, match="still Pending"):
        stub.run(pods, service)
    launcher(config, fake).cleanup_job(job_selector(config, RUN, stage), job, LOG)
    mocks.append(fake.core)

    used = used_permissions(*mocks)
    documents = list(yaml.safe_load_all((REPO / "k8s" / "30-rbac.yaml").read_text()))
    (role,) = [d for d in documents if d["kind"] == "Role"]
    granted = {(resource, verb) for rule in role["rules"] for resource in rule["resources"] for verb in rule["verbs"]}
    assert used - granted == set(), "calls the Role does not allow"
    assert granted - used == set(), "verbs the Role grants that nothing uses"
    assert not any(resource == "pods/exec" for resource, _ in granted)


def pending_cluster() -> FakeCluster:
    """A cluster where a created stage pod is never scheduled (no node has what it asks for)."""
    fake = stage_cluster(0, {"rows": 1})
    create = fake._create

    def stays_pending(namespace: str, body: dict, **kwargs: object) -> k8s.V1Pod:
        pod = create(namespace, body)
        fake.set(pod.metadata.name, "Pending", scheduled=False)
        fake.add_event(pod.metadata.name, "FailedScheduling", "0/3 nodes are available: 3 Insufficient cpu.")
        return pod

    fake.core.create_namespaced_pod.side_effect = stays_pending
    return fake


def test_a_stage_pod_that_never_starts_says_why_in_a_few_lines(config, monkeypatch: pytest.MonkeyPatch) -> None:
    from airflow.providers.cncf.kubernetes.utils import pod_manager

    clock = iter(range(0, 10**9, 10**4))  # KPO's startup clock: every look is hours later
    monkeypatch.setattr(pod_manager, "time", SimpleNamespace(time=lambda: next(clock)))
    fake = pending_cluster()
    pod = build_stage_pod(config, RUN, stage_container(config, RUN, stage_named("validate")))

    with pytest.raises(StageFailed) as info:
        launcher(config, fake).run_pod(pod, LOG, task_context())
    message = str(info.value)
    (created,) = fake.names("create_namespaced_pod")
    assert created != pod.metadata.name and created.startswith(pod.metadata.name[:40])  # KPO's random suffix
    assert message == (f"pod {created} did not start within the startup timeout of 600s: Unschedulable: 0/3 nodes "
                       "are available: 3 Insufficient nvidia.com/gpu.; FailedScheduling: 0/3 nodes are available: "
                       "3 Insufficient cpu.")
    assert info.value.retryable and fake.undeleted() == []


def test_a_quota_rejection_of_a_stage_pod_is_one_clear_line(config) -> None:
    fake = stage_cluster(0, {"rows": 1})
    fake.pod_quota = 0
    fake.core.create_namespaced_pod.side_effect = fake._create
    pod = build_stage_pod(config, RUN, stage_container(config, RUN, stage_named("validate")))
    with pytest.raises(StageFailed, match=r"^the cluster refused pod digits-validate-.*: 403 Forbidden: pods "
                                          r"\".*\" is forbidden: exceeded quota: trainyard-quota") as info:
        launcher(config, fake).run_pod(pod, LOG, task_context())
    assert len(str(info.value)) < 400


def test_kpo_copies_the_stage_s_lines_but_not_tensorflow_s_start_up_chatter(config,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    from airflow.providers.cncf.kubernetes.utils.pod_manager import PodManager

    from tests.unit.test_native_noise import CHATTER

    forwarded: list[str] = []  # what KPO's own line logger received
    real = PodManager._log_message
    monkeypatch.setattr(PodManager, "_log_message",
                        lambda self, message, *a, **k: (forwarded.append(message), real(self, message, *a, **k)))
    fake = stage_cluster(0, {"rows": 1})
    create = fake._create

    def chatty(namespace: str, body: dict, **kwargs: object) -> k8s.V1Pod:
        pod = create(namespace, body)
        lines = CHATTER + ["2026-12-03 INFO validate: 1797 rows", result_log({"rows": 1}).splitlines()[1]]
        fake.logs[pod.metadata.name] = "".join(f"{line}\n" for line in lines)  # the API adds the timestamps
        fake.set(pod.metadata.name, "Succeeded", exit_code=0)
        return pod

    fake.core.create_namespaced_pod.side_effect = chatty
    pod = build_stage_pod(config, RUN, stage_container(config, RUN, stage_named("validate")))
    assert launcher(config, fake).run_pod(pod, LOG, task_context()) == {"rows": 1}
    assert "2026-12-03 INFO validate: 1797 rows" in forwarded
    assert not set(forwarded) & set(CHATTER)


def test_every_backend_the_config_accepts_has_a_launcher_and_no_other(config, monkeypatch: pytest.MonkeyPatch) -> None:
    from trainyard.launch import LAUNCHERS
    from trainyard.settings import backend_name
    from trainyard_contract.schema import BACKENDS

    assert set(LAUNCHERS) == set(BACKENDS) and len(BACKENDS) == 2
    assert type(launcher_for("local", config)).__name__ == "LocalLauncher"
    with pytest.raises(ValueError, match="unknown backend 'nomad'; use one of 'local', 'kubernetes'"):
        launcher_for("nomad", config)
    monkeypatch.setenv("TRAINYARD_BACKEND", "nomad")
    with pytest.raises(ValueError, match="TRAINYARD_BACKEND must be one of 'local', 'kubernetes' \\(got 'nomad'\\)"):
        backend_name(None)
