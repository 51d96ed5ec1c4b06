"""The stream scorer against a real redis-server and the real local serving process, side by side in one run.

Prints, as ratios measured in the same run:
1. events/s through the scorer (a backlog drained: JSON decode, checks, Predict, results and acknowledgements in
   one transaction) vs the same micro-batches sent straight to gRPC Predict from this process (tensors built the
   same way). Target: >= 0.8x.
2. p50/p99 event-to-result latency (the result entry's broker time minus the event's) with events produced at half
   the scorer's measured maximum rate.
3. the scorer's peak RSS while it works through a 1,000,000-event backlog vs while it works through 10,000 events
   (memory is one micro-batch, whatever the backlog). Target: <= 1.1x.

    .venv/bin/python bench/stream_bench.py [--events 20000] [--backlog 1000000]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import numpy as np  # noqa: E402

from tests.integration.serving_helpers import Server, export_tiny_model  # noqa: E402
from tests.integration.stream_helpers import RedisServer, produce, start, stop, stream_config  # noqa: E402
from trainyard_contract import layout  # noqa: E402
from trainyard_stream.serving_client import ServingClient  # noqa: E402

BATCH = 64


def export_mlp_model(target: Path, width: int) -> Path:
    """The tiny model's two float features (a, b) through two hidden layers of `width`, exported as the trainer
    exports: a model whose Predict costs what a production MLP's does, where the tiny one costs almost nothing."""
    import keras
    import tensorflow as tf

    from tests.integration.serving_helpers import SCHEMA
    from trainyard_trainer.export import ServingModule
    from trainyard_trainer.model_schema import ModelSchema

    inputs = {"numeric": keras.Input(shape=(2,), name="numeric")}
    hidden = keras.layers.Dense(width, activation="relu")(inputs["numeric"])
    hidden = keras.layers.Dense(width, activation="relu")(hidden)
    model = keras.Model(inputs, keras.layers.Dense(2)(hidden))
    module = ServingModule(model, ModelSchema.from_document(SCHEMA))
    tf.saved_model.save(module, str(target), signatures={"serving_default": module.serve})
    return target


def events(count: int, offset: int = 0) -> list[dict]:
    return [{"key": f"e{i}", "a": (i % 100) / 10, "b": 0.5} for i in range(offset, offset + count)]


def direct_rate(endpoint: str, count: int) -> float:
    """Events/s of the same micro-batches straight to Predict (what a hand-written client would do)."""
    client = ServingClient(endpoint, "tiny")
    rows = [{k: v for k, v in event.items() if k != "key"} for event in events(count)]
    client.predict(rows[:BATCH])  # describe the model and warm the channel
    started = time.perf_counter()
    for at in range(0, count, BATCH):
        client.predict(rows[at:at + BATCH])
    elapsed = time.perf_counter() - started
    client.close()
    return count / elapsed


def entry_ms(entry_id: str) -> int:
    return int(entry_id.split("-", 1)[0])


def drain(redis: RedisServer, endpoint: str, prefix: str, count: int, folder: Path,
          sample_rss: bool = False) -> tuple[float, float]:
    """Produce a backlog of `count`, start a scorer, time it from its first result to its last; (events/s,
    peak RSS in MiB)."""
    client = redis.client()
    for at in range(0, count, 50_000):
        produce(client, f"{prefix}:events", events(min(50_000, count - at), at), pipe_size=5000)
    config = stream_config(redis.url, prefix, batch={"max_records": BATCH, "max_wait_ms": 5})
    scorer = start(config, "score", folder / f"{prefix}.log", f"{prefix}-1", endpoint=endpoint)
    peak = 0.0
    first = None
    while True:
        done = client.xlen(f"{prefix}:results")
        if done and first is None:
            first = (time.perf_counter(), done)
        if sample_rss:
            peak = max(peak, rss_mib(scorer.pid))
        if done >= count:
            break
        time.sleep(0.05)
    elapsed = time.perf_counter() - first[0]
    stop(scorer)
    client.delete(f"{prefix}:events", f"{prefix}:results")
    return (count - first[1]) / elapsed, peak


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def latency_at(redis: RedisServer, endpoint: str, rate: float, seconds: float, folder: Path) -> list[float]:
    """Event-to-result latencies (ms) with events produced at `rate` per second for `seconds`."""
    client = redis.client()
    config = stream_config(redis.url, "lat", batch={"max_records": BATCH, "max_wait_ms": 5})
    scorer = start(config, "score", folder / "lat.log", "lat-1", endpoint=endpoint)
    total = int(rate * seconds)
    tick = 0.01
    per_tick = max(1, round(rate * tick))
    started = time.perf_counter()
    for at in range(0, total, per_tick):
        produce(client, "lat:events", events(min(per_tick, total - at), at))
        pause = started + (at + per_tick) / rate - time.perf_counter()
        if pause > 0:
            time.sleep(pause)
    while client.xlen("lat:results") < total:
        time.sleep(0.05)
    stop(scorer)
    return [entry_ms(id) - entry_ms(json.loads(fields["data"])["source_id"])
            for id, fields in client.xrange("lat:results")]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--events", type=int, default=20_000)
    parser.add_argument("--backlog", type=int, default=1_000_000)
    parser.add_argument("--latency-seconds", type=float, default=10.0)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--model", choices=["tiny", "mlp"], default="tiny",
                        help="tiny: a 2-feature logistic model (Predict costs almost nothing: the scorer's own "
                        "cost shows most); mlp: two hidden layers of 256")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as scratch:
        folder = Path(scratch)
        if args.model == "tiny":
            export_tiny_model(folder / layout.MODELS / "tiny" / "1")
        else:
            export_mlp_model(folder / layout.MODELS / "tiny" / "1", 256)
        redis = RedisServer(folder / "redis").start()
        server = Server(folder / layout.MODELS).start(folder / "serving.log")
        try:
            directs, scoreds = [], []
            for round_ in range(args.rounds):  # alternated, so both see the same noise of a shared machine
                directs.append(direct_rate(server.grpc, args.events))
                scoreds.append(drain(redis, server.grpc, f"rate{round_}", args.events, folder)[0])
            direct, scored = float(np.median(directs)), float(np.median(scoreds))
            print(f"throughput (median of {args.rounds} alternated rounds of {args.events:,} events, micro-batches of "
                  f"{BATCH}): scorer {scored:,.0f} events/s, straight to gRPC Predict {direct:,.0f} events/s: "
                  f"{scored / direct:.2f}x (target >= 0.8x); rounds: scorer "
                  f"{', '.join(f'{v:,.0f}' for v in scoreds)}; direct {', '.join(f'{v:,.0f}' for v in directs)}")
            latencies = latency_at(redis, server.grpc, scored / 2, args.latency_seconds, folder)
            p50, p99 = np.percentile(latencies, 50), np.percentile(latencies, 99)
            print(f"latency at {scored / 2:,.0f} events/s (half the maximum), {len(latencies):,} events: "
                  f"p50 {p50:.1f} ms, p99 {p99:.1f} ms (event to result, broker clock)")
            _, small = drain(redis, server.grpc, "small", 10_000, folder, sample_rss=True)
            _, large = drain(redis, server.grpc, "large", args.backlog, folder, sample_rss=True)
            print(f"scorer RSS: {large:.0f} MiB with a {args.backlog:,}-event backlog, {small:.0f} MiB with 10,000: "
                  f"{large / small:.2f}x (target <= 1.1x)")
        finally:
            server.stop()
            redis.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
