"""The Kubernetes backend: the same pod specs as the local backend, launched in a cluster.

Single-pod stages go through KubernetesPodOperator (kubernetes_stage.py), the training job through
`KubernetesJob` (kubernetes_job.py), the serving objects through `apply_serving_objects` (kubernetes_serving.py). The
cluster is reached through one Airflow connection (`kubernetes.connection_id`: in-cluster config or a kubeconfig);
every client is passed in, so tests run the real code against autospec'd API objects.
"""

from __future__ import annotations

import logging
import threading
from typing import Any

from airflow.exceptions import AirflowException
from airflow.providers.cncf.kubernetes.hooks.kubernetes import KubernetesHook
from airflow.providers.cncf.kubernetes.kubernetes_helper_functions import PodLaunchFailedException
from airflow.providers.cncf.kubernetes.utils.pod_manager import PodLaunchTimeoutException
from kubernetes.client import AppsV1Api, CoreV1Api
from kubernetes.client import models as k8s
from kubernetes.client.exceptions import ApiException

from trainyard.dag.cluster_spec import Replicas, kubernetes_hosts
from trainyard.dag.registry import Stage
from trainyard.dag.stages import ContainerSpec, RunContext
from trainyard.launch.base import StageFailed
from trainyard.launch.kubernetes_api import api_error, ignore_not_found, pending_reason, recent_events
from trainyard.launch.kubernetes_job import KubernetesJob, selector_of
from trainyard.launch.kubernetes_lease import sweep_expired_jobs
from trainyard.launch.kubernetes_serving import apply_serving_objects
from trainyard.launch.kubernetes_stage import build_pod_operator
from trainyard.launch.podspec import build_headless_service, build_job_pods, build_stage_pod
from trainyard_contract.schema import PipelineConfig

POLL_SECONDS = 2.0


def created_name(operator: Any, pod: k8s.V1Pod) -> str:
    """The pod's real name: KPO adds a random suffix to the name Trainyard built."""
    created = getattr(operator, "pod", None)
    return created.metadata.name if created is not None and created.metadata else pod.metadata.name


def launch_failure(exc: BaseException) -> AirflowException | None:
    """The launch error behind `exc`: KPO's cleanup raises its own error while handling the original one."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        if isinstance(current, PodLaunchFailedException | PodLaunchTimeoutException):
            return current
        seen.add(id(current))
        current = current.__cause__ or current.__context__
    return None


class KubernetesLauncher:
    def __init__(self, config: PipelineConfig, *, hook: Any = None, core: CoreV1Api | None = None,
                 apps: AppsV1Api | None = None, poll_seconds: float = POLL_SECONDS):
        self.config = config
        self.namespace = config.kubernetes.namespace
        self.hook = hook if hook is not None else KubernetesHook(conn_id=config.kubernetes.connection_id)
        self.core = core if core is not None else self.hook.core_v1_client
        self.apps = apps if apps is not None else AppsV1Api(self.hook.api_client)
        self.poll_seconds = poll_seconds
        self._lock = threading.Lock()
        self._operator: Any = None
        self._job: KubernetesJob | None = None

    def run_stage(self, run: RunContext, spec: ContainerSpec, log: logging.Logger,
                  context: Any = None) -> dict[str, Any] | None:
        """The stage's pod (podspec.build_stage_pod), run by `run_pod`."""
        return self.run_pod(build_stage_pod(self.config, run, spec), log, context)

    def run_pod(self, pod: k8s.V1Pod, log: logging.Logger, context: Any = None) -> dict[str, Any] | None:
        """Run one stage pod through KubernetesPodOperator inside the current task; return its result line."""
        if context is None:
            raise ValueError("the kubernetes backend runs stage pods inside an Airflow task (context required)")
        operator = build_pod_operator(pod, self.config, task_id=context["ti"].task_id)
        operator.__dict__["hook"] = self.hook  # the launcher's connection, not a second one per pod
        operator.__dict__["client"] = self.core
        with self._lock:
            self._operator = operator
        try:
            operator.execute(context)
        except AirflowException as exc:
            raise StageFailed(self._stage_failure(operator, pod, exc), operator.stage_exit_code,
                              cause=operator.stage_cause) from exc
        except ApiException as exc:  # KPO's create answered an error (quota, admission, RBAC)
            raise StageFailed(f"the cluster refused pod {pod.metadata.name}: {api_error(exc)}") from exc
        finally:
            with self._lock:
                self._operator = None
        if operator.stage_exit_code not in (None, 0):
            raise StageFailed(f"pod {created_name(operator, pod)} exited with code {operator.stage_exit_code}",
                              operator.stage_exit_code, cause=operator.stage_cause)
        return operator.stage_result

    def _stage_failure(self, operator: Any, pod: k8s.V1Pod, exc: AirflowException) -> str:
        """One short message for a failed stage pod: the name KPO gave it, how it ended, and for a pod that never
        started, why (its conditions and latest events), instead of KPO's dump of the whole pod object."""
        name = created_name(operator, pod)
        launch = launch_failure(exc)
        if launch is not None:
            remote = getattr(operator, "remote_pod", None)
            uid = remote.metadata.uid if remote is not None and remote.metadata is not None else None
            events = recent_events(self.core, self.namespace, name, logging.getLogger("trainyard.kubernetes"), uid=uid)
            reason = pending_reason(remote, events)
            if isinstance(launch, PodLaunchTimeoutException):
                timeout = self.config.kubernetes.startup_timeout_seconds
                return f"pod {name} did not start within the startup timeout of {timeout}s: {reason}"
            return f"pod {name} failed to start ({launch}): {reason}"
        if operator.stage_exit_code is not None:
            return f"pod {name} exited with code {operator.stage_exit_code}; its log is above"
        return f"pod {name} failed: {str(exc).splitlines()[0] if str(exc) else type(exc).__name__}"

    def ensure_serving(self, config: PipelineConfig, log: logging.Logger) -> str:
        """Create or patch the model's TF Serving Deployment and Service (and the stream Deployments when the config
        has `stream:`); the in-cluster gRPC address of serving."""
        return apply_serving_objects(self.core, self.apps, config, log)

    def cluster_hosts(self, job: str, namespace: str, port: int, replicas: Replicas) -> dict[str, list[str]]:
        """`<job>-<role>-<i>.<job>.<namespace>.svc:<port>`, resolved through the job's headless Service."""
        return kubernetes_hosts(job, namespace, port, replicas)

    def run_job(self, run: RunContext, stage: Stage, specs: list[ContainerSpec],
                log: logging.Logger) -> dict[str, Any] | None:
        """The job's replica pods and its headless Service (podspec), run by `run_pods`. Replica logs are read
        through the API into the task log."""
        job = run.job_name
        return self.run_pods(build_job_pods(self.config, run, specs, job), log, self.config.training.restart_budget,
                             service=build_headless_service(self.config, run, stage, job))

    def run_pods(self, pods: list[k8s.V1Pod], log: logging.Logger, restart_budget: int,
                 service: k8s.V1Service | None = None) -> dict[str, Any] | None:
        """Run a training job's pods (and headless Service) until the chief ends; always tear them down."""
        # the labels every replica carries (a single pod's labels would also hold its role and index)
        common = set.intersection(*(set(pod.metadata.labels.items()) for pod in pods))
        selector = service.spec.selector if service is not None else dict(common)
        job = KubernetesJob(self.core, self.namespace, log, restart_budget=restart_budget, selector=selector,
                            startup_timeout=self.config.kubernetes.startup_timeout_seconds,
                            poll_seconds=self.poll_seconds)
        with self._lock:
            self._job = job
        self.sweep_expired(log)  # jobs whose launcher died: they hold the quota this one needs
        try:
            return job.run(pods, service)
        finally:
            with self._lock:
                self._job = None

    def cleanup_job(self, selector: dict[str, str], service: str, log: logging.Logger) -> int:
        """The teardown task's sweep: delete any replica pod and the Service a lost task left behind."""
        pods = self.core.list_namespaced_pod(namespace=self.namespace, label_selector=selector_of(selector)).items
        for pod in pods:
            ignore_not_found(self.core.delete_namespaced_pod, name=pod.metadata.name, namespace=self.namespace,
                             body=k8s.V1DeleteOptions(grace_period_seconds=0, propagation_policy="Background"))
        ignore_not_found(self.core.delete_namespaced_service, name=service, namespace=self.namespace)
        log.info("teardown: deleted %d leftover pod(s) and Service %s (if present)", len(pods), service)
        self.sweep_expired(log)
        return len(pods)

    def sweep_expired(self, log: logging.Logger, dry_run: bool = False) -> list[str]:
        """Delete the training jobs in this namespace whose launcher died (their lease expired); never fails the
        caller: an API error is logged and the next sweep tries again."""
        try:
            return sweep_expired_jobs(self.core, self.namespace, log, dry_run=dry_run)
        except ApiException as exc:
            log.warning("could not look for abandoned training jobs in %s: %s", self.namespace, api_error(exc))
            return []

    def kill(self) -> None:
        with self._lock:
            operator, job = self._operator, self._job
        if operator is not None:
            operator.on_kill()
        if job is not None:
            job.kill()
