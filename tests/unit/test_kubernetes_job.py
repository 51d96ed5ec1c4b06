"""The Kubernetes training job against an autospec'd CoreV1Api: creation order, restarts, failures, teardown."""

from __future__ import annotations

import logging
import threading
from pathlib import Path
from unittest.mock import call

import pytest
from kubernetes.client import models as k8s
from kubernetes.client.exceptions import ApiException

from tests.unit.k8s_fakes import FakeCluster, result_log
from trainyard.backends.base import StageFailed
from trainyard.backends.kubernetes_job import DELETE_GRACE_SECONDS, KubernetesJob, selector_of
from trainyard.config_loader import load_pipeline_file
from trainyard.podspec import build_headless_service, build_job_pods, job_selector
from trainyard.registry import stage_named
from trainyard.stages import RunContext, train_containers, train_replicas
from trainyard_contract.cluster_spec import job_name, kubernetes_hosts
from trainyard_contract.layout import run_key

REPO = Path(__file__).resolve().parents[2]
RUN = RunContext(pipeline="digits", run_id="manual__2026-12-03T00:00:00+00:00")
LOG = logging.getLogger("test.k8s.job")
NS = "trainyard"


@pytest.fixture
def job_objects():
    config = load_pipeline_file(REPO / "pipelines_config" / "digits.yaml")
    job = job_name(config.name, run_key(RUN.run_id))
    cluster = kubernetes_hosts(job, NS, config.training.port, train_replicas(config))
    pods = build_job_pods(config, RUN, train_containers(config, RUN, stage_named("train"), cluster), job)
    return config, job, pods, build_headless_service(config, RUN, stage_named("train"), job)


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds


def make_job(fake: FakeCluster, config, budget: int = 2, timeout: float = 600.0) -> KubernetesJob:
    clock = Clock()
    selector = job_selector(config, RUN, stage_named("train"))
    return KubernetesJob(fake.core, NS, LOG, restart_budget=budget, selector=selector,
                         startup_timeout=timeout, poll_seconds=1.0, clock=clock, sleep=clock.sleep)


def delete_call(name: str, grace: int = DELETE_GRACE_SECONDS):
    return call(name=name, namespace=NS,
                body=k8s.V1DeleteOptions(grace_period_seconds=grace, propagation_policy="Background"))


def chief_succeeds(fake: FakeCluster, chief: str, payload: dict) -> None:
    fake.logs[chief] = result_log(payload)
    fake.set(chief, "Succeeded", exit_code=0)


def test_success_creates_service_then_ps_workers_then_chief_and_tears_everything_down(job_objects) -> None:
    config, job, pods, service = job_objects
    fake = FakeCluster()
    chief = f"{job}-chief-0"
    fake.script = [lambda f: None,  # the leftover sweep: nothing there
                   lambda f: None, FakeCluster.all_running, lambda f: chief_succeeds(f, chief, {"steps": 300})]

    result = make_job(fake, config).run(pods, service)

    assert result == {"steps": 300, "worker_restarts": 0}
    selector = selector_of(job_selector(config, RUN, stage_named("train")))
    assert fake.core.list_namespaced_pod.call_args_list[0] == call(namespace=NS, label_selector=selector)
    assert fake.core.create_namespaced_service.call_args_list == [call(namespace=NS, body=service)]
    assert fake.names("create_namespaced_pod") == [f"{job}-ps-0", f"{job}-worker-0", f"{job}-worker-1", chief]
    assert all(c.kwargs["namespace"] == NS for c in fake.core.create_namespaced_pod.call_args_list)
    assert fake.core.create_namespaced_pod.call_args_list[0].kwargs["body"] is pods[1]  # the spec, unchanged
    assert fake.core.delete_namespaced_pod.call_args_list == [delete_call(p.metadata.name) for p in pods
                                                              if p.metadata.name != chief] + [delete_call(chief)]
    assert fake.core.delete_namespaced_service.call_args_list == [call(name=job, namespace=NS)]
    assert fake.pods == {}
    # every replica's log tail was read before its pod was deleted
    tails = [c.kwargs["name"] for c in fake.core.read_namespaced_pod_log.call_args_list if c.kwargs.get("tail_lines")]
    assert sorted(tails) == sorted(p.metadata.name for p in pods if p.metadata.name != chief)


def test_a_failed_worker_is_recreated_with_the_same_hostname(job_objects) -> None:
    config, job, pods, service = job_objects
    fake = FakeCluster()
    chief, worker = f"{job}-chief-0", f"{job}-worker-1"
    fake.script = [lambda f: None, FakeCluster.all_running, lambda f: f.set(worker, "Failed", exit_code=137),
                   lambda f: f.set(f"{worker}-r1", "Running"), lambda f: chief_succeeds(f, chief, {"steps": 300})]

    result = make_job(fake, config).run(pods, service)

    assert result["worker_restarts"] == 1
    created = fake.core.create_namespaced_pod.call_args_list
    fresh = created[-1].kwargs["body"]
    assert fresh.metadata.name == f"{worker}-r1"
    assert fresh.spec.hostname == worker and fresh.spec.subdomain == job
    original = next(p for p in pods if p.metadata.name == worker)
    assert fresh.spec.containers[0].env == original.spec.containers[0].env  # same TF_CONFIG
    deletes = fake.core.delete_namespaced_pod.call_args_list
    assert deletes[0] == delete_call(worker)  # the failed pod goes first, then the teardown
    assert delete_call(f"{worker}-r1") in deletes and fake.pods == {}


def test_a_lost_parameter_server_fails_the_job_and_cleans_up(job_objects) -> None:
    config, job, pods, service = job_objects
    fake = FakeCluster()
    fake.script = [lambda f: None, FakeCluster.all_running, lambda f: f.pods.pop(f"{job}-ps-0")]  # evicted

    with pytest.raises(StageFailed, match="ps-0 vanished.*parameter server cannot be replaced"):
        make_job(fake, config).run(pods, service)
    assert fake.pods == {}
    assert delete_call(f"{job}-chief-0") in fake.core.delete_namespaced_pod.call_args_list
    assert fake.core.delete_namespaced_service.call_args_list == [call(name=job, namespace=NS)]


def test_restart_budget_exhausted_fails(job_objects) -> None:
    config, job, pods, service = job_objects
    fake = FakeCluster()
    worker = f"{job}-worker-0"
    fake.script = [lambda f: None, FakeCluster.all_running, lambda f: f.set(worker, "Failed", exit_code=1),
                   lambda f: f.set(f"{worker}-r1", "Failed", exit_code=1)]

    with pytest.raises(StageFailed, match="restart budget of 1 exhausted"):
        make_job(fake, config, budget=1).run(pods, service)
    assert fake.pods == {}


def test_a_worker_that_reports_bad_input_is_not_recreated(job_objects) -> None:
    config, job, pods, service = job_objects
    fake = FakeCluster()
    worker = f"{job}-worker-0"
    fake.script = [lambda f: None, FakeCluster.all_running, lambda f: f.set(worker, "Failed", exit_code=3)]

    with pytest.raises(StageFailed, match="worker-0 exited with code 3 \\(bad input or config") as info:
        make_job(fake, config, budget=5).run(pods, service)
    assert info.value.exit_code == 3 and not info.value.retryable  # Airflow does not retry it either
    assert f"{worker}-r1" not in fake.names("create_namespaced_pod") and fake.pods == {}


def test_chief_failure_carries_its_exit_code(job_objects) -> None:
    config, job, pods, service = job_objects
    fake = FakeCluster()
    chief = f"{job}-chief-0"
    fake.logs[chief] = "Traceback ...\nModelError: bad params\n"
    fake.script = [lambda f: None, FakeCluster.all_running, lambda f: f.set(chief, "Failed", exit_code=3)]

    with pytest.raises(StageFailed, match="chief .* exited with code 3") as info:
        make_job(fake, config).run(pods, service)
    assert info.value.exit_code == 3 and not info.value.retryable
    assert fake.pods == {} and fake.core.delete_namespaced_service.called


def test_pending_past_the_startup_timeout_names_the_reason(job_objects) -> None:
    config, job, pods, service = job_objects
    fake = FakeCluster()
    def image_missing(f: FakeCluster) -> None:
        f.all_running()
        f.set(f"{job}-worker-0", "Pending", waiting="ImagePullBackOff")

    fake.script = [lambda f: None, image_missing]

    with pytest.raises(StageFailed, match="worker-0 still Pending after 5s: ImagePullBackOff: Back-off pulling"):
        make_job(fake, config, timeout=5).run(pods, service)
    assert fake.pods == {} and fake.core.delete_namespaced_service.called


def test_an_api_error_mid_watch_still_tears_down(job_objects) -> None:
    config, job, pods, service = job_objects
    fake = FakeCluster()

    def api_down(f: FakeCluster) -> None:
        raise ApiException(status=500, reason="Internal Server Error")

    fake.script = [lambda f: None, api_down]
    with pytest.raises(ApiException):
        make_job(fake, config).run(pods, service)
    assert fake.pods == {} and fake.core.delete_namespaced_service.call_args_list == [call(name=job, namespace=NS)]


def test_kill_from_another_thread_stops_the_watch_and_cleans_up_once(job_objects) -> None:
    config, job, pods, service = job_objects
    fake = FakeCluster()
    killer = make_job(fake, config)
    fake.script = [lambda f: None, FakeCluster.all_running,
                   lambda f: threading.Thread(target=killer.kill).start() or threading.Event().wait(0.2)]

    with pytest.raises(StageFailed, match="stopped"):
        killer.run(pods, service)
    assert fake.pods == {}
    assert fake.core.delete_namespaced_service.call_count == 1  # kill() and run()'s finally: one teardown
    assert fake.core.delete_namespaced_pod.call_count == len(pods)


def test_leftovers_of_an_earlier_attempt_are_deleted_first_and_the_service_reused(job_objects) -> None:
    config, job, pods, service = job_objects
    fake = FakeCluster()
    fake._create(NS, next(p for p in pods if p.metadata.name.endswith("-ps-0")))  # left by the lost attempt
    fake.core.create_namespaced_service.side_effect = ApiException(status=409, reason="AlreadyExists")
    chief = f"{job}-chief-0"
    fake.script = [lambda f: None, lambda f: None, FakeCluster.all_running,
                   lambda f: chief_succeeds(f, chief, {"steps": 300})]

    assert make_job(fake, config).run(pods, service)["steps"] == 300
    assert fake.core.delete_namespaced_pod.call_args_list[0] == delete_call(f"{job}-ps-0", grace=0)
    assert fake.names("create_namespaced_pod")[0] == f"{job}-ps-0"
    assert fake.core.delete_namespaced_service.call_count == 1 and fake.pods == {}
