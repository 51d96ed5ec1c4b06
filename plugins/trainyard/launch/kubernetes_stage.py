"""A single-pod stage on Kubernetes, through the cncf provider's KubernetesPodOperator (KPO).

KPO does what it does best: create the pod, wait for it to start (events logged, startup timeout), stream its
log into the task log, reattach after a worker restart (`durable`), delete the pod when it ends. The stage's
result comes from the `::trainyard-result::` line it prints, read from the pod's log before KPO deletes the
pod, instead of KPO's XCom sidecar: no extra image, no `pods/exec` permission for the Airflow service account,
and the sidecar's container would need its own hardening to pass the restricted profile.
"""

from __future__ import annotations

from functools import cached_property
from typing import Any

from airflow.providers.cncf.kubernetes.callbacks import KubernetesPodOperatorCallback
from airflow.providers.cncf.kubernetes.operators.pod import KubernetesPodOperator
from airflow.providers.cncf.kubernetes.utils.pod_manager import PodManager
from kubernetes.client import models as k8s

from trainyard.launch.kubernetes_api import read_raw_log
from trainyard.launch.native_noise import is_native_noise
from trainyard_contract.runtime import failure_cause, result_from_log
from trainyard_contract.schema import PipelineConfig

RESULT_LOG_LINES = 2000
TERMINATION_GRACE_SECONDS = 30


class StageResult(KubernetesPodOperatorCallback):
    """Reads the stage's result line, exit code and cause off the finished pod, before KPO's cleanup deletes it."""

    @staticmethod
    def on_pod_completion(*, pod: k8s.V1Pod, client: Any, operator: Any, **kwargs: Any) -> None:
        if pod is None:
            return
        lines = read_raw_log(client, name=pod.metadata.name, namespace=pod.metadata.namespace,
                             container=operator.base_container_name, tail_lines=RESULT_LOG_LINES)
        operator.stage_result = result_from_log(lines)
        operator.stage_cause = failure_cause(lines)
        for status in (pod.status.container_statuses or []) if pod.status else []:
            if status.name == operator.base_container_name and status.state and status.state.terminated:
                operator.stage_exit_code = status.state.terminated.exit_code


class StagePodOperator(KubernetesPodOperator):
    """KPO carrying the stage's result and exit code (set by `StageResult`), with a quiet pod manager."""

    stage_result: dict[str, Any] | None = None
    stage_exit_code: int | None = None
    stage_cause: str | None = None  # the stage's own error (trainyard_contract.runtime.CauseTracker)

    @cached_property
    def pod_manager(self) -> PodManager:
        return QuietPodManager(kube_client=self.client, callbacks=self.callbacks)


class QuietPodManager(PodManager):
    """KPO's pod manager, minus TensorFlow's start-up chatter in the container lines it copies into the task log
    (the pod's own log keeps every line)."""

    def _log_message(self, message: str, *args: Any, **kwargs: Any) -> None:
        if is_native_noise(message):
            return
        super()._log_message(message, *args, **kwargs)


def build_pod_operator(pod: k8s.V1Pod, config: PipelineConfig, task_id: str) -> StagePodOperator:
    """The KPO that runs `pod` (a Trainyard pod spec, already hardened and labelled) as it is.

    Synchronous: the operator runs inside the stage's own task, so KPO's deferral (which resumes a method on the
    deferred task) is not available here; the slot is held for the stage's duration, as the local backend does.
    """
    return StagePodOperator(
        task_id=task_id,
        name=pod.metadata.name,
        namespace=config.kubernetes.namespace,
        full_pod_spec=pod,
        base_container_name=pod.spec.containers[0].name,
        kubernetes_conn_id=config.kubernetes.connection_id,
        get_logs=True,
        do_xcom_push=False,
        on_finish_action="delete_pod",
        durable=True,
        log_events_on_failure=True,
        log_pod_spec_on_failure=False,  # the whole pod object (~29 kB) buries the reason; the backend says it
        startup_timeout_seconds=config.kubernetes.startup_timeout_seconds,
        startup_check_interval_seconds=1,  # one GET a second while it starts; at 5 s a 1 s stage took 5.2 s
        termination_grace_period=TERMINATION_GRACE_SECONDS,
        callbacks=[StageResult],
    )
