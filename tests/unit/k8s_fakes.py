"""An autospec'd `CoreV1Api` backed by an in-memory API server, so the real backend code runs against it.

It answers the way a real kube-apiserver does where it matters to Trainyard (seen against one with etcd):
- create: 409 AlreadyExists for a taken name (a terminating pod still holds it), 403 Forbidden with the quota's
  Status message past `pod_quota`; created objects get a uid;
- delete: 404 NotFound for a missing object; a deleted pod stays listed (terminating) for `deletion_polls` polls;
  deleting a Service garbage-collects the pods whose ownerReference points at it;
- pod logs: None (the 204 the client turns into None) for a pod not yet placed on a node, 400 for a container that
  has not started; once it runs, what the pinned client (kubernetes 36.x) returns: with `_preload_content=False`
  the raw response (`.data` bytes, `.stream()`), otherwise the *repr of the bytes* as one str (`"b'...\\n...'"`,
  the client's bug, seen on a real v1.24 server), so code that trusts the default return cannot pass;
- events by `involvedObject.name` (and `.uid`: a deleted namesake's events are not the new pod's);
- scripted API errors on any call (`fail`).

Each `list_namespaced_pod` is one poll of a watch loop; a test scripts what the cluster does before each poll.
Everything else is asserted on the mock's recorded calls (verb, namespace, body).
"""

from __future__ import annotations

import copy
import datetime as dt
import itertools
import json
from collections.abc import Callable
from unittest.mock import create_autospec

from kubernetes.client import ApiClient, CoreV1Api
from kubernetes.client import models as k8s
from kubernetes.client.exceptions import ApiException

from trainyard_contract.runtime import RESULT_MARKER


def api_exception(status: int, reason: str, message: str = "") -> ApiException:
    """An ApiException carrying the Status body a real server sends."""
    exc = ApiException(status=status, reason=reason)
    exc.body = json.dumps({"kind": "Status", "apiVersion": "v1", "status": "Failure", "message": message,
                           "reason": reason, "code": status})
    return exc


def with_phase(pod: k8s.V1Pod, phase: str, exit_code: int | None = None, waiting: str | None = None,
               scheduled: bool = True) -> None:
    container = pod.spec.containers[0].name
    state = k8s.V1ContainerState()
    if exit_code is not None:
        state.terminated = k8s.V1ContainerStateTerminated(exit_code=exit_code,
                                                          finished_at=dt.datetime.now(dt.UTC))  # as the API sets it
    elif waiting is not None:
        message = "Back-off pulling image" if waiting == "ImagePullBackOff" else None
        state.waiting = k8s.V1ContainerStateWaiting(reason=waiting, message=message)
    else:
        state.running = k8s.V1ContainerStateRunning()
    conditions = [k8s.V1PodCondition(type="PodScheduled", status="True" if scheduled else "False",
                                     reason=None if scheduled else "Unschedulable",
                                     message=None if scheduled else "0/3 nodes are available: 3 Insufficient "
                                                                    "nvidia.com/gpu.")]
    statuses = [k8s.V1ContainerStatus(name=container, image=pod.spec.containers[0].image, image_id="",
                                      ready=phase == "Running", restart_count=0, state=state)] if scheduled else None
    pod.status = k8s.V1PodStatus(phase=phase, conditions=conditions, container_statuses=statuses)
    pod.spec.node_name = "node-1" if scheduled else None


def selects(selector: str, labels: dict[str, str]) -> bool:
    """Kubernetes label-selector matching for the forms clients send: `k=v`, `k!=v`, `k`, `!k`."""
    for term in filter(None, (t.strip() for t in selector.split(","))):
        if "!=" in term:
            key, value = term.split("!=", 1)
            if labels.get(key) == value:
                return False
        elif "=" in term:
            key, value = term.split("=", 1)
            if labels.get(key.rstrip("=")) != value:
                return False
        elif term.startswith("!"):
            if term[1:] in labels:
                return False
        elif term not in labels:
            return False
    return True


def result_log(payload: dict) -> str:
    return f"2026-12-03 step 300 loss 0.1\n{RESULT_MARKER}{json.dumps(payload)}\ntraining finished\n"


class FakeStream:
    """urllib3's HTTPResponse as `_preload_content=False` returns it: the body's bytes, whole or as a stream."""

    def __init__(self, text: str, drop_after: int | None = None):
        self.text, self.drop_after = text, drop_after

    @property
    def data(self) -> bytes:
        return self.text.encode()

    def stream(self, amt: int | None = None, decode_content: bool = True):  # urllib3's signature
        for i, line in enumerate(self.text.splitlines(keepends=True)):
            if self.drop_after is not None and i == self.drop_after:
                raise ConnectionResetError("stream dropped")
            yield line.encode()

    def release_conn(self) -> None:
        pass

    def close(self) -> None:
        pass


class FakeCluster:
    def __init__(self, deletion_polls: int = 1, pod_quota: int | None = None) -> None:
        self.core = create_autospec(CoreV1Api, instance=True)
        self.core.api_client = ApiClient()  # the real serializer (KPO sends sanitized dicts); no connection
        self.pods: dict[str, k8s.V1Pod] = {}
        self.services: dict[str, k8s.V1Service] = {}
        self.terminating: dict[str, int] = {}  # pod name -> polls until it is gone
        self.logs: dict[str, str] = {}
        self.events: dict[str, list[k8s.CoreV1Event]] = {}
        self.script: list[Callable[[FakeCluster], None]] = []
        self.failures: dict[str, list[Exception]] = {}  # method name -> errors raised by its next calls
        self.deletion_polls, self.pod_quota = deletion_polls, pod_quota
        self.drop_follow_after: int | None = None
        self.polls = 0
        self._uids = (f"uid-{i}" for i in itertools.count())
        for method, handler in (("create_namespaced_pod", self._create), ("list_namespaced_pod", self._list),
                                ("delete_namespaced_pod", self._delete), ("read_namespaced_pod_log", self._log),
                                ("create_namespaced_service", self._create_service),
                                ("read_namespaced_service", self._read_service),
                                ("delete_namespaced_service", self._delete_service),
                                ("list_namespaced_service", self._list_services),
                                ("patch_namespaced_service", self._patch_service),
                                ("list_namespaced_event", self._events)):
            getattr(self.core, method).side_effect = self._failing(method, handler)

    def fail(self, method: str, *errors: Exception) -> None:
        """The next calls of `method` raise these errors, one each, before it behaves normally again."""
        self.failures.setdefault(method, []).extend(errors)

    def _failing(self, method: str, handler: Callable[..., object]) -> Callable[..., object]:
        def call(*args: object, **kwargs: object) -> object:
            if self.failures.get(method):
                raise self.failures[method].pop(0)
            return handler(*args, **kwargs)
        return call

    # -- pods ----------------------------------------------------------------------------------------------
    def _create(self, namespace: str, body: k8s.V1Pod | dict, **_: object) -> k8s.V1Pod:
        if isinstance(body, dict):
            body = self.core.api_client._ApiClient__deserialize(body, "V1Pod")
        name = body.metadata.name
        if name in self.pods:
            raise api_exception(409, "AlreadyExists", f'pods "{name}" already exists')
        if self.pod_quota is not None and len(self.pods) >= self.pod_quota:
            raise api_exception(403, "Forbidden", f'pods "{name}" is forbidden: exceeded quota: trainyard-quota, '
                                f"requested: pods=1, used: pods={len(self.pods)}, limited: pods={self.pod_quota}")
        pod = copy.deepcopy(body)
        pod.metadata.uid = next(self._uids)
        with_phase(pod, "Pending", waiting="ContainerCreating")
        self.pods[name] = pod
        return copy.deepcopy(pod)

    def _list(self, namespace: str, label_selector: str = "", **_: object) -> k8s.V1PodList:
        self.polls += 1
        for name in list(self.terminating):
            self.terminating[name] -= 1
            if self.terminating[name] <= 0:
                del self.terminating[name]
                self.pods.pop(name, None)
        if self.script:
            self.script.pop(0)(self)
        return k8s.V1PodList(items=[copy.deepcopy(p) for p in self.pods.values()
                                    if selects(label_selector, p.metadata.labels or {})])

    def _delete(self, name: str, namespace: str, body: k8s.V1DeleteOptions | None = None, **_: object) -> None:
        if name not in self.pods or name in self.terminating:
            raise api_exception(404, "NotFound", f'pods "{name}" not found')
        self._terminate(name)

    def _terminate(self, name: str) -> None:
        self.pods[name].metadata.deletion_timestamp = dt.datetime(2026, 12, 3, tzinfo=dt.UTC)
        if self.deletion_polls <= 0:
            del self.pods[name]
        else:
            self.terminating[name] = self.deletion_polls

    def _log(self, name: str, namespace: str, container: str | None = None, follow: bool = False,
             _preload_content: bool = True, tail_lines: int | None = None, timestamps: bool = False,
             **_: object) -> object:
        pod = self.pods.get(name)
        if pod is None:
            raise api_exception(404, "NotFound", f'pods "{name}" not found')
        if not pod.spec.node_name:
            return None  # 204 No Content: not placed on a node yet
        statuses = pod.status.container_statuses or []
        if pod.status.phase == "Pending" and all(s.state.waiting for s in statuses):
            raise api_exception(400, "BadRequest", f'container "{container}" in pod "{name}" is waiting to start')
        text = self.logs.get(name, f"{name} log line\n")
        if tail_lines:
            text = "".join(text.splitlines(keepends=True)[-tail_lines:])
        if timestamps:
            text = "".join(f"2026-12-03T00:00:{i:02d}.123456789Z {line}"
                           for i, line in enumerate(text.splitlines(keepends=True)))
        if not follow and _preload_content:
            return repr(text.encode())  # kubernetes 36.x: str(bytes), escapes and all, as one line
        if not follow:
            return FakeStream(text)
        drop, self.drop_follow_after = self.drop_follow_after, None  # a stream drops once, then reconnects
        return FakeStream(text, drop)

    # -- services ------------------------------------------------------------------------------------------
    def _create_service(self, namespace: str, body: k8s.V1Service, **_: object) -> k8s.V1Service:
        name = body.metadata.name
        if name in self.services:
            raise api_exception(409, "AlreadyExists", f'services "{name}" already exists')
        service = copy.deepcopy(body)
        service.metadata.uid = next(self._uids)
        self.services[name] = service
        return copy.deepcopy(service)

    def _read_service(self, name: str, namespace: str, **_: object) -> k8s.V1Service:
        if name not in self.services:
            raise api_exception(404, "NotFound", f'services "{name}" not found')
        return copy.deepcopy(self.services[name])

    def _list_services(self, namespace: str, label_selector: str = "", **_: object) -> k8s.V1ServiceList:
        return k8s.V1ServiceList(items=[copy.deepcopy(s) for s in self.services.values()
                                        if selects(label_selector, s.metadata.labels or {})])

    def _patch_service(self, name: str, namespace: str, body: dict, **_: object) -> k8s.V1Service:
        """A merge patch of metadata.annotations (what the lease renewal sends); 404 for a missing Service."""
        if name not in self.services:
            raise api_exception(404, "NotFound", f'services "{name}" not found')
        metadata = self.services[name].metadata
        sent = body.get("metadata", {}).get("annotations", {}) if isinstance(body, dict) else \
            (body.metadata.annotations if body.metadata else None) or {}
        metadata.annotations = {**(metadata.annotations or {}), **sent}
        return copy.deepcopy(self.services[name])

    def _delete_service(self, name: str, namespace: str, body: k8s.V1DeleteOptions | None = None,
                        **_: object) -> None:
        service = self.services.pop(name, None)
        if service is None:
            raise api_exception(404, "NotFound", f'services "{name}" not found')
        for pod_name, pod in list(self.pods.items()):  # the garbage collector: dependents of the deleted owner
            owners = pod.metadata.owner_references or []
            if any(ref.uid == service.metadata.uid for ref in owners) and pod_name not in self.terminating:
                self._terminate(pod_name)

    # -- events --------------------------------------------------------------------------------------------
    def _events(self, namespace: str, field_selector: str = "", **_: object) -> k8s.CoreV1EventList:
        """Field selectors `involvedObject.name=N[,involvedObject.uid=U]`; an event without a uid is the pod's
        that exists now (events of a deleted namesake carry its old uid)."""
        fields = dict(term.split("=", 1) for term in field_selector.split(",") if term)
        name, uid = fields.get("involvedObject.name", ""), fields.get("involvedObject.uid")
        current = self.pods[name].metadata.uid if name in self.pods else None
        return k8s.CoreV1EventList(items=[e for e in self.events.get(name, [])
                                          if uid is None or (e.involved_object.uid or current) == uid])

    def add_event(self, name: str, reason: str, message: str, count: int = 1, uid: str | None = None) -> None:
        """An event about pod `name`; `uid` for one about an earlier pod of that name (default: the current)."""
        when = dt.datetime(2026, 12, 3, 0, 0, len(self.events.get(name, [])), tzinfo=dt.UTC)
        self.events.setdefault(name, []).append(k8s.CoreV1Event(
            metadata=k8s.V1ObjectMeta(name=f"{name}.{len(self.events.get(name, []))}"), reason=reason,
            message=message, count=count, last_timestamp=when,
            involved_object=k8s.V1ObjectReference(kind="Pod", name=name, uid=uid)))

    # -- helpers for scripts and assertions ----------------------------------------------------------------
    def set(self, name: str, phase: str, exit_code: int | None = None, waiting: str | None = None,
            scheduled: bool = True) -> None:
        with_phase(self.pods[name], phase, exit_code, waiting, scheduled)

    def all_running(self) -> None:
        for name in self.pods:
            if name not in self.terminating:
                self.set(name, "Running")

    def undeleted(self) -> list[str]:
        """Pods nobody asked to delete: what would leak."""
        return sorted(name for name in self.pods if name not in self.terminating)

    def names(self, verb: str) -> list[str]:
        calls = getattr(self.core, verb).call_args_list
        def name(c: object) -> str:
            body = c.kwargs.get("body") if verb.startswith("create") else None
            if body is None:
                return c.kwargs["name"]
            return body["metadata"]["name"] if isinstance(body, dict) else body.metadata.name
        return [name(c) for c in calls]
