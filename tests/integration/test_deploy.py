"""deploy: monotonic versions under races, AVAILABLE wait, smoke test, rollback."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.integration.serving_helpers import Server, export_tiny_model, http, wait_for
from trainyard.schema import PipelineConfig
from trainyard_serving.deploy import DeployFailed, deploy, publish

pytestmark = pytest.mark.integration

CONFIG = PipelineConfig.model_validate({
    "name": "tiny", "deploy": {"model_name": "tiny"},
    "data": {"source": "d", "label": {"name": "y", "classes": [0, 1]}, "features": [{"name": "a"}, {"name": "b"}]},
})
SMOKE = {"inputs": {"a": [2.0, 0.0], "b": [0.0, 2.0]}, "dtypes": {"a": "float", "b": "float"}, "class_ids": [0, 1]}


def fake_run(volume: Path, name: str, smoke: dict, broken: bool = False) -> Path:
    run_dir = volume / "runs" / "tiny" / name
    export_tiny_model(run_dir / "model" / "saved_model")
    if broken:
        (run_dir / "model" / "saved_model" / "saved_model.pb").write_bytes(b"corrupt")
    (run_dir / "eval").mkdir(parents=True)
    (run_dir / "eval" / "smoke.json").write_text(json.dumps(smoke))
    (run_dir / "eval" / "metrics.json").write_text(json.dumps({"challenger": {"accuracy": 1.0}}))
    return run_dir


@pytest.fixture
def volume(tmp_path: Path):  # noqa: ANN201
    volume = tmp_path / "volume"
    (volume / "models").mkdir(parents=True)
    server = Server(volume / "models").start(tmp_path / "server.log")
    yield volume, server
    server.stop()


def test_deploy_publishes_waits_and_smoke_tests(volume: tuple[Path, Server]) -> None:
    root, server = volume
    run_dir = fake_run(root, "r1", {**SMOKE, "probabilities": expected_probabilities()})
    result = deploy(CONFIG, root, run_dir, "r1", server.grpc)
    assert result["deployed"] and result["version"] == 1
    meta = json.loads((root / "models" / "tiny" / "1" / "trainyard.json").read_text())
    assert meta["run_id"] == "r1" and meta["metrics"] == {"accuracy": 1.0} and meta["published_by"] == "hardlink"
    source = run_dir / "model" / "saved_model" / "saved_model.pb"
    assert os.stat(source).st_ino == os.stat(root / "models" / "tiny" / "1" / "saved_model.pb").st_ino
    assert http("GET", server.url("/v1/models/tiny"))[1]["model_version_status"][0]["version"] == "1"


def test_a_model_that_fails_the_smoke_test_is_rolled_back(volume: tuple[Path, Server]) -> None:
    root, server = volume
    good = fake_run(root, "good", {**SMOKE, "probabilities": expected_probabilities()})
    deploy(CONFIG, root, good, "good", server.grpc)
    wrong = fake_run(root, "wrong", {**SMOKE, "class_ids": [1, 1], "probabilities": expected_probabilities()})
    with pytest.raises(DeployFailed, match="served predictions \\[0, 1\\] differ from the evaluator's \\[1, 1\\]"):
        deploy(CONFIG, root, wrong, "wrong", server.grpc)
    assert sorted(p.name for p in (root / "models" / "tiny").iterdir() if p.name.isdigit()) == ["1"]
    assert json.loads((wrong / "deploy" / "result.json").read_text())["rolled_back"] is True
    assert wait_for(lambda: http("GET", server.url("/v1/models/tiny"))[1]["model_version_status"][-1]["version"] == "1")


def test_a_model_that_cannot_load_is_rolled_back(volume: tuple[Path, Server]) -> None:
    root, server = volume
    broken = fake_run(root, "broken", {**SMOKE, "probabilities": expected_probabilities()}, broken=True)
    with pytest.raises(DeployFailed, match="serving could not load version 1"):
        deploy(CONFIG, root, broken, "broken", server.grpc)
    assert not [p for p in (root / "models" / "tiny").iterdir() if p.name.isdigit()]


def test_racing_deploys_get_distinct_versions(tmp_path: Path) -> None:
    saved = export_tiny_model(tmp_path / "saved_model")
    models = tmp_path / "models" / "tiny"
    code = ("import sys; from pathlib import Path; from trainyard_serving.deploy import publish; "
            "print(publish(Path(sys.argv[1]), Path(sys.argv[2]), {'run_id': sys.argv[3]}))")
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"}
    racers = [subprocess.Popen([sys.executable, "-c", code, str(models), str(saved), f"r{i}"], env=env,
                               stdout=subprocess.PIPE, text=True) for i in range(4)]
    got = sorted(int(p.communicate(timeout=120)[0].strip().splitlines()[-1]) for p in racers)
    assert got == [1, 2, 3, 4]
    assert publish(models, saved, {}) == 5
    assert not [p for p in models.iterdir() if p.name.startswith(".tmp-")]


def expected_probabilities() -> list[list[float]]:
    import numpy as np

    logits = np.array([[2.0, -2.0], [-2.0, 2.0]])
    exp = np.exp(logits)
    return (exp / exp.sum(axis=1, keepdims=True)).tolist()
