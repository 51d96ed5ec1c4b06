"""A real local serving process on free 127.0.0.1 ports, and tiny exported models to serve."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

SCHEMA = {"features": [{"name": "a", "dtype": "float", "shape": []}, {"name": "b", "dtype": "float", "shape": []}],
          "label": {"name": "y", "dtype": "int", "encoding": "class_index", "classes": [0, 1]}}


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def export_tiny_model(target: Path, bias: float = 0.0) -> Path:
    """A 2-feature logistic model exported exactly as the trainer exports (ServingModule, serving_default)."""
    import keras
    import numpy as np
    import tensorflow as tf

    from trainyard_trainer.export import ServingModule
    from trainyard_trainer.model_schema import ModelSchema

    inputs = {"numeric": keras.Input(shape=(2,), name="numeric")}
    model = keras.Model(inputs, keras.layers.Dense(2)(inputs["numeric"]))
    model.set_weights([np.array([[1.0, -1.0], [-1.0, 1.0]], dtype="float32"), np.array([bias, 0.0], dtype="float32")])
    module = ServingModule(model, ModelSchema.from_document(SCHEMA))
    tf.saved_model.save(module, str(target), signatures={"serving_default": module.serve})
    return target


MIXED_SCHEMA = {"features": [{"name": "a", "dtype": "float"}, {"name": "n", "dtype": "int"},
                              {"name": "z", "dtype": "float", "nullable": True, "impute": 0.5}],
                "label": {"name": "y", "dtype": "int", "encoding": "class_index", "classes": [0, 1]}}


def export_mixed_model(target: Path) -> Path:
    """A 3-feature model (a: float, n: int, z: nullable float) exported exactly as the trainer exports it."""
    import keras
    import numpy as np
    import tensorflow as tf

    from trainyard_trainer.export import ServingModule
    from trainyard_trainer.model_schema import ModelSchema

    inputs = {"numeric": keras.Input(shape=(3,), name="numeric")}
    model = keras.Model(inputs, keras.layers.Dense(2)(inputs["numeric"]))
    model.set_weights([np.array([[1.0, -1.0], [0.01, -0.01], [1.0, -1.0]], dtype="float32"),
                       np.zeros(2, dtype="float32")])
    module = ServingModule(model, ModelSchema.from_document(MIXED_SCHEMA))
    tf.saved_model.save(module, str(target), signatures={"serving_default": module.serve})
    return target


class Server:
    def __init__(self, models: Path, *extra: str, grpc_port: int | None = None):
        """`extra`: more `serve` flags (limits); `grpc_port`: a port to reuse (another server's, in a test)."""
        self.models, self.extra = models, list(extra)
        self.grpc_port, self.rest_port = grpc_port or free_port(), free_port()
        self.process: subprocess.Popen[bytes] | None = None
        self.log: Path | None = None

    @property
    def grpc(self) -> str:
        return f"127.0.0.1:{self.grpc_port}"

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.rest_port}{path}"

    def start(self, log: Path) -> Server:
        env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"}
        self.process = subprocess.Popen(
            [sys.executable, "-m", "trainyard_serving", "serve", "--models-dir", str(self.models),
             "--grpc-port", str(self.grpc_port), "--rest-port", str(self.rest_port), "--poll-seconds", "0.2",
             "--max-body-bytes", str(1 << 20), *self.extra],
            stdout=log.open("w"), stderr=subprocess.STDOUT, env=env)
        self.log = log
        for _ in range(240):  # bounded: 60 s
            if self.process.poll() is not None:
                raise RuntimeError(f"server exited: {log.read_text()[-2000:]}")
            try:
                urllib.request.urlopen(self.url("/v1/models/_probe"), timeout=1)
            except urllib.error.HTTPError:
                return self
            except OSError:
                time.sleep(0.25)
        raise RuntimeError("server did not come up in 60 s")

    def stop(self) -> None:
        if self.process and self.process.poll() is None:
            self.process.terminate()
            self.process.wait(timeout=20)


def http(method: str, url: str, body: Any = None, raw: bytes | None = None) -> tuple[int, dict[str, Any]]:
    data = raw if raw is not None else (json.dumps(body).encode() if body is not None else None)
    request = urllib.request.Request(url, data=data, method=method, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read() or b"{}")


def wait_for(predicate, seconds: float = 30.0) -> bool:  # noqa: ANN001
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.2)
    return False
