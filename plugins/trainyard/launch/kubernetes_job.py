"""A TensorFlow training job on Kubernetes: headless Service + one pod per replica, watched until the chief ends.

What the Training Operator's TFJob controller does, in the task that owns the job: create the Service that gives
each replica its `<pod>.<job>` DNS name, start PS and workers and then the chief, poll the replica pods, follow the
chief's log into the task log, recreate a failed or vanished worker (same hostname, so TF_CONFIG still holds)
as the contract's replica policy says, and fail fast on a lost PS or chief.

Teardown cannot leak. Every replica pod carries an ownerReference to the Service, created first, so the cluster's
garbage collector removes the pods once the Service is gone, even when the Airflow worker died mid-job. However the
job ends (success, failure, timeout, exception, on_kill) `cleanup()` reads each replica's log tail, then attempts
every delete whatever an earlier step raised; it never raises over the job's own error, and a second call retries
only what failed. What still cannot be deleted is left to the `teardown_train` task's label sweep.

A job whose task dies without any of that (SIGKILL, a lost worker) stops renewing its lease on the Service
(kubernetes_lease.py); the next job, any `teardown_train` or `trainyard cleanup` then deletes it, and the replicas'
`activeDeadlineSeconds` bounds it when nothing runs at all.
"""

from __future__ import annotations

import collections
import copy
import datetime as dt
import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from kubernetes.client import CoreV1Api
from kubernetes.client import models as k8s
from kubernetes.client.exceptions import ApiException

from trainyard.launch.base import StageFailed
from trainyard.launch.kubernetes_api import (
    ApiUnavailable,
    api_error,
    follow_log,
    pending_reason,
    read_log_lines,
    recent_events,
    with_retries,
)
from trainyard.launch.kubernetes_lease import RENEW_SECONDS, lease_annotations, renew, utcnow
from trainyard.launch.native_noise import is_native_noise
from trainyard.launch.podspec import PLACEMENT_ANNOTATION
from trainyard.launch.replica_policy import Action, on_replica_exit
from trainyard_contract.runtime import failure_cause, result_from_log

TAIL_LINES = 40
CAUSE_LOG_LINES = 2000  # where a failed chief's cause is looked for: its error marker is its last line
DELETE_GRACE_SECONDS = 30
STOPPED = "training job was stopped (task killed or marked failed)"


def role_of(pod: k8s.V1Pod) -> str:
    return (pod.metadata.labels or {}).get("trainyard/role", "main")


def selector_of(labels: dict[str, str]) -> str:
    return ",".join(f"{key}={value}" for key, value in sorted(labels.items()))


def exit_code_of(pod: k8s.V1Pod) -> int | None:
    for status in (pod.status.container_statuses or []) if pod.status else []:
        if status.state is not None and status.state.terminated is not None:
            return status.state.terminated.exit_code
    return None


def replacement(pod: k8s.V1Pod, attempt: int) -> k8s.V1Pod:
    """The same replica under a new pod name; hostname and subdomain stay, so its DNS name in TF_CONFIG holds."""
    fresh = copy.deepcopy(pod)
    base = pod.spec.hostname or pod.metadata.name
    fresh.metadata.name = f"{base}-r{attempt}"
    fresh.metadata.resource_version = None
    fresh.metadata.uid = None
    fresh.status = None
    return fresh


def owned_by(pod: k8s.V1Pod, service: k8s.V1Service) -> k8s.V1Pod:
    """`pod` with an ownerReference to the job's Service: deleting the Service garbage-collects the pod."""
    owned = copy.deepcopy(pod)
    owned.metadata.owner_references = [k8s.V1OwnerReference(
        api_version="v1", kind="Service", name=service.metadata.name, uid=service.metadata.uid)]
    return owned


class KubernetesJob:
    """One run of one training job; `run()` once, `cleanup()` from any thread (idempotent, retries failures)."""

    def __init__(self, core: CoreV1Api, namespace: str, log: logging.Logger, *, restart_budget: int,
                 selector: dict[str, str], startup_timeout: float = 600.0, poll_seconds: float = 2.0,
                 clock: Callable[[], float] = time.monotonic, sleep: Callable[[float], None] = time.sleep,
                 wall: Callable[[], dt.datetime] = utcnow):
        self.core, self.namespace, self.log = core, namespace, log
        self.restart_budget, self.selector = restart_budget, selector_of(selector)
        self.startup_timeout, self.poll_seconds = startup_timeout, poll_seconds
        self.clock, self.sleep, self.wall = clock, sleep, wall
        self._renewed_at = clock()
        self.restarts = 0
        self._created: dict[str, k8s.V1Pod] = {}  # every pod this job created, by name
        self._created_at: dict[str, float] = {}
        self._deleted: set[str] = set()  # pods whose delete succeeded (or that were gone already)
        self._tails_read: set[str] = set()
        self._service: str | None = None
        self._service_deleted = False
        self._lock = threading.RLock()
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
                owner = self._ensure_service(service)
                pods = [owned_by(pod, owner) for pod in pods]
                chief = next(pod for pod in pods if role_of(pod) == "chief")
            for pod in [p for p in pods if p is not chief] + [chief]:
                self._create(pod)
            return self._watch({pod.metadata.name: pod for pod in pods}, chief.metadata.name)
        except ApiException as exc:  # not transient (those were retried): say what the API answered
            raise StageFailed(self._failure(f"the Kubernetes API refused a call: {api_error(exc)}")) from exc
        except ApiUnavailable as exc:
            raise StageFailed(self._failure(str(exc))) from exc
        finally:
            self.cleanup()

    def _call(self, what: str, call: Callable[[], Any]) -> Any:
        return with_retries(call, what, self.log, sleep=self.sleep)

    def _ensure_service(self, service: k8s.V1Service) -> k8s.V1Service:
        """Create the headless Service first (the replicas' owner); reuse the one an earlier attempt left."""
        name = service.metadata.name
        self._service = name
        service = copy.deepcopy(service)
        service.metadata.annotations = {**(service.metadata.annotations or {}), **lease_annotations(self.wall())}
        try:
            created = self._call(f"creating Service {name}", lambda: self.core.create_namespaced_service(
                namespace=self.namespace, body=service))
            self.log.info("created headless Service %s/%s", self.namespace, name)
        except ApiException as exc:
            if exc.status != 409:
                raise
            created = self._call(f"reading Service {name}", lambda: self.core.read_namespaced_service(
                name=name, namespace=self.namespace))
            self.log.info("reusing headless Service %s/%s", self.namespace, name)
            self._renew_lease(force=True)
        return created

    def _renew_lease(self, force: bool = False) -> None:
        """Tell sweepers this job still has its launcher; a failed renewal is logged, never fatal (the lease is
        six renewals long)."""
        if self._service is None or (not force and self.clock() - self._renewed_at < RENEW_SECONDS):
            return
        self._renewed_at = self.clock()
        try:
            renew(self.core, self.namespace, self._service, self.wall())
        except ApiException as exc:
            self.log.warning("could not renew the lease on Service %s: %s", self._service, api_error(exc))

    def _list(self) -> list[k8s.V1Pod]:
        return self._call("listing the job's pods", lambda: self.core.list_namespaced_pod(
            namespace=self.namespace, label_selector=self.selector)).items

    def _sweep_leftovers(self, timeout: float = 120.0) -> None:
        """Delete replica pods an earlier attempt of this run left (its worker was lost), and wait until they
        are gone: the new pods reuse their names."""
        leftovers = self._list()
        if not leftovers:
            return
        self.log.warning("deleting %d replica pod(s) left by an earlier attempt", len(leftovers))
        for pod in leftovers:
            self._delete_pod(pod.metadata.name, grace=0)
        started = self.clock()
        while self._list():
            if self.clock() - started > timeout:
                raise StageFailed(f"replica pods of an earlier attempt were not gone after {timeout:.0f}s")
            self.sleep(self.poll_seconds)

    def _create(self, pod: k8s.V1Pod) -> None:
        name = pod.metadata.name
        with self._lock:
            if self._killed.is_set():
                raise StageFailed(STOPPED)
            try:
                self._call(f"creating pod {name}", lambda: self.core.create_namespaced_pod(
                    namespace=self.namespace, body=pod))
            except ApiException as exc:
                raise StageFailed(self._failure(f"the cluster refused pod {name}: {api_error(exc)}")) from exc
            self._created[name] = pod
            self._created_at[name] = self.clock()
        self.log.info("created pod %s (%s)", name, role_of(pod))

    def _watch(self, replicas: dict[str, k8s.V1Pod], chief: str) -> dict[str, Any] | None:
        """Poll until the chief ends; replicas maps the live pod name of each replica to its spec."""
        finished: set[str] = set()
        while True:
            if self._killed.is_set():
                raise StageFailed(STOPPED)
            live = {pod.metadata.name: pod for pod in self._list()}
            if self._killed.is_set():  # killed during the poll: the pods are gone because we deleted them
                raise StageFailed(STOPPED)
            self._renew_lease()
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
                        raise StageFailed(self._failure(f"chief {name} {how}"), code if code is not None else 1,
                                          cause=self._cause_of(name) if pod is not None else None)
                elif phase == "Succeeded":
                    finished.add(name)  # a multi_worker_mirrored worker that finished its steps: not a loss
                elif (phase == "Failed" or pod is None) and name not in finished:
                    replicas.pop(name)
                    fresh = self._replace_or_fail(name, spec, pod)
                    replicas[fresh.metadata.name] = fresh
                waited = self.clock() - self._created_at.get(name, self.clock())
                if phase in (None, "Pending") and pod is not None and waited > self.startup_timeout:
                    events = recent_events(self.core, self.namespace, name, self.log, uid=pod.metadata.uid)
                    needs = (spec.metadata.annotations or {}).get(PLACEMENT_ANNOTATION)
                    needs = f" (it needs the {needs})" if needs else ""
                    raise StageFailed(self._failure(
                        f"pod {name} still Pending after {self.startup_timeout:.0f}s{needs}: "
                        f"{pending_reason(pod, events)}"))
            self.sleep(self.poll_seconds)

    def _replace_or_fail(self, name: str, spec: k8s.V1Pod, pod: k8s.V1Pod | None) -> k8s.V1Pod:
        """A replica ended (its pod Failed, or vanished: exit code None): the contract's replica policy says
        whether it is recreated."""
        code = exit_code_of(pod) if pod is not None else None
        verdict = on_replica_exit(role_of(spec), code, self.restarts, self.restart_budget)
        if verdict.action is not Action.RESTART:
            said = self._log_tail(name, gone=pod is None)  # what the lost replica said, before the job fails over it
            raise StageFailed(self._failure(f"{name} {verdict.reason}"), code if code is not None else 1,
                              cause=failure_cause(said))
        self.restarts += 1
        self.log.warning("%s %s", name, verdict.reason)
        self._log_tail(name, gone=pod is None)
        if self._delete_pod(name):
            self._deleted.add(name)
        fresh = replacement(spec, self.restarts)
        self._create(fresh)
        return fresh

    # -- logs and result ---------------------------------------------------------------------------------------
    def _follow_chief(self, name: str) -> None:
        """Stream the chief's log into the task log from a thread, once the container has started."""
        if self._follower is not None:
            return

        def line(text: str) -> None:
            if is_native_noise(text):
                return
            self._chief_lines.append(text)
            self.log.info("[chief] %s", text)

        def follow() -> None:
            follow_log(self.core, name, self.namespace, "chief", line, self.log, stopped=self._killed.is_set,
                       sleep=self.sleep)

        self._follower = threading.Thread(target=follow, name="trainyard-chief-log", daemon=True)
        self._follower.start()

    def _chief_result(self, name: str) -> dict[str, Any] | None:
        if self._follower is not None:
            self._follower.join(timeout=30)
        lines = read_log_lines(self.core, name, self.namespace, "chief", self.log, sleep=self.sleep)
        self._result = result_from_log(lines)
        if self._result is None:
            raise StageFailed(f"chief {name} succeeded but printed no result line; see its log above")
        self._result["worker_restarts"] = self.restarts
        self.log.info("training job finished; worker restarts: %d", self.restarts)
        return self._result

    def _log_tail(self, name: str, gone: bool = False) -> list[str]:
        """The last lines of a replica's log into the task log; [] (and a warning) when they cannot be read.
        `gone`: the pod vanished (deleted, evicted), so an empty log says that, not that it never started."""
        role = role_of(self._created[name]) if name in self._created else "main"
        try:
            lines = read_log_lines(self.core, name, self.namespace, role, self.log, tail_lines=TAIL_LINES,
                                   sleep=self.sleep)
        except (ApiException, ApiUnavailable) as exc:
            detail = api_error(exc) if isinstance(exc, ApiException) else str(exc)
            self.log.warning("could not read the log of %s: %s", name, detail)
            return []
        self._tails_read.add(name)
        lines = [line for line in lines if not is_native_noise(line)]
        if lines:
            self.log.info("--- %s (last %d lines) ---\n%s", name, len(lines), "\n".join(lines))
        elif gone:
            self.log.info("--- %s: no log to read: the pod was deleted or evicted, its log went with it ---", name)
        else:
            self.log.info("--- %s: no log (the container never started) ---", name)
        return lines

    def _cause_of(self, name: str) -> str | None:
        """The failed chief's own error, from its whole log (the follower may not have caught up with it)."""
        try:
            lines = read_log_lines(self.core, name, self.namespace, "chief", self.log, tail_lines=CAUSE_LOG_LINES,
                                   sleep=self.sleep)
        except (ApiException, ApiUnavailable) as exc:
            self.log.warning("could not read the log of %s for its cause: %s", name, exc)
            return None
        return failure_cause(lines)

    def _failure(self, reason: str) -> str:
        self.log.error("training job failed: %s", reason)
        return f"training job failed: {reason}\n--- chief (last lines) ---\n" + "\n".join(self._chief_lines)

    # -- teardown ----------------------------------------------------------------------------------------------
    def kill(self) -> None:
        """From on_kill (another thread): stop the watch loop and tear everything down now."""
        self._killed.set()
        self.cleanup()

    def leftovers(self) -> list[str]:
        """What this job created and could not delete yet (pods by name, the Service as `service/<name>`)."""
        with self._lock:
            pods = [name for name in self._created if name not in self._deleted]
            service = [f"service/{self._service}"] if self._service and not self._service_deleted else []
        return pods + service

    def cleanup(self) -> list[str]:
        """Read each replica's log tail once, then delete every pod this job created and its Service.

        Every delete is attempted whatever the one before raised; 404 counts as deleted. Never raises (the job's
        own error stays the one the task reports); returns what is left, which the next call tries again."""
        with self._lock:
            pods = [name for name in self._created if name not in self._deleted]
            delete_service = self._service is not None and not self._service_deleted
        for name in pods:
            if name not in self._tails_read and role_of(self._created[name]) != "chief":
                try:
                    self._log_tail(name)
                except Exception as exc:  # a log is a nicety; the delete below is not
                    self.log.warning("could not read the log of %s: %s", name, exc)
            if self._delete_pod(name):
                with self._lock:
                    self._deleted.add(name)
        if delete_service and self._delete_service():
            with self._lock:
                self._service_deleted = True
        left = self.leftovers()
        if left:
            self.log.error("could not delete %s yet; cleanup tries again, and the teardown task sweeps them",
                           ", ".join(left))
        return left

    def _delete_service(self) -> bool:
        try:
            self._call(f"deleting Service {self._service}", lambda: self.core.delete_namespaced_service(
                name=self._service, namespace=self.namespace,
                body=k8s.V1DeleteOptions(propagation_policy="Background")))
            return True
        except ApiException as exc:
            if exc.status == 404:
                return True
            self.log.error("could not delete Service %s: %s", self._service, api_error(exc))
        except Exception as exc:
            self.log.error("could not delete Service %s: %s", self._service, exc)
        return False

    def _delete_pod(self, name: str, grace: int = DELETE_GRACE_SECONDS) -> bool:
        """Delete one pod; True when it is deleted or already gone, False (logged) when the API refused."""
        try:
            self._call(f"deleting pod {name}", lambda: self.core.delete_namespaced_pod(
                name=name, namespace=self.namespace,
                body=k8s.V1DeleteOptions(grace_period_seconds=grace, propagation_policy="Background")))
            return True
        except ApiException as exc:
            if exc.status == 404:
                return True
            self.log.error("could not delete pod %s: %s", name, api_error(exc))
        except Exception as exc:
            self.log.error("could not delete pod %s: %s", name, exc)
        return False
