"""A TensorFlow training job on Kubernetes: headless Service + one pod per replica, watched until the chief ends.

What the Training Operator's TFJob controller does, in the task that owns the job: create the Service that gives
each replica its `<pod>.<job>` DNS name, start PS and workers and then the chief, poll the replica pods, follow the
chief's log into the task log, recreate a failed or vanished worker (same hostname, so TF_CONFIG still holds)
within the restart budget, and fail fast on a lost PS or chief. However the job ends (success, failure, timeout,
exception, on_kill) every replica's log tail is read into the task log, then every pod and the Service are deleted.
"""

from __future__ import annotations

import collections
import copy
import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from kubernetes.client import CoreV1Api
from kubernetes.client import models as k8s
from kubernetes.client.exceptions import ApiException

from trainyard.backends.base import StageFailed
from trainyard_contract.replica_policy import Action, on_replica_exit
from trainyard_contract.runtime import result_from_log

TAIL_LINES = 40
DELETE_GRACE_SECONDS = 30


def role_of(pod: k8s.V1Pod) -> str:
    return (pod.metadata.labels or {}).get("trainyard/role", "main")


def selector_of(labels: dict[str, str]) -> str:
    return ",".join(f"{key}={value}" for key, value in sorted(labels.items()))


def exit_code_of(pod: k8s.V1Pod) -> int | None:
    for status in (pod.status.container_statuses or []) if pod.status else []:
        if status.state is not None and status.state.terminated is not None:
            return status.state.terminated.exit_code
    return None


def pending_reason(pod: k8s.V1Pod) -> str:
    """Why a pod is still Pending, in the cluster's words (ImagePullBackOff, Unschedulable: 0/3 nodes ...)."""
    status = pod.status
    for container in (status.container_statuses or []) if status else []:
        waiting = container.state.waiting if container.state else None
        if waiting is not None and waiting.reason:
            return f"{waiting.reason}: {waiting.message or ''}".rstrip(": ")
    for condition in (status.conditions or []) if status else []:
        if condition.status == "False" and condition.reason:
            return f"{condition.reason}: {condition.message or ''}".rstrip(": ")
    return "waiting to be scheduled"


def replacement(pod: k8s.V1Pod, attempt: int) -> k8s.V1Pod:
    """The same replica under a new pod name; hostname and subdomain stay, so its DNS name in TF_CONFIG holds."""
    fresh = copy.deepcopy(pod)
    base = pod.spec.hostname or pod.metadata.name
    fresh.metadata.name = f"{base}-r{attempt}"
    fresh.metadata.resource_version = None
    fresh.metadata.uid = None
    fresh.status = None
    return fresh


class KubernetesJob:
    """One run of one training job; `run()` once, `cleanup()` from any thread (idempotent)."""

    def __init__(self, core: CoreV1Api, namespace: str, log: logging.Logger, *, restart_budget: int,
                 selector: dict[str, str], startup_timeout: float = 600.0, poll_seconds: float = 2.0,
                 clock: Callable[[], float] = time.monotonic, sleep: Callable[[float], None] = time.sleep):
        self.core, self.namespace, self.log = core, namespace, log
        self.restart_budget, self.selector = restart_budget, selector_of(selector)
        self.startup_timeout, self.poll_seconds = startup_timeout, poll_seconds
        self.clock, self.sleep = clock, sleep
        self.restarts = 0
        self._created: dict[str, k8s.V1Pod] = {}  # every pod this job created, by name, deleted at the end
        self._created_at: dict[str, float] = {}
        self._service: str | None = None
        self._lock = threading.RLock()
        self._cleaned = False
        self._killed = threading.Event()
        self._chief_lines: collections.deque[str] = collections.deque(maxlen=TAIL_LINES)
        self._result: dict[str, Any] | None = None
        self._follower: threading.Thread | None = None

    # -- the job -----------------------------------------------------------------------------------------------
    def run(self, pods: list[k8s.V1Pod], service: k8s.V1Service | None) -> dict[str, Any] | None:
        chief = next(pod for pod in pods if role_of(pod) == "chief")
        try:
            self._sweep_leftovers()
            if service is not None:
                self._service = service.metadata.name
                try:
                    self.core.create_namespaced_service(namespace=self.namespace, body=service)
                    self.log.info("created headless Service %s/%s", self.namespace, self._service)
                except ApiException as exc:
                    if exc.status != 409:  # left by an earlier attempt of this run: same name, same selector
                        raise
                    self.log.info("reusing headless Service %s/%s", self.namespace, self._service)
            for pod in [p for p in pods if p is not chief] + [chief]:
                self._create(pod)
            return self._watch({pod.metadata.name: pod for pod in pods}, chief.metadata.name)
        finally:
            self.cleanup()

    def _sweep_leftovers(self, timeout: float = 120.0) -> None:
        """Delete replica pods an earlier attempt of this run left (its worker was lost), and wait until they
        are gone: the new pods reuse their names."""
        leftovers = self.core.list_namespaced_pod(namespace=self.namespace, label_selector=self.selector).items
        if not leftovers:
            return
        self.log.warning("deleting %d replica pod(s) left by an earlier attempt", len(leftovers))
        for pod in leftovers:
            self._delete_pod(pod.metadata.name, grace=0)
        started = self.clock()
        while self.core.list_namespaced_pod(namespace=self.namespace, label_selector=self.selector).items:
            if self.clock() - started > timeout:
                raise StageFailed(f"replica pods of an earlier attempt were not gone after {timeout:.0f}s")
            self.sleep(self.poll_seconds)

    def _create(self, pod: k8s.V1Pod) -> None:
        with self._lock:
            if self._cleaned or self._killed.is_set():
                raise StageFailed("training job was stopped (task killed or marked failed)")
            self.core.create_namespaced_pod(namespace=self.namespace, body=pod)
            self._created[pod.metadata.name] = pod
            self._created_at[pod.metadata.name] = self.clock()
        self.log.info("created pod %s (%s)", pod.metadata.name, role_of(pod))

    def _watch(self, replicas: dict[str, k8s.V1Pod], chief: str) -> dict[str, Any] | None:
        """Poll until the chief ends; replicas maps the live pod name of each replica to its spec."""
        finished: set[str] = set()
        while True:
            if self._killed.is_set():
                raise StageFailed("training job was stopped (task killed or marked failed)")
            live = {pod.metadata.name: pod for pod in self.core.list_namespaced_pod(
                namespace=self.namespace, label_selector=self.selector).items}
            if self._killed.is_set():  # killed during the poll: the pods are gone because we deleted them
                raise StageFailed("training job was stopped (task killed or marked failed)")
            for name, spec in list(replicas.items()):
                pod = live.get(name)
                phase = pod.status.phase if pod is not None and pod.status else None
                if name == chief:
                    if phase in ("Running", "Succeeded", "Failed"):
                        self._follow_chief(name)
                    if phase == "Succeeded":
                        return self._chief_result(name)
                    if phase == "Failed" or pod is None:
                        code = exit_code_of(pod) if pod is not None else None
                        how = f"exited with code {code}" if pod is not None else "vanished (evicted or deleted)"
                        raise StageFailed(self._failure(f"chief {name} {how}"), code if code is not None else 1)
                elif phase == "Succeeded":
                    finished.add(name)  # a multi_worker_mirrored worker that finished its steps: not a loss
                elif (phase == "Failed" or pod is None) and name not in finished:
                    replicas.pop(name)
                    fresh = self._replace_or_fail(name, spec, pod)
                    replicas[fresh.metadata.name] = fresh
                waited = self.clock() - self._created_at.get(name, self.clock())
                if phase in (None, "Pending") and pod is not None and waited > self.startup_timeout:
                    raise StageFailed(self._failure(
                        f"pod {name} still Pending after {self.startup_timeout:.0f}s: {pending_reason(pod)}"))
            self.sleep(self.poll_seconds)

    def _replace_or_fail(self, name: str, spec: k8s.V1Pod, pod: k8s.V1Pod | None) -> k8s.V1Pod:
        """A replica ended (its pod Failed, or vanished: exit code None): the contract's replica policy says
        whether it is recreated."""
        code = exit_code_of(pod) if pod is not None else None
        verdict = on_replica_exit(role_of(spec), code, self.restarts, self.restart_budget)
        if verdict.action is not Action.RESTART:
            raise StageFailed(self._failure(f"{name} {verdict.reason}"), code if code is not None else 1)
        self.restarts += 1
        self.log.warning("%s %s", name, verdict.reason)
        self._log_tail(name)
        self._delete_pod(name)
        fresh = replacement(spec, self.restarts)
        self._create(fresh)
        return fresh

    # -- logs and result ---------------------------------------------------------------------------------------
    def _follow_chief(self, name: str) -> None:
        """Stream the chief's log into the task log from a thread, once the container has started."""
        if self._follower is not None:
            return

        def follow() -> None:
            try:
                response = self.core.read_namespaced_pod_log(name=name, namespace=self.namespace, container="chief",
                                                             follow=True, _preload_content=False)
                for raw in response.stream():
                    for line in raw.decode(errors="replace").splitlines():
                        self._chief_lines.append(line)
                        self.log.info("[chief] %s", line)
            except Exception as exc:  # the stream may drop; the final read below still finds the result
                self.log.warning("chief log stream ended early: %s", exc)

        self._follower = threading.Thread(target=follow, name="trainyard-chief-log", daemon=True)
        self._follower.start()

    def _chief_result(self, name: str) -> dict[str, Any] | None:
        if self._follower is not None:
            self._follower.join(timeout=30)
        text = self.core.read_namespaced_pod_log(name=name, namespace=self.namespace, container="chief")
        self._result = result_from_log(text.splitlines())
        if self._result is None:
            raise StageFailed(f"chief {name} succeeded but printed no result line; see its log above")
        self._result["worker_restarts"] = self.restarts
        self.log.info("training job finished; worker restarts: %d", self.restarts)
        return self._result

    def _log_tail(self, name: str) -> list[str]:
        role = role_of(self._created[name]) if name in self._created else "main"
        try:
            text = self.core.read_namespaced_pod_log(name=name, namespace=self.namespace, container=role,
                                                     tail_lines=TAIL_LINES)
        except ApiException as exc:
            self.log.warning("could not read the log of %s: %s", name, exc.reason)
            return []
        lines = text.splitlines()
        self.log.info("--- %s (last %d lines) ---\n%s", name, len(lines), "\n".join(lines))
        return lines

    def _failure(self, reason: str) -> str:
        self.log.error("training job failed: %s", reason)
        return f"training job failed: {reason}\n--- chief (last lines) ---\n" + "\n".join(self._chief_lines)

    # -- teardown ----------------------------------------------------------------------------------------------
    def kill(self) -> None:
        """From on_kill (another thread): stop the watch loop and tear everything down now."""
        self._killed.set()
        self.cleanup()

    def cleanup(self) -> None:
        """Read each replica's log tail, then delete every pod this job created and its Service (404s ignored)."""
        with self._lock:
            if self._cleaned:
                return
            self._cleaned = True
            names = list(self._created)
        for name in names:
            if role_of(self._created[name]) != "chief":
                self._log_tail(name)
            self._delete_pod(name)
        if self._service is not None:
            try:
                self.core.delete_namespaced_service(name=self._service, namespace=self.namespace)
            except ApiException as exc:
                if exc.status != 404:
                    self.log.error("could not delete Service %s: %s", self._service, exc.reason)

    def _delete_pod(self, name: str, grace: int = DELETE_GRACE_SECONDS) -> None:
        try:
            self.core.delete_namespaced_pod(
                name=name, namespace=self.namespace,
                body=k8s.V1DeleteOptions(grace_period_seconds=grace, propagation_policy="Background"))
        except ApiException as exc:
            if exc.status != 404:
                self.log.error("could not delete pod %s: %s", name, exc.reason)
