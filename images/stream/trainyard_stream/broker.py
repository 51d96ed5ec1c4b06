"""The small broker interface the scorer and the lander use, and its Redis Streams implementation.

What both need from a broker is the same five things: a consumer group that survives restarts, reading new entries,
re-reading this consumer's own unacknowledged entries after a restart, taking over entries a dead consumer held
(XAUTOCLAIM), and writing outputs together with the acknowledgement of their inputs, so an input is acknowledged
only once its output exists (at-least-once). Redis runs that last step as one script, which it runs atomically.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol, TypeVar

import orjson
import redis

log = logging.getLogger("trainyard.stream")

T = TypeVar("T")


@dataclass(frozen=True)
class Entry:
    """One stream entry: its id (`<ms>-<seq>`, the broker's arrival time in ms first) and its fields."""

    id: str
    fields: dict[str, str]

    @property
    def arrived_ms(self) -> int:
        return int(self.id.split("-", 1)[0])


class BrokerDown(ConnectionError):
    """The broker cannot be reached (refused, reset, timed out)."""


class Broker(Protocol):
    def ensure_group(self, stream: str, group: str) -> None: ...

    def read_new(self, stream: str, group: str, consumer: str, count: int, block_ms: int) -> list[Entry]: ...

    def read_own_pending(self, stream: str, group: str, consumer: str, count: int,
                         after: str = "0") -> list[Entry]: ...

    def claim_idle(self, stream: str, group: str, consumer: str, min_idle_ms: int, count: int) -> list[Entry]: ...

    def write_and_ack(self, outputs: Sequence[tuple[str, dict[str, str]]], stream: str, group: str,
                      ids: Sequence[str]) -> None: ...


# Outputs and acknowledgements in one atomic step, run inside Redis: the outputs travel as one JSON argument, so a
# batch costs one command to encode rather than one per output (redis-py's encoding of a 64-XADD MULTI was most of
# the scorer's CPU). KEYS: the input stream, then every stream written; ARGV: the group, the outputs as
# [[key index, [field, value, ...]], ...], the ids to acknowledge.
# Redis does not roll a script back when a command in it fails, so everything that could fail is checked before the
# first write: each output key is a stream (or absent) and the group exists.
WRITE_AND_ACK = """
for i = 2, #KEYS do
  local kind = redis.call('TYPE', KEYS[i]).ok
  if kind ~= 'stream' and kind ~= 'none' then
    return redis.error_reply('WRONGTYPE ' .. KEYS[i] .. ' holds a ' .. kind .. ', not a stream')
  end
end
local found = false
if redis.call('EXISTS', KEYS[1]) == 1 then
  for _, group in ipairs(redis.call('XINFO', 'GROUPS', KEYS[1])) do
    if group[2] == ARGV[1] then found = true end
  end
end
if not found then
  return redis.error_reply('NOGROUP no group ' .. ARGV[1] .. ' on ' .. KEYS[1])
end
local outputs = cjson.decode(ARGV[2])
for _, output in ipairs(outputs) do
  redis.call('XADD', KEYS[output[1]], '*', unpack(output[2]))
end
local ids = cjson.decode(ARGV[3])
for first = 1, #ids, 1000 do
  redis.call('XACK', KEYS[1], ARGV[1], unpack(ids, first, math.min(first + 999, #ids)))
end
return #outputs
"""


class RedisBroker:
    """Redis Streams through redis-py. Every call raises BrokerDown when the server cannot be reached."""

    def __init__(self, url: str, password: str | None = None, timeout: float = 10.0):
        self.url = url
        self.client = redis.Redis.from_url(url, password=password, decode_responses=True,
                                           socket_connect_timeout=timeout, socket_timeout=timeout + 60,
                                           health_check_interval=30)
        self.write_script = self.client.register_script(WRITE_AND_ACK)

    def call(self, operation: Callable[[], T]) -> T:
        try:
            return operation()
        except (redis.ConnectionError, redis.TimeoutError) as exc:
            raise BrokerDown(f"{self.url}: {exc}") from None

    def ping(self) -> None:
        self.call(self.client.ping)

    def ensure_group(self, stream: str, group: str) -> None:
        """Create the group at the stream's start (MKSTREAM), so events produced before the first consumer are
        scored too; an existing group keeps its position."""
        try:
            self.call(lambda: self.client.xgroup_create(stream, group, id="0", mkstream=True))
        except redis.ResponseError as exc:
            if "BUSYGROUP" not in str(exc):
                raise

    def grouped(self, stream: str, group: str, operation: Callable[[], T]) -> T:
        """`operation()` on the group; a Redis restarted without persistence has lost the group (NOGROUP): it is
        created again, at the stream's start, and the operation retried once."""
        try:
            return self.call(operation)
        except redis.ResponseError as exc:
            if "NOGROUP" not in str(exc):
                raise
        log.warning("the group %s of %s was gone (the broker restarted without its data?): created again", group,
                    stream)
        self.ensure_group(stream, group)
        return self.call(operation)

    def read_new(self, stream: str, group: str, consumer: str, count: int, block_ms: int) -> list[Entry]:
        answer = self.grouped(stream, group, lambda: self.client.xreadgroup(
            group, consumer, {stream: ">"}, count=count, block=block_ms or None))
        return entries(answer)

    def read_own_pending(self, stream: str, group: str, consumer: str, count: int, after: str = "0") -> list[Entry]:
        """What this consumer (same name) was given before a restart and never acknowledged, after id `after`."""
        answer = self.grouped(stream, group, lambda: self.client.xreadgroup(group, consumer, {stream: after},
                                                                           count=count))
        return entries(answer)

    def claim_idle(self, stream: str, group: str, consumer: str, min_idle_ms: int, count: int) -> list[Entry]:
        """Entries another consumer has held for `min_idle_ms` without acknowledging them (it died)."""
        answer = self.grouped(stream, group, lambda: self.client.xautoclaim(stream, group, consumer, min_idle_ms,
                                                                           "0-0", count=count))
        claimed = answer[1] if len(answer) > 1 else []
        return [Entry(id, dict(fields)) for id, fields in claimed if fields is not None]

    def write_and_ack(self, outputs: Sequence[tuple[str, dict[str, str]]], stream: str, group: str,
                      ids: Sequence[str]) -> None:
        """XADD every output and XACK the inputs in one script, which Redis runs atomically: all of it, or none."""
        keys = [stream]
        index = {stream: 1}
        packed = []
        for target, fields in outputs:
            if target not in index:
                keys.append(target)
                index[target] = len(keys)
            packed.append([index[target], [part for pair in fields.items() for part in pair]])
        self.grouped(stream, group, lambda: self.write_script(
            keys=keys, args=[group, orjson.dumps(packed), orjson.dumps(list(ids))]))

    def ack(self, stream: str, group: str, ids: Sequence[str]) -> None:
        if ids:
            self.call(lambda: self.client.xack(stream, group, *ids))

    def add(self, stream: str, fields: dict[str, str]) -> str:
        return self.call(lambda: self.client.xadd(stream, fields))


def entries(answer: object) -> list[Entry]:
    """XREADGROUP's answer (a list of [stream, [[id, fields], ...]]) as entries; a deleted entry (fields None,
    still pending) is skipped."""
    found: list[Entry] = []
    for _stream, items in answer or []:  # type: ignore[union-attr]
        found.extend(Entry(id, fields) for id, fields in items if fields)  # redis-py already made each a dict
    return found


def consumer_name(role: str) -> str:
    """A stable consumer name per pod (its hostname): a restarted pod first re-reads what it held. Locally the
    host is one machine, so TRAINYARD_CONSUMER can tell replicas apart."""
    return os.environ.get("TRAINYARD_CONSUMER") or f"{role}-{os.uname().nodename}"


class Stopped(Exception):
    """SIGTERM came while the batch in hand could not finish (broker or serving down): it stays pending,
    unacknowledged, for this consumer's restart or another replica."""


class Outage:
    """Broker (or server) lost mid-run: logged once when it starts and once when it ends, with a capped
    exponential backoff between tries that SIGTERM (`stop`) cuts short."""

    def __init__(self, what: str, stop: threading.Event, first: float = 0.2, cap: float = 5.0):
        self.what, self.stop, self.first, self.cap = what, stop, first, cap
        self.since: float | None = None
        self.delay = first

    def call(self, operation: Callable[[], T]) -> T:
        """`operation()`, retried while it raises BrokerDown; Stopped once SIGTERM came."""
        while True:
            try:
                answer = operation()
            except BrokerDown as exc:
                if self.stop.is_set():
                    raise Stopped() from None
                self.failed(exc)
                continue
            self.succeeded()
            return answer

    def failed(self, reason: object) -> None:
        if self.since is None:
            self.since = time.monotonic()
            log.warning("%s unavailable (%s): retrying with backoff until it is back", self.what, reason)
        self.stop.wait(self.delay)
        self.delay = min(self.cap, self.delay * 2)

    def succeeded(self) -> None:
        if self.since is not None:
            log.warning("%s is back after %.1f s", self.what, time.monotonic() - self.since)
        self.since, self.delay = None, self.first
