"""A real redis-server on a free 127.0.0.1 port, the stream processes as a user starts them, and a producer."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import redis

from tests.integration.serving_helpers import free_port
from trainyard_contract.runtime import CONFIG_ENV
from trainyard_contract.schema import PipelineConfig


class RedisServer:
    """redis-server (Debian's package, installed by scripts/install-test-services.sh), no persistence."""

    def __init__(self, folder: Path, persist: bool = False):
        """`persist`: an append-only file, so a restart keeps the streams and groups (a broker lost mid-run)."""
        self.folder, self.port, self.persist = folder, free_port(), persist
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> RedisServer:
        binary = shutil.which("redis-server") or "/usr/bin/redis-server"
        self.folder.mkdir(parents=True, exist_ok=True)
        self.process = subprocess.Popen(
            [binary, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "", "--dir", str(self.folder),
             "--appendonly", "yes" if self.persist else "no", "--appendfsync", "always"],
            stdout=(self.folder / "redis.log").open("ab"), stderr=subprocess.STDOUT)
        client = self.client()
        for _ in range(100):  # bounded: 10 s
            try:
                client.ping()
                return self
            except redis.ConnectionError:
                if self.process.poll() is not None:
                    raise RuntimeError((self.folder / "redis.log").read_text()[-2000:]) from None
                time.sleep(0.1)
        raise RuntimeError("redis-server did not answer in 10 s")

    def client(self) -> redis.Redis:
        return redis.Redis(host="127.0.0.1", port=self.port, decode_responses=True)

    def stop(self) -> None:
        if self.process and self.process.poll() is None:
            self.process.terminate()
            self.process.wait(timeout=20)

    def restart(self, down_seconds: float = 2.0) -> None:
        self.stop()
        time.sleep(down_seconds)
        self.start()


def stream_config(redis_url: str, prefix: str, **stream: Any) -> PipelineConfig:
    """A pipeline of the serving helpers' tiny models (float features a, b; classes 0, 1) with a stream section."""
    return PipelineConfig.model_validate(stream_document(redis_url, prefix, **stream))


def stream_document(redis_url: str, prefix: str, **stream: Any) -> dict[str, Any]:
    """The same pipeline as a config file's content."""
    return {
        "name": "tiny", "data": {"source": "datasets/tiny", "format": "parquet",
                                  "label": {"name": "y", "classes": [0, 1]},
                                  "features": [{"name": "a", "min": -100, "max": 100}, {"name": "b"}]},
        "deploy": {"model_name": "tiny"},
        "stream": {"broker": redis_url, "source": f"{prefix}:events", "sink": f"{prefix}:results",
                   "dead_letter": f"{prefix}:dead", "batch": {"max_records": 32, "max_wait_ms": 5},
                   **stream},
    }


def start(config: PipelineConfig, role: str, log: Path, consumer: str, endpoint: str | None = None,
          volume: Path | None = None, env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
    """`python -m trainyard_stream score|land` exactly as `trainyard stream` starts it; returns once its loop runs."""
    argv = [sys.executable, "-m", "trainyard_stream", role]
    argv += ["--endpoint", endpoint] if role == "score" else ["--volume", str(volume)]
    environment = {**os.environ, CONFIG_ENV: config.model_dump_json(), "TRAINYARD_CONSUMER": consumer,
                   "TF_CPP_MIN_LOG_LEVEL": "2", "PYTHONUNBUFFERED": "1", **(env or {})}
    offset = log.stat().st_size if log.exists() else 0
    process = subprocess.Popen(argv, env=environment, stdout=log.open("ab"), stderr=subprocess.STDOUT)
    ready = " scoring " if role == "score" else " landing "
    for _ in range(600):  # bounded: 60 s
        if ready in log.read_bytes()[offset:].decode(errors="replace"):
            return process
        if process.poll() is not None:
            raise RuntimeError(f"{role} exited {process.returncode}: {log.read_text()[-3000:]}")
        time.sleep(0.1)
    process.kill()
    raise RuntimeError(f"{role} did not start in 60 s: {log.read_text()[-3000:]}")


def stop(process: subprocess.Popen[bytes], timeout: float = 30) -> int:
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
    return process.wait(timeout=timeout)


def produce(client: redis.Redis, stream: str, events: Iterable[dict[str, Any] | str], pipe_size: int = 500) -> int:
    """XADD each event (a dict as its JSON, a str as given) in pipelined chunks; returns how many."""
    count = 0
    pipe = client.pipeline(transaction=False)
    for event in events:
        pipe.xadd(stream, {"data": event if isinstance(event, str) else json.dumps(event)})
        count += 1
        if count % pipe_size == 0:
            pipe.execute()
    pipe.execute()
    return count


def read_all(client: redis.Redis, stream: str) -> list[tuple[str, dict[str, str]]]:
    """Every entry of `stream`, oldest first."""
    return [(id, fields) for id, fields in client.xrange(stream)]


def wait_until(what: str, predicate, seconds: float = 120.0, every: float = 0.2):  # noqa: ANN001, ANN201
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(every)
    raise AssertionError(f"timed out after {seconds:g} s waiting for {what}")
