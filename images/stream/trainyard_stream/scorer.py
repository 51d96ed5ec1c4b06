"""The stream scorer: events from the source stream, scored in micro-batches through the served model, one result
per event on the sink stream, and the events it cannot score on the dead-letter stream with the reason.

Delivery is at-least-once: a batch's results, its dead letters and the acknowledgement of its events are one broker
transaction, written only after the model answered. A scorer that dies leaves its events pending in the group: it
re-reads them itself when it comes back (same consumer name), and another replica takes them over after
`claim_idle_ms` (XAUTOCLAIM). Serving being down or a version not yet loaded is waited out with backoff, never
dead-lettered; SIGTERM stops reading and lets the batches in hand finish.

While the server scores one micro-batch, the batch before is written and the next one read and checked: the
broker's round trips overlap the model's, with a single Predict in flight (results follow a deploy in event order)
and memory for three micro-batches, whatever the backlog.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import orjson

from trainyard_contract.schema import PipelineConfig
from trainyard_stream.broker import Broker, Entry, Outage, Stopped
from trainyard_stream.records import EVENT_FIELD, Event, EventSchema, Refused, dead_letter, key_of
from trainyard_stream.serving_client import Answer, ModelRefused, Pending, ServingClient, ServingUnavailable

log = logging.getLogger("trainyard.stream")

Output = tuple[str, dict[str, str]]


@dataclass
class Checked:
    """A batch read and checked: its ids, the events the model will see, and dead letters already decided."""

    ids: list[str]
    good: list[tuple[Entry, Event]]
    dead: list[Output]


@dataclass
class Answered:
    """A batch ready to write: every output (results and dead letters) and the ids to acknowledge with them."""

    ids: list[str]
    outputs: list[Output]
    dead: int


@dataclass
class Counters:
    scored: int = 0
    dead: int = 0
    versions: set[int] = field(default_factory=set)


class Scorer:
    def __init__(self, config: PipelineConfig, broker: Broker, client: ServingClient, consumer: str,
                 stop: threading.Event):
        assert config.stream is not None
        self.stream = config.stream
        self.model = config.model_name
        self.broker, self.client, self.consumer, self.stop = broker, client, consumer, stop
        self.schema = EventSchema(config, self.stream.key, labelled=False)
        self.broker_call = Outage(f"the broker {self.stream.broker}", stop).call
        self.serving_outage = Outage(f"the served model {self.model!r} at {client.endpoint}", stop)
        self.counters = Counters()
        self.next_claim = 0.0
        self.in_hand: set[str] = set()  # ids read and not yet written: never claimed back from ourselves

    def run(self) -> Counters:
        """Until SIGTERM: first what this consumer held before a restart, then reclaimed and new events."""
        self.broker.ensure_group(self.stream.source, self.stream.group)
        log.info("scoring %s -> %s (dead letters %s) with %r, group %s, consumer %s", self.stream.source,
                 self.stream.sink, self.stream.dead_letter, self.model, self.stream.group, self.consumer)
        after = "0"
        while not self.stop.is_set():
            own = self.broker_call(lambda a=after: self.broker.read_own_pending(
                self.stream.source, self.stream.group, self.consumer, self.stream.batch.max_records, a))
            if not own:
                break
            self.write(self.answer(self.check(own)))
            after = own[-1].id
        self.pipeline()
        log.info("stopped: scored %d, dead-lettered %d", self.counters.scored, self.counters.dead)
        return self.counters

    def next_batch(self, block_ms: int = 500) -> list[Entry]:
        """Events a dead consumer held (checked every half claim interval), else new ones: up to `max_records`,
        waiting at most `max_wait_ms` after the first for the batch to fill."""
        limits, source, group = self.stream.batch, self.stream.source, self.stream.group
        if time.monotonic() >= self.next_claim:
            self.next_claim = time.monotonic() + self.stream.claim_idle_ms / 2000
            claimed = self.broker_call(lambda: self.broker.claim_idle(
                source, group, self.consumer, self.stream.claim_idle_ms, limits.max_records))
            # a long serving outage leaves our own batches idle as long: those are in hand, not a dead consumer's
            claimed = [entry for entry in claimed if entry.id not in self.in_hand]
            if claimed:
                log.info("reclaimed %d event(s) a stopped consumer held", len(claimed))
                return claimed
        batch = self.broker_call(lambda: self.broker.read_new(source, group, self.consumer, limits.max_records,
                                                              block_ms))
        deadline = time.monotonic() + limits.max_wait_ms / 1000
        while batch and len(batch) < limits.max_records:
            left_ms = int((deadline - time.monotonic()) * 1000)
            if left_ms <= 0:
                break
            room = limits.max_records - len(batch)
            more = self.broker_call(lambda w=left_ms, n=room: self.broker.read_new(source, group, self.consumer, n,
                                                                                  w))
            if not more:
                break
            batch.extend(more)
        return batch

    def pipeline(self) -> None:
        """Until SIGTERM, then drain what is in hand: while the server scores one batch, the batch before is
        written and the next one read and checked, so the broker's round trips overlap the model's. One Predict
        is in flight at a time (results follow a deploy in event order), in one thread (no GIL hand-offs)."""
        in_flight: tuple[Checked, Pending | None] | None = None
        answered: Answered | None = None
        last_report = time.monotonic()
        while in_flight is not None or not self.stop.is_set():
            if answered is not None:
                self.write(answered)
                answered = None
            upcoming = None
            if not self.stop.is_set():
                batch = self.next_batch(block_ms=0 if in_flight else 500)
                upcoming = self.check(batch) if batch else None
            if in_flight is not None:
                answered = self.answer(*in_flight)
            in_flight = None
            if upcoming is not None:
                in_flight = (upcoming, self.submit(upcoming))
            if time.monotonic() - last_report > 60:
                last_report = time.monotonic()
                log.info("scored %d, dead-lettered %d, versions %s", self.counters.scored, self.counters.dead,
                         sorted(self.counters.versions))
        if answered is not None:
            self.write(answered)

    def submit(self, checked: Checked) -> Pending | None:
        """Start scoring the batch's good events; None when there are none, or serving cannot take it now (then
        `answer` scores it with retries)."""
        if not checked.good:
            return None
        try:
            return self.client.submit([event.values for _, event in checked.good])
        except ServingUnavailable:
            return None

    def check(self, batch: Sequence[Entry]) -> Checked:
        checked = Checked([entry.id for entry in batch], [], [])
        self.in_hand.update(checked.ids)
        for entry in batch:
            try:
                checked.good.append((entry, self.schema.parse(entry.fields)))
            except Refused as exc:
                checked.dead.append(dead_letter(self.stream.dead_letter, self.stream.source, entry.id,
                                                entry.fields, key_of(entry.fields, self.stream.key), str(exc)))
        return checked

    def answer(self, checked: Checked, pending: Pending | None = None) -> Answered:
        results = None
        if pending is not None:
            try:
                results = self.results(checked.good, self.client.collect(pending))
            except (ServingUnavailable, ModelRefused):
                results = None  # scored again below, with backoff or split until the refused event is alone
        if results is None:
            results = self.score(checked.good)
        dead = len(checked.dead) + sum(1 for target, _ in results if target == self.stream.dead_letter)
        return Answered(checked.ids, checked.dead + results, dead)

    def write(self, answered: Answered) -> None:
        """The batch's results and dead letters, and its acknowledgement, in one transaction."""
        self.broker_call(lambda: self.broker.write_and_ack(answered.outputs, self.stream.source,
                                                           self.stream.group, answered.ids))
        self.in_hand.difference_update(answered.ids)
        self.counters.dead += answered.dead
        self.counters.scored += len(answered.ids) - answered.dead

    def score(self, good: Sequence[tuple[Entry, Event]]) -> list[Output]:
        """Results for `good`; a batch the model refuses is split until the refused events are found alone."""
        if not good:
            return []
        while True:
            try:
                answer = self.client.predict([event.values for _, event in good])
                break
            except ServingUnavailable as exc:
                if self.stop.is_set():
                    raise Stopped() from None
                self.serving_outage.failed(exc)
            except ModelRefused as exc:
                self.serving_outage.succeeded()
                if len(good) == 1:
                    entry, event = good[0]
                    return [dead_letter(self.stream.dead_letter, self.stream.source, entry.id, entry.fields,
                                        event.key, f"the model refused it: {exc}")]
                middle = len(good) // 2
                return self.score(good[:middle]) + self.score(good[middle:])
        self.serving_outage.succeeded()
        return self.results(good, answer)

    def results(self, good: Sequence[tuple[Entry, Event]], answer: Answer) -> list[Output]:
        self.counters.versions.add(answer.version)
        now_ms = time.time() * 1000
        results = []
        for (entry, event), row in zip(good, answer.rows, strict=True):
            record = {self.stream.key: event.key, "model": self.model, "version": answer.version, **row,
                      "latency_ms": round(now_ms - entry.arrived_ms, 3), "source_id": entry.id}
            results.append((self.stream.sink, {"key": event.key, EVENT_FIELD: orjson.dumps(record).decode()}))
        return results
