"""An autospec'd `CoreV1Api` whose pod calls act on an in-memory pod store, so the real job code runs against it.

Each `list_namespaced_pod` is one poll of the watch loop; a test scripts what the cluster does before each poll.
Everything else is asserted on the mock's recorded calls (verb, namespace, body).
"""

from __future__ import annotations

import copy
import json
from collections.abc import Callable
from unittest.mock import create_autospec

from kubernetes.client import ApiClient, CoreV1Api
from kubernetes.client import models as k8s
from kubernetes.client.exceptions import ApiException

from trainyard_contract.runtime import RESULT_MARKER


def with_phase(pod: k8s.V1Pod, phase: str, exit_code: int | None = None, waiting: str | None = None) -> None:
    container = pod.spec.containers[0].name
    state = k8s.V1ContainerState()
    if exit_code is not None:
        state.terminated = k8s.V1ContainerStateTerminated(exit_code=exit_code)
    elif waiting is not None:
        message = "Back-off pulling image" if waiting == "ImagePullBackOff" else None
        state.waiting = k8s.V1ContainerStateWaiting(reason=waiting, message=message)
    else:
        state.running = k8s.V1ContainerStateRunning()
    pod.status = k8s.V1PodStatus(phase=phase, container_statuses=[k8s.V1ContainerStatus(
        name=container, image=pod.spec.containers[0].image, image_id="", ready=phase == "Running", restart_count=0,
        state=state)])


def result_log(payload: dict) -> str:
    return f"2026-12-03 step 300 loss 0.1\n{RESULT_MARKER}{json.dumps(payload)}\ntraining finished\n"


class FakeStream:
    def __init__(self, text: str):
        self.text = text

    def stream(self):
        yield self.text.encode()


class FakeCluster:
    def __init__(self) -> None:
        self.core = create_autospec(CoreV1Api, instance=True)
        self.core.api_client = ApiClient()  # the real serializer (KPO sends sanitized dicts); no connection
        self.pods: dict[str, k8s.V1Pod] = {}
        self.logs: dict[str, str] = {}
        self.script: list[Callable[[FakeCluster], None]] = []
        self.polls = 0
        self.core.create_namespaced_pod.side_effect = self._create
        self.core.list_namespaced_pod.side_effect = self._list
        self.core.delete_namespaced_pod.side_effect = self._delete
        self.core.read_namespaced_pod_log.side_effect = self._log
        self.core.create_namespaced_service.return_value = None
        self.core.delete_namespaced_service.return_value = None

    def _create(self, namespace: str, body: k8s.V1Pod | dict, **_: object) -> k8s.V1Pod:
        if isinstance(body, dict):
            body = self.core.api_client._ApiClient__deserialize(body, "V1Pod")
        if body.metadata.name in self.pods:
            raise ApiException(status=409, reason="AlreadyExists")
        pod = copy.deepcopy(body)
        with_phase(pod, "Pending", waiting="ContainerCreating")
        self.pods[pod.metadata.name] = pod
        return pod

    def _list(self, namespace: str, label_selector: str, **_: object) -> k8s.V1PodList:
        self.polls += 1
        if self.script:
            self.script.pop(0)(self)
        return k8s.V1PodList(items=[copy.deepcopy(p) for p in self.pods.values()])

    def _delete(self, name: str, namespace: str, body: k8s.V1DeleteOptions | None = None, **_: object) -> None:
        if name not in self.pods:
            raise ApiException(status=404, reason="NotFound")
        del self.pods[name]

    def _log(self, name: str, namespace: str, container: str | None = None, follow: bool = False,
             _preload_content: bool = True, tail_lines: int | None = None, **_: object) -> object:
        text = self.logs.get(name, f"{name} log line\n")
        return FakeStream(text) if follow else text

    # helpers for scripts
    def set(self, name: str, phase: str, exit_code: int | None = None, waiting: str | None = None) -> None:
        with_phase(self.pods[name], phase, exit_code, waiting)

    def all_running(self) -> None:
        for name in self.pods:
            self.set(name, "Running")

    def names(self, verb: str) -> list[str]:
        calls = getattr(self.core, verb).call_args_list
        return [c.kwargs["body"].metadata.name if "body" in c.kwargs and verb.startswith("create")
                else c.kwargs["name"] for c in calls]
