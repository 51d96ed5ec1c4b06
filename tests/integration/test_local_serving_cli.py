"""`trainyard serve --background` and `trainyard predict` on a machine with two checkouts: each finds its own
server, a taken port is refused by name, and predict asks the port the pipeline deploys to."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.integration.serving_helpers import export_tiny_model, free_port
from trainyard_contract import layout

pytestmark = pytest.mark.integration


def trainyard(data: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "TRAINYARD_DATA_DIR": str(data), "TF_CPP_MIN_LOG_LEVEL": "2"}
    return subprocess.run([sys.executable, "-m", "trainyard.cli", *args], capture_output=True, text=True,
                          timeout=300, env=env)


def test_two_checkouts_each_get_their_own_server_or_a_clear_refusal(pipelines_dir: Path, tmp_path: Path) -> None:
    grpc_port, rest_port = free_port(), free_port()
    ports = ("--grpc-port", str(grpc_port), "--rest-port", str(rest_port))
    first, second = tmp_path / "checkout-a", tmp_path / "checkout-b"
    export_tiny_model(first / layout.MODELS / "digits" / "1")  # the model the first checkout serves
    run = layout.runs_dir(first, "digits") / "r1"
    (run / layout.EVAL).mkdir(parents=True)
    (run / layout.SMOKE_SET).write_text(json.dumps({"inputs": {"a": [2.0], "b": [0.0]}, "class_ids": [0],
                                                    "probabilities": [[0.98, 0.02]],
                                                    "dtypes": {"a": "float", "b": "float"}}))
    config = pipelines_dir / "digits.yaml"
    config.write_text(config.read_text().replace("deploy:\n", f"deploy:\n  rest_port: {rest_port}\n"))
    try:
        started = trainyard(first, "serve", "--background", *ports)
        assert started.returncode == 0, started.stderr
        assert f"REST http://127.0.0.1:{rest_port}" in started.stdout

        refused = trainyard(second, "serve", "--background", *ports)  # the other checkout, same ports
        assert refused.returncode == 1 and "serving" not in refused.stdout
        assert f"cannot listen for gRPC on 127.0.0.1:{grpc_port}" in refused.stderr, refused.stderr
        assert not (second / "serving.pid").exists()

        answered = trainyard(first, "predict", "digits")  # no --rest-port: the config's deploy.rest_port
        assert answered.returncode == 0, answered.stderr
        assert f"POST http://127.0.0.1:{rest_port}/v1/models/digits:predict" in answered.stdout
        assert "the evaluator expected class id 0" in answered.stdout
    finally:
        trainyard(first, "serve", "--stop")


def test_serve_stop_returns_once_the_server_is_gone(pipelines_dir: Path, tmp_path: Path) -> None:
    """Was: "stopped" was printed while the process still ran (and held its ports) for seconds."""
    data = tmp_path / "volume"
    export_tiny_model(data / layout.MODELS / "tiny" / "1")
    ports = ("--grpc-port", str(free_port()), "--rest-port", str(free_port()))
    started = trainyard(data, "serve", "--background", *ports)
    assert started.returncode == 0, started.stderr
    pid = int((data / "serving.pid").read_text())
    stopped = trainyard(data, "serve", "--stop")
    assert stopped.returncode == 0
    assert not Path(f"/proc/{pid}").exists() or Path(f"/proc/{pid}/stat").read_text().split(")")[1].split()[0] == "Z"
    assert f"stopped (pid {pid})" in stopped.stdout
    assert "no server was running" in trainyard(data, "serve", "--stop").stdout
