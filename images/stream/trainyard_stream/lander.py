"""The lander: labelled events from a stream become the pipeline's own daily partitions on the volume
(`<data.source>/<partition_key>=<day>/part-*.parquet` or `.csv`), the same files prepare reads, so the next
training run sees what the stream brought without anything being copied between systems.

An event is acknowledged only after the part file holding it has been renamed into place, so a lander killed
mid-partition loses nothing: its events are still pending and are re-read when it comes back (or taken over by
another replica). A redelivery after the file was written (killed between the rename and the acknowledgement)
would land an event twice: each part file carries the events' keys, and an event whose key a file of its day
already holds is dropped. The day is the event's arrival time at the broker (UTC). After each closed partition
file the pipeline's Airflow Asset event is registered (when the pipeline is scheduled on its data), so a
data-aware pipeline retrains.
"""

from __future__ import annotations

import datetime as dt
import io
import logging
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from trainyard_contract import atomic
from trainyard_contract.schema import PipelineConfig
from trainyard_stream.broker import Broker, Entry, Outage
from trainyard_stream.records import EventSchema, Refused, dead_letter, key_of

log = logging.getLogger("trainyard.stream")

KEY_COLUMN = "_trainyard_key"  # the events' keys in each landed file (prepare reads only the configured columns)
READ_COUNT = 1000
MARK_RETRY_SECONDS = 30

MarkAsset = Callable[[dict[str, Any]], object]


def day_of(entry: Entry) -> str:
    return dt.datetime.fromtimestamp(entry.arrived_ms / 1000, dt.UTC).date().isoformat()


class Lander:
    def __init__(self, config: PipelineConfig, broker: Broker, volume: Path, consumer: str, stop: threading.Event,
                 mark_asset: MarkAsset | None):
        assert config.stream is not None and config.stream.land is not None
        self.config, self.land, self.stream = config, config.stream.land, config.stream
        self.broker, self.consumer, self.stop, self.mark_asset = broker, consumer, stop, mark_asset
        self.dataset = volume / config.data.source
        self.schema = EventSchema(config, self.stream.key, labelled=True)
        self.names = config.data.source_columns()  # served name -> the files' column name
        # an event is held (unacknowledged) until its partition closes: only one held much longer is a dead
        # consumer's, so claiming waits for twice the longest a partition stays open
        self.claim_idle_ms = max(self.stream.claim_idle_ms, int(self.land.max_seconds * 2000) + 60_000)
        self.broker_call = Outage(f"the broker {self.stream.broker}", stop).call
        self.held: dict[str, list[tuple[Entry, dict[str, Any], str]]] = {}  # day -> (entry, values, key)
        self.held_ids: set[str] = set()
        self.opened: float | None = None
        self.landed_keys: dict[str, set[str]] = {}
        self.unmarked: list[dict[str, Any]] = []  # closed partitions whose asset event is not registered yet
        self.next_mark = 0.0
        self.next_claim = 0.0
        self.files = 0

    @property
    def held_count(self) -> int:
        return len(self.held_ids)

    def run(self) -> int:
        source, group = self.land.source, self.land.group
        self.broker_call(lambda: self.broker.ensure_group(source, group))
        log.info("landing %s into %s (%s, group %s, consumer %s)", source, self.dataset, self.config.data.format,
                 group, self.consumer)
        after = "0"
        while not self.stop.is_set():  # first what this consumer held before it was stopped
            own = self.broker_call(lambda a=after: self.broker.read_own_pending(
                source, group, self.consumer, READ_COUNT, a))
            if not own:
                break
            self.take(own)
            after = own[-1].id
            self.close_if_due()
        while not self.stop.is_set():
            self.take(self.next_entries())
            self.close_if_due()
            if self.unmarked and time.monotonic() >= self.next_mark:
                self.retry_marks()
        self.close()  # SIGTERM: land what is held rather than leave it for a redelivery
        return self.files

    def next_entries(self) -> list[Entry]:
        source, group = self.land.source, self.land.group
        room = max(1, min(READ_COUNT, self.land.max_rows - self.held_count))
        if time.monotonic() >= self.next_claim:
            self.next_claim = time.monotonic() + self.claim_idle_ms / 2000
            claimed = self.broker_call(lambda: self.broker.claim_idle(source, group, self.consumer,
                                                                      self.claim_idle_ms, room))
            claimed = [entry for entry in claimed if entry.id not in self.held_ids]
            if claimed:
                return claimed
        wait_ms = 500 if self.opened is None else max(1, min(500, int(self.seconds_left() * 1000)))
        return self.broker_call(lambda: self.broker.read_new(source, group, self.consumer, room, wait_ms))

    def seconds_left(self) -> float:
        return self.land.max_seconds - (time.monotonic() - (self.opened or time.monotonic()))

    def take(self, entries: list[Entry]) -> None:
        """Hold the good events until their partition closes; dead-letter the rest now."""
        dead = []
        for entry in entries:
            if entry.id in self.held_ids:
                continue
            try:
                event = self.schema.parse(entry.fields)
            except Refused as exc:
                dead.append((entry, dead_letter(self.land.dead_letter, self.land.source, entry.id, entry.fields,
                                                key_of(entry.fields, self.stream.key), str(exc))))
                continue
            self.held.setdefault(day_of(entry), []).append((entry, event.values, event.key))
            self.held_ids.add(entry.id)
            if self.opened is None:
                self.opened = time.monotonic()
        if dead:
            outputs = [output for _, output in dead]
            ids = [entry.id for entry, _ in dead]
            self.broker_call(lambda: self.broker.write_and_ack(outputs, self.land.source, self.land.group, ids))
            log.info("dead-lettered %d event(s): %s", len(dead), outputs[0][1]["reason"])

    def close_if_due(self) -> None:
        if self.held_count >= self.land.max_rows or (self.opened is not None and self.seconds_left() <= 0):
            self.close()

    def close(self) -> None:
        """Write one part file per day held, then acknowledge its events, then register the asset event."""
        for day in sorted(self.held):
            items = self.held[day]
            landed = self.keys_landed(day)
            fresh: dict[str, dict[str, Any]] = {}
            first_fresh = ""
            for entry, values, key in items:
                if key not in landed and key not in fresh:
                    fresh[key] = values
                    first_fresh = first_fresh or entry.id
            path = None
            if fresh:
                # named after its first new event: an id no earlier file holds (its key is in none), so a restart
                # that re-reads a landed batch never writes over the file that landed it
                path = self.write_part(day, first_fresh, fresh)
                landed.update(fresh)
            ids = [entry.id for entry, _, _ in items]
            self.broker_call(lambda i=ids: self.broker.ack(self.land.source, self.land.group, i))
            dropped = len(items) - len(fresh)
            log.info("landed %d event(s) for %s%s%s", len(fresh), day, f" in {path.name}" if path else "",
                     f"; {dropped} duplicate(s) by key dropped" if dropped else "")
            if path is not None:
                self.unmarked.append({"source": "trainyard stream land", "partition": day, "file": path.name,
                                      "rows": len(fresh)})
        self.held.clear()
        self.held_ids.clear()
        self.opened = None
        self.retry_marks()

    def write_part(self, day: str, first_id: str, rows: dict[str, dict[str, Any]]) -> Path:
        folder = self.dataset / f"{self.config.data.partition_key}={day}"
        suffix = self.config.data.format
        path = folder / f"part-{first_id}-{self.consumer}.{suffix}"
        copy = 0
        while path.exists():  # the same events landed under another key set: never replace a landed file
            copy += 1
            path = folder / f"part-{first_id}-{self.consumer}-{copy}.{suffix}"
        columns: dict[str, list[Any]] = {self.names.get(name, name): [row[name] for row in rows.values()]
                                         for name in next(iter(rows.values()))}
        columns[KEY_COLUMN] = list(rows)
        atomic.write_bytes(path, encode(columns, self.dtypes(), suffix))
        self.files += 1
        return path

    def dtypes(self) -> dict[str, str]:
        """Each file column's stored type: what prepare expects of the batch-ingested files."""
        types = {self.names.get(f.name, f.name): ("float" if f.dtype == "int" and f.nullable else f.dtype)
                 for f in self.config.data.columns()}
        label = self.config.data.label
        types[self.names.get(label.name, label.name)] = label.dtype
        types[KEY_COLUMN] = "string"
        return types

    def keys_landed(self, day: str) -> set[str]:
        """The keys the day's part files already hold (read once per day, then kept up to date)."""
        if day not in self.landed_keys:
            for old in sorted(self.landed_keys)[:-2]:
                del self.landed_keys[old]  # only the last days can receive redeliveries
            self.landed_keys[day] = read_keys(self.dataset / f"{self.config.data.partition_key}={day}",
                                              self.config.data.format)
        return self.landed_keys[day]

    def retry_marks(self) -> None:
        """Register the asset events of closed partitions; an api-server that does not answer is retried after
        MARK_RETRY_SECONDS and after the next partition (the files are in place whatever happens here)."""
        if self.mark_asset is None:
            self.unmarked.clear()
            return
        while self.unmarked:
            try:
                self.mark_asset(self.unmarked[0])
            except Exception as exc:  # the REST client raises URLError, ApiError, LookupError alike
                self.next_mark = time.monotonic() + MARK_RETRY_SECONDS
                log.warning("could not register the asset event for %s (retried in %d s, and after the next "
                            "partition): %s", self.unmarked[0]["partition"], MARK_RETRY_SECONDS, exc)
                return
            log.info("registered the asset event for %s", self.unmarked[0]["partition"])
            self.unmarked.pop(0)


def encode(columns: dict[str, list[Any]], types: dict[str, str], fmt: str) -> bytes:
    import pyarrow as pa

    arrow_types = {"float": pa.float64(), "int": pa.int64(), "string": pa.string()}
    table = pa.table({name: pa.array(values, type=arrow_types[types[name]]) for name, values in columns.items()})
    sink = io.BytesIO()
    if fmt == "parquet":
        import pyarrow.parquet as pq

        pq.write_table(table, sink)
    else:
        import pyarrow.csv as pcsv

        pcsv.write_csv(table, sink, pcsv.WriteOptions(quoting_style="needed"))  # prepare splits the header on ","
    return sink.getvalue()


def read_keys(folder: Path, fmt: str) -> set[str]:
    import pyarrow.csv as pcsv
    import pyarrow.parquet as pq

    keys: set[str] = set()
    for path in sorted(folder.glob(f"*.{fmt}")) if folder.is_dir() else []:
        if fmt == "parquet":
            if KEY_COLUMN not in pq.read_schema(path).names:
                continue
            column = pq.read_table(path, columns=[KEY_COLUMN]).column(KEY_COLUMN)
        else:
            header = path.open(encoding="utf-8").readline()
            if KEY_COLUMN not in header:
                continue
            column = pcsv.read_csv(path, convert_options=pcsv.ConvertOptions(
                include_columns=[KEY_COLUMN], column_types={KEY_COLUMN: "string"})).column(KEY_COLUMN)
        keys.update(str(k) for k in column.to_pylist())
    return keys
