"""Talking to the Kubernetes API as it really answers: logs, events and errors a person can act on.

What the API returns is not always what the client's types promise. A pod not yet placed on a node answers
`GET .../log` with 204 and no body (the client returns None); a container that has not started answers 400; a
follow stream can drop mid-way; an overloaded API server answers 429 or 5xx. Every read here tolerates those, retries
the transient ones a bounded number of times with backoff (as the provider's `generic_api_retry` does), and turns
the rest into one short line. Errors are summarised from the Status object the server sends, never dumped whole.
"""

from __future__ import annotations

import codecs
import datetime as dt
import functools
import json
import logging
import re
import time
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from kubernetes.client import CoreV1Api
from kubernetes.client import models as k8s
from kubernetes.client.exceptions import ApiException

TRANSIENT_STATUSES = frozenset({429, 500, 502, 503, 504})
NOT_READY_STATUSES = frozenset({400, 404})  # container not started yet / pod gone: no log to read
RETRIES = 4
BACKOFF_SECONDS = 0.5
EVENT_LINES = 4


class ApiUnavailable(Exception):
    """The API server kept answering with a transient error after every retry."""


def api_error(exc: ApiException) -> str:
    """`403 Forbidden: exceeded quota: ...` from the Status body the server sent (not the whole response)."""
    message = ""
    try:
        body = json.loads(exc.body) if exc.body else {}
        message = body.get("message", "") if isinstance(body, dict) else ""
    except (TypeError, ValueError):
        message = str(exc.body)[:200] if exc.body else ""
    return ": ".join(part for part in (f"{exc.status} {exc.reason or ''}".strip(), message) if part)


def with_retries(call: Callable[[], Any], what: str, log: logging.Logger, *, retries: int = RETRIES,
                 sleep: Callable[[float], None] = time.sleep) -> Any:
    """`call()`, tried again on 429/5xx (exponential backoff); other API errors are raised as they are."""
    for attempt in range(retries + 1):
        try:
            return call()
        except ApiException as exc:
            if exc.status not in TRANSIENT_STATUSES:
                raise
            if attempt == retries:
                raise ApiUnavailable(f"{what}: the API server answered {api_error(exc)} {retries + 1} times") from exc
            delay = BACKOFF_SECONDS * 2**attempt
            log.warning("%s: %s; trying again in %.1fs", what, api_error(exc), delay)
            sleep(delay)
    raise AssertionError("unreachable")


def ignore_not_found(call: Callable[..., object], **kwargs: object) -> None:
    """`call(**kwargs)` where a 404 means done already (a delete of what is gone); any other error is raised."""
    try:
        call(**kwargs)
    except ApiException as exc:
        if exc.status != 404:
            raise


def as_lines(body: object) -> list[str]:
    """A log body as lines, whatever the client returned: None (204), an unread HTTP response, bytes, or text."""
    if body is None:
        return []
    data = getattr(body, "data", body)  # `_preload_content=False`: the urllib3 response; its bytes, as sent
    if isinstance(data, bytes):
        data = data.decode(errors="replace")
    return str(data).splitlines()


def read_raw_log(core: Any, **kwargs: Any) -> list[str]:
    """`read_namespaced_pod_log` as the server sent it, one line per line.

    The pinned client (kubernetes 36.x) deserialises a log as a `str` type and hands back the *repr of the bytes*
    (`"b'line\\nline'"`: one line, escapes and all), so a result line can never be parsed from it. Asking for the
    raw response (`_preload_content=False`) and decoding its bytes ourselves is right for every client version.
    """
    return as_lines(core.read_namespaced_pod_log(_preload_content=False, **kwargs))


def read_log_lines(core: CoreV1Api, name: str, namespace: str, container: str, log: logging.Logger, *,
                   tail_lines: int | None = None, sleep: Callable[[float], None] = time.sleep) -> list[str]:
    """A container's log lines; [] when there is none yet (204, 400, 404). Transient errors are retried, then
    raise ApiUnavailable."""
    def read() -> list[str]:
        kwargs: dict[str, Any] = {"name": name, "namespace": namespace, "container": container}
        if tail_lines is not None:
            kwargs["tail_lines"] = tail_lines
        return read_raw_log(core, **kwargs)

    try:
        return with_retries(read, f"reading the log of {name}", log, sleep=sleep)
    except ApiException as exc:
        if exc.status in NOT_READY_STATUSES:
            return []
        raise


def stream_lines(chunks: Iterable[bytes | str]) -> Iterator[str]:
    """Whole lines from a byte stream whose chunks may end mid-line or mid-character."""
    decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
    pending = ""
    for chunk in chunks:
        pending += decoder.decode(chunk) if isinstance(chunk, bytes) else chunk
        *complete, pending = pending.split("\n")
        yield from complete
    pending += decoder.decode(b"", final=True)
    if pending:
        yield pending


def split_timestamp(line: str) -> tuple[dt.datetime | None, str]:
    """`2026-12-03T10:00:00.123456789Z text` (the API's `timestamps=true`) -> (time, text)."""
    stamp, _, text = line.partition(" ")
    try:
        return dt.datetime.fromisoformat(stamp[:26].rstrip("Z") + "+00:00" if stamp.endswith("Z") else stamp), text
    except ValueError:
        return None, line


def follow_log(core: CoreV1Api, name: str, namespace: str, container: str, on_line: Callable[[str], None],
               log: logging.Logger, *, stopped: Callable[[], bool], reconnects: int = 20,
               clock: Callable[[], dt.datetime] = lambda: dt.datetime.now(dt.UTC),
               sleep: Callable[[float], None] = time.sleep) -> None:
    """Stream a container's log to `on_line`, resuming after a dropped stream from the last line's timestamp.

    Lines carry the API's timestamps so a reconnect (`since_seconds` back to the last one seen) can skip what was
    already delivered; `on_line` gets the text without them. Ends when a stream ends cleanly, when `stopped()`,
    or after `reconnects` dropped streams.
    """
    last: dt.datetime | None = None
    at_last: set[str] = set()  # the texts delivered with timestamp `last` (a resumed stream repeats them)
    for attempt in range(reconnects + 1):
        kwargs: dict[str, Any] = {"name": name, "namespace": namespace, "container": container, "follow": True,
                                  "timestamps": True, "_preload_content": False}
        if last is not None:
            kwargs["since_seconds"] = max(1, int((clock() - last).total_seconds()) + 1)
        try:
            response = with_retries(functools.partial(core.read_namespaced_pod_log, **kwargs), f"following {name}",
                                    log, sleep=sleep)
            if response is None:
                return
            for line in stream_lines(response.stream()):
                when, text = split_timestamp(line)
                if attempt and when is not None and last is not None and (
                        when < last or (when == last and text in at_last)):
                    continue  # delivered before the stream dropped
                if when is not None and when != last:
                    last, at_last = when, set()
                at_last.add(text)
                on_line(text)
            return
        except Exception as exc:  # a dropped stream surfaces as urllib3, socket or API errors alike
            if stopped():
                return
            detail = api_error(exc) if isinstance(exc, ApiException) else str(exc) or type(exc).__name__
            log.warning("log stream of %s dropped (%s); resuming (%d of %d)", name, detail, attempt + 1, reconnects)
            sleep(min(BACKOFF_SECONDS * 2**attempt, 5.0))
    log.warning("gave up following the log of %s after %d reconnects; its end is read when it finishes", name,
                reconnects)


def recent_events(core: CoreV1Api, namespace: str, name: str, log: logging.Logger,
                  limit: int = EVENT_LINES, uid: str | None = None) -> list[str]:
    """The last few events about object `name` (`FailedScheduling: 0/3 nodes are available: ...`); [] when they
    cannot be read (the events are a hint, never the reason a task fails). With `uid`, only this object's: a pod
    deleted earlier under the same name (a retry reuses replica names) left events of its own for an hour."""
    selector = f"involvedObject.name={name}" + (f",involvedObject.uid={uid}" if uid else "")
    try:
        events = core.list_namespaced_event(namespace=namespace, field_selector=selector).items
    except ApiException as exc:
        log.warning("could not read the events of %s: %s", name, api_error(exc))
        return []

    def when(event: k8s.CoreV1Event) -> str:
        stamp = event.last_timestamp or event.event_time or event.first_timestamp
        return stamp.isoformat() if stamp is not None else ""

    lines = []
    for event in sorted(events or [], key=when)[-limit:]:
        count = f" (x{event.count})" if event.count and event.count > 1 else ""
        lines.append(f"{event.reason}: {(event.message or '').strip()}{count}")
    return lines


def pending_reason(pod: k8s.V1Pod | None, events: Iterable[str] = ()) -> str:
    """Why a pod is not running, in a few lines: its waiting containers and false conditions (ImagePullBackOff,
    Unschedulable: 0/3 nodes ...), then the latest events. Never the whole object."""
    reasons: list[str] = []
    status = pod.status if pod is not None else None
    for container in (status.container_statuses or []) if status else []:
        waiting = container.state.waiting if container.state else None
        if waiting is not None and waiting.reason and waiting.reason != "ContainerCreating":
            reasons.append(f"{waiting.reason}: {waiting.message or ''}".rstrip(": "))
    for condition in (status.conditions or []) if status else []:
        if condition.status == "False" and condition.reason:
            reasons.append(f"{condition.reason}: {condition.message or ''}".rstrip(": "))
    said = {reason.partition(": ")[2] for reason in reasons}
    for event in events:
        message = re.sub(r" \(x\d+\)$", "", event.partition(": ")[2])
        if event not in reasons and message not in said:  # the scheduler's event repeats the condition's message
            reasons.append(event)
            said.add(message)
    return "; ".join(reasons) if reasons else "waiting to be scheduled (no events yet)"
