"""The stream scorer and lander against a real redis-server and the real local serving process: scoring through
a deploy, dead letters, outages waited out, SIGKILL during 10,000 events, and landing with a kill mid-partition."""

from __future__ import annotations

import datetime as dt
import json
import os
import signal
import subprocess
import sys
import threading
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.integration.serving_helpers import Server, export_tiny_model
from tests.integration.stream_helpers import (
    RedisServer,
    produce,
    read_all,
    start,
    stop,
    stream_config,
    stream_document,
    wait_until,
)
from trainyard_contract.runtime import CONFIG_ENV

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("models")
    export_tiny_model(root / "tiny" / "1")
    return root


@pytest.fixture
def serving(models: Path, tmp_path: Path) -> Iterator[Server]:
    server = Server(models).start(tmp_path / "serving.log")
    yield server
    server.stop()


def publish(models: Path, version: int, bias: float) -> None:
    """A new version as deploy publishes it: exported aside, then renamed into place."""
    staged = models / "tiny" / f".staged-{version}"
    export_tiny_model(staged, bias=bias)
    os.rename(staged, models / "tiny" / str(version))


def results_of(client, stream: str) -> list[dict]:  # noqa: ANN001
    return [json.loads(fields["data"]) for _, fields in read_all(client, stream)]


def softmax_first(logits: tuple[float, float]) -> float:
    import math

    return math.exp(logits[0]) / (math.exp(logits[0]) + math.exp(logits[1]))


def test_results_follow_a_deploy_and_none_is_lost(redis_server: RedisServer, serving: Server, models: Path,
                                                    tmp_path: Path) -> None:
    config = stream_config(redis_server.url, "deploy")
    client = redis_server.client()
    scorer = start(config, "score", tmp_path / "score.log", "deploy-1", endpoint=serving.grpc)
    total, swapped = 3000, threading.Event()

    def producer() -> None:  # a steady stream, the new version published a third of the way in
        for start_at in range(0, total, 100):
            produce(client, "deploy:events", [{"key": f"e{i}", "a": 0.3, "b": 0.1}
                                              for i in range(start_at, start_at + 100)])
            if start_at == 1000:
                publish(models, 2, bias=5.0)
                swapped.set()
            threading.Event().wait(0.02)

    thread = threading.Thread(target=producer)
    thread.start()
    try:
        wait_until("3000 results", lambda: client.xlen("deploy:results") >= total, 180)
    finally:
        thread.join()
        assert stop(scorer) == 0
    results = results_of(client, "deploy:results")
    assert len(results) == total and {r["key"] for r in results} == {f"e{i}" for i in range(total)}
    assert client.xlen("deploy:dead") == 0
    by_event = sorted(results, key=lambda r: tuple(int(p) for p in r["source_id"].split("-")))
    versions = [r["version"] for r in by_event]
    assert versions[0] == 1 and versions[-1] == 2
    assert versions == sorted(versions), "a result went back to version 1 after the swap"
    # the tiny model's weights (serving_helpers): logits (a - b + bias, b - a)
    first = {r["version"]: r["probabilities"][0] for r in results}
    assert first[1] == pytest.approx(softmax_first((0.2, -0.2)), abs=1e-5)
    assert first[2] == pytest.approx(softmax_first((5.2, -0.2)), abs=1e-5)
    assert all(r["model"] == "tiny" and r["latency_ms"] >= 0 and r["class_ids"] == 0 for r in results)
    pending = client.xpending("deploy:events", "trainyard-score")
    assert pending["pending"] == 0


def test_events_it_cannot_score_go_to_the_dead_letter_stream_with_the_reason(
        redis_server: RedisServer, serving: Server, tmp_path: Path) -> None:
    # `a` nullable in the config but not in the served model: a null `a` passes the scorer's checks and the model
    # refuses it (INVALID_ARGUMENT), inside a batch of good events that are scored all the same
    config = stream_config(redis_server.url, "bad", batch={"max_records": 64, "max_wait_ms": 200})
    document = json.loads(config.model_dump_json())
    document["data"]["features"][0]["nullable"] = True
    config = type(config).model_validate(document)
    client = redis_server.client()
    bad = {"not json": "{oops", "a list": json.dumps([1, 2]), "no key": json.dumps({"a": 1, "b": 2}),
           "missing": {"key": "m", "a": 1.0}, "text": {"key": "t", "a": 1.0, "b": "high"},
           "boolean": {"key": "bool", "a": True, "b": 1.0}, "refused": {"key": "nan", "a": None, "b": 1.0}}
    events: list = []
    for index, event in enumerate(bad.values()):
        events += [{"key": f"g{index}-{j}", "a": 0.1 * j, "b": 0.2} for j in range(5)] + [event]
    produce(client, "bad:events", events)
    scorer = start(config, "score", tmp_path / "score.log", "bad-1", endpoint=serving.grpc)
    try:
        wait_until("every event answered", lambda: client.xlen("bad:results") + client.xlen("bad:dead") >= len(events),
                   60)
        produce(client, "bad:events", [{"key": "after", "a": 0.5, "b": 0.5}])  # it goes on
        wait_until("the event after the bad ones", lambda: client.xlen("bad:results") == 36, 30)
    finally:
        assert stop(scorer) == 0
    dead = {fields["key"]: fields for _, fields in read_all(client, "bad:dead")}
    assert set(dead) == {"", "m", "t", "bool", "nan"} and client.xlen("bad:dead") == 7
    reasons = [fields["reason"] for _, fields in read_all(client, "bad:dead")]
    assert reasons[0].startswith("not JSON") and reasons[1] == "not a JSON object but list"
    assert "needs a 'key' field" in reasons[2]
    assert dead["m"]["reason"] == "feature 'b' is missing"
    assert dead["t"]["reason"].startswith("feature 'b' must be a number (float)")
    assert dead["bool"]["reason"].startswith("feature 'a' must be a number")
    assert dead["nan"]["reason"].startswith("the model refused it: INVALID_ARGUMENT")
    assert "input `a`" in dead["nan"]["reason"]
    assert dead["t"]["data"] == json.dumps(bad["text"]) and dead["t"]["source"] == "bad:events"
    scored = {r["key"] for r in results_of(client, "bad:results")}
    assert scored == {f"g{i}-{j}" for i in range(7) for j in range(5)} | {"after"}


def test_serving_and_broker_outages_are_waited_out_not_dead_lettered(models: Path, tmp_path: Path) -> None:
    broker = RedisServer(tmp_path / "redis", persist=True).start()
    serving = Server(models).start(tmp_path / "serving.log")
    config = stream_config(broker.url, "out")
    client = broker.client()
    log = tmp_path / "score.log"
    scorer = start(config, "score", log, "out-1", endpoint=serving.grpc)
    try:
        serving.stop()
        produce(client, "out:events", [{"key": f"s{i}", "a": 1.0, "b": 0.0} for i in range(20)])
        wait_until("the outage to be logged", lambda: "unavailable" in log.read_text(), 30)
        threading.Event().wait(2.0)
        assert client.xlen("out:results") == 0 and client.xlen("out:dead") == 0 and scorer.poll() is None
        serving = Server(models, grpc_port=serving.grpc_port).start(tmp_path / "serving2.log")
        wait_until("results after serving came back", lambda: client.xlen("out:results") == 20, 60)
        broker.restart()  # the broker lost mid-run (its data kept, as a persistent Redis keeps it)
        produce(client, "out:events", [{"key": f"r{i}", "a": 1.0, "b": 0.0} for i in range(20)])
        wait_until("results after the broker came back", lambda: client.xlen("out:results") == 40, 60)
    finally:
        code = stop(scorer)
        serving.stop()
        broker.stop()
    text = log.read_text()
    assert code == 0
    assert text.count("the served model 'tiny'") == 2  # "unavailable ..." and "is back": once per outage
    assert "is back after" in text


def test_a_broker_that_is_down_at_start_is_one_clear_line(tmp_path: Path) -> None:
    from tests.integration.serving_helpers import free_port

    config = stream_config(f"redis://127.0.0.1:{free_port()}/0", "down")
    done = subprocess.run([sys.executable, "-m", "trainyard_stream", "score", "--endpoint", "127.0.0.1:1"],
                          env={**os.environ, CONFIG_ENV: config.model_dump_json()}, capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 1
    assert "cannot reach the broker redis://127.0.0.1:" in done.stderr and "Traceback" not in done.stderr


def test_trainyard_stream_runs_the_scorer_in_the_background_and_stops_it(
        redis_server: RedisServer, serving: Server, tmp_path: Path) -> None:
    import yaml

    pipelines, volume = tmp_path / "pipelines", tmp_path / "volume"
    pipelines.mkdir()
    (pipelines / "tiny.yaml").write_text(yaml.safe_dump(stream_document(redis_server.url, "cli")))
    env = {**os.environ, "TRAINYARD_PIPELINES_DIR": str(pipelines), "TRAINYARD_DATA_DIR": str(volume),
           "TRAINYARD_SERVING_GRPC": serving.grpc, "AIRFLOW_HOME": str(tmp_path / "airflow")}

    def trainyard(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "trainyard.cli", "stream", "tiny", *args], env=env,
                              capture_output=True, text=True, timeout=180)

    started = trainyard("--background")
    assert started.returncode == 0, started.stderr
    assert "tiny score running (pid" in started.stdout
    again = trainyard("--background")
    assert again.returncode == 0 and "already running" in again.stdout
    client = redis_server.client()
    produce(client, "cli:events", [{"key": f"c{i}", "a": 1.0, "b": 2.0} for i in range(50)])
    wait_until("50 results", lambda: client.xlen("cli:results") == 50, 60)
    stopped = trainyard("--stop")
    assert stopped.returncode == 0 and "tiny score stopped (pid" in stopped.stdout
    assert "stopped: scored 50, dead-lettered 0" in (volume / "streams" / "tiny.score.log").read_text()
    assert "no stream process of tiny was running" in trainyard("--stop").stdout
    (pipelines / "tiny.yaml").write_text(yaml.safe_dump(stream_document("redis://127.0.0.1:1/0", "cli")))
    refused = trainyard("--background")
    assert refused.returncode == 1
    assert "cannot reach the broker redis://127.0.0.1:1/0" in refused.stderr, refused.stderr


def test_sigkill_during_10000_events_loses_none(redis_server: RedisServer, serving: Server, tmp_path: Path) -> None:
    """Two replicas; one is SIGKILLed mid-stream. Its unacknowledged events are claimed by the other after
    claim_idle_ms: every event ends as a result or a dead letter, and duplicates are counted."""
    config = stream_config(redis_server.url, "kill", claim_idle_ms=1000)
    client = redis_server.client()
    total = 10_000
    malformed = set(range(0, total, 97))
    events = [{"key": f"k{i}", "a": (i % 50) / 10, **({} if i in malformed else {"b": 0.1})} for i in range(total)]
    doomed = start(config, "score", tmp_path / "a.log", "kill-a", endpoint=serving.grpc)
    survivor = start(config, "score", tmp_path / "b.log", "kill-b", endpoint=serving.grpc)

    def producer() -> None:  # about 2,000 events a second, so both replicas hold events when one is killed
        for at in range(0, total, 100):
            produce(client, "kill:events", events[at:at + 100])
            threading.Event().wait(0.05)

    thread = threading.Thread(target=producer)
    thread.start()
    try:
        wait_until("a third of the events answered", lambda: client.xlen("kill:results") >= total // 3, 120, 0.02)
        doomed.send_signal(signal.SIGKILL)
        doomed.wait(timeout=10)
        thread.join()
        wait_until("every event answered", lambda: len(answered_keys(client)) == total, 180)
        wait_until("nothing pending", lambda: client.xpending("kill:events", "trainyard-score")["pending"] == 0, 30)
    finally:
        thread.join()
        assert stop(survivor) == 0
    keys = Counter(answered_keys(client, distinct=False))
    duplicates = sum(count - 1 for count in keys.values())
    print(f"\n10,000 events, one of two scorers SIGKILLed: {client.xlen('kill:results')} results, "
          f"{client.xlen('kill:dead')} dead letters, {duplicates} duplicate(s)")
    assert set(keys) == {f"k{i}" for i in range(total)}
    assert {f["key"] for _, f in read_all(client, "kill:dead")} == {f"k{i}" for i in malformed}
    survivor_log = (tmp_path / "b.log").read_text()
    assert "reclaimed" in survivor_log, survivor_log[-2000:]


def answered_keys(client, distinct: bool = True):  # noqa: ANN001, ANN201
    keys = [f["key"] for stream in ("kill:results", "kill:dead") for _, f in read_all(client, stream)]
    return set(keys) if distinct else keys


LABELLED = {"land": {"source": "land:labelled", "dead_letter": "land:landdead", "max_rows": 400, "max_seconds": 1.0}}


@pytest.mark.parametrize("fmt", ["parquet", "csv"])
def test_landing_survives_a_kill_mid_partition(redis_server: RedisServer, tmp_path: Path, fmt: str) -> None:
    import pandas as pd

    prefix = f"land-{fmt}"
    land = {**LABELLED["land"], "source": f"{prefix}:labelled", "dead_letter": f"{prefix}:dead"}
    config = stream_config(redis_server.url, prefix, land=land)
    document = json.loads(config.model_dump_json())
    document["data"]["format"] = fmt
    config = type(config).model_validate(document)
    volume = tmp_path / "volume"
    day = dt.datetime.now(dt.UTC).date().isoformat()
    folder = volume / config.data.source / f"date={day}"
    folder.mkdir(parents=True)
    # k0..k9 landed before (a file written just before a kill, its events not yet acknowledged): dropped by key
    earlier = pd.DataFrame({"a": [0.0] * 10, "b": [0.0] * 10, "y": [0] * 10,
                            "_trainyard_key": [f"k{i}" for i in range(10)]})
    getattr(earlier, f"to_{fmt}")(folder / f"part-earlier.{fmt}", index=False)
    client = redis_server.client()
    total, bad = 3000, set(range(15, 3000, 101))
    produce(client, land["source"], ({"key": f"k{i}", "a": 200.0 if i in bad else i / 100, "b": 1.0, "y": i % 2}
                                     for i in range(total)))
    log = tmp_path / "land.log"
    lander = start(config, "land", log, "lander-1", volume=volume)
    wait_until("two part files", lambda: len(list(folder.glob(f"part-*.{fmt}"))) >= 3, 60, 0.02)
    lander.send_signal(signal.SIGKILL)
    lander.wait(timeout=10)
    lander = start(config, "land", log, "lander-1", volume=volume)  # the same pod name: it re-reads what it held
    try:
        wait_until("every event landed or dead-lettered",
                   lambda: client.xpending(land["source"], "trainyard-land")["pending"] == 0
                   and group_lag(client, land["source"]) == 0, 90)
    finally:
        assert stop(lander) == 0
    frames = [getattr(pd, f"read_{fmt}")(path) for path in sorted(folder.glob(f"part-*.{fmt}"))]
    landed = pd.concat(frames)
    keys = Counter(landed["_trainyard_key"])
    assert [k for k, n in keys.items() if n > 1] == []
    good = {f"k{i}" for i in range(total) if i not in bad}
    assert set(keys) == good
    assert {f["key"] for _, f in read_all(client, land["dead_letter"])} == {f"k{i}" for i in bad}
    assert "above its max 100" in read_all(client, land["dead_letter"])[0][1]["reason"]
    assert list(landed.columns) == ["a", "b", "y", "_trainyard_key"]
    assert str(landed["y"].dtype) == "int64" and str(landed["a"].dtype) == "float64"
    assert not list(folder.glob(".*")) or all(p.suffix == ".tmp" for p in folder.glob(".*"))


def group_lag(client, stream: str) -> int:  # noqa: ANN001
    groups = client.xinfo_groups(stream)
    return int(groups[0]["lag"] or 0)


def test_a_restarted_lander_keeps_the_file_it_landed_before_the_kill(redis_server: RedisServer,
                                                                     tmp_path: Path) -> None:
    """Killed between a file's rename and the acknowledgement of its events: the restarted lander re-reads them,
    drops the ones that file holds, lands the rest in a file of its own, and never writes over the first."""
    import pandas as pd

    land = {"source": "again:labelled", "dead_letter": "again:dead", "max_rows": 100, "max_seconds": 0.5}
    config = stream_config(redis_server.url, "again", land=land)
    client = redis_server.client()
    produce(client, land["source"], [{"key": f"k{i}", "a": 1.0, "b": 2.0, "y": 1} for i in range(10)])
    client.xgroup_create(land["source"], "trainyard-land", id="0")
    ((_, held),) = client.xreadgroup("trainyard-land", "lander-x", {land["source"]: ">"}, count=10)
    volume = tmp_path / "volume"
    day = dt.datetime.fromtimestamp(int(held[0][0].split("-")[0]) / 1000, dt.UTC).date().isoformat()
    folder = volume / config.data.source / f"date={day}"
    folder.mkdir(parents=True)
    first = folder / f"part-{held[0][0]}-lander-x.parquet"  # what the killed lander had renamed into place
    pd.DataFrame({"a": [1.0] * 5, "b": [2.0] * 5, "y": [1] * 5,
                  "_trainyard_key": [f"k{i}" for i in range(5)]}).to_parquet(first, index=False)
    lander = start(config, "land", tmp_path / "land.log", "lander-x", volume=volume)
    try:
        wait_until("the held events acknowledged",
                   lambda: client.xpending(land["source"], "trainyard-land")["pending"] == 0, 30)
    finally:
        assert stop(lander) == 0
    assert list(pd.read_parquet(first)["_trainyard_key"]) == [f"k{i}" for i in range(5)]
    keys = Counter(k for path in folder.glob("part-*.parquet") for k in pd.read_parquet(path)["_trainyard_key"])
    assert keys == Counter({f"k{i}": 1 for i in range(10)})
    assert "5 duplicate(s) by key dropped" in (tmp_path / "land.log").read_text()


def test_a_broker_restarted_without_its_data_and_a_sink_of_the_wrong_type(models: Path, tmp_path: Path) -> None:
    """A Redis restarted without persistence has lost the group: the scorer creates it again and goes on. A sink
    key that holds something other than a stream is one clear line, and nothing is half-written."""
    broker = RedisServer(tmp_path / "redis").start()
    serving = Server(models).start(tmp_path / "serving.log")
    config = stream_config(broker.url, "gone")
    client = broker.client()
    log = tmp_path / "score.log"
    scorer = start(config, "score", log, "gone-1", endpoint=serving.grpc)
    try:
        broker.restart()
        produce(client, "gone:events", [{"key": f"g{i}", "a": 1.0, "b": 0.0} for i in range(20)])
        wait_until("results after the broker lost its data", lambda: client.xlen("gone:results") == 20, 60)
        assert stop(scorer) == 0
        assert "the group trainyard-score of gone:events was gone" in log.read_text()
        client.set("wrong:results", "a string")
        produce(client, "wrong:events", [{"key": "w", "a": 1.0, "b": 0.0}])
        wrong = stream_config(broker.url, "wrong")
        done = subprocess.run([sys.executable, "-m", "trainyard_stream", "score", "--endpoint", serving.grpc],
                              env={**os.environ, CONFIG_ENV: wrong.model_dump_json()}, capture_output=True,
                              text=True, timeout=120)
        assert done.returncode == 1, done.stderr[-2000:]
        assert "the broker refused: WRONGTYPE wrong:results holds a string, not a stream" in done.stderr
        assert client.xlen("wrong:dead") == 0 and client.xpending("wrong:events", "trainyard-score")["pending"] == 1
    finally:
        if scorer.poll() is None:
            scorer.kill()
        serving.stop()
        broker.stop()
