"""deploy: monotonic versions under races, AVAILABLE wait, smoke test, rollback."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.integration.serving_helpers import Server, export_tiny_model, http, wait_for
from trainyard_contract import layout
from trainyard_contract.runtime import StageError
from trainyard_contract.schema import PipelineConfig
from trainyard_serving.deploy import DeployFailed, deploy, publish

pytestmark = pytest.mark.integration

CONFIG = PipelineConfig.model_validate({
    "name": "tiny", "deploy": {"model_name": "tiny"},
    "data": {"source": "d", "label": {"name": "y", "classes": [0, 1]}, "features": [{"name": "a"}, {"name": "b"}]},
})
SMOKE = {"inputs": {"a": [2.0, 0.0], "b": [0.0, 2.0]}, "dtypes": {"a": "float", "b": "float"}, "class_ids": [0, 1]}


def fake_run(volume: Path, name: str, smoke: dict, broken: bool = False, decision: dict | None = None) -> Path:
    """A run folder as evaluate and decide leave it (decide blessed the model unless `decision` says otherwise)."""
    run_dir = volume / layout.RUNS / "tiny" / name
    export_tiny_model(run_dir / layout.SAVED_MODEL)
    if broken:
        (run_dir / layout.SAVED_MODEL / layout.SAVED_MODEL_PB).write_bytes(b"corrupt")
    (run_dir / layout.EVAL).mkdir(parents=True)
    (run_dir / layout.SMOKE_SET).write_text(json.dumps(smoke))
    (run_dir / layout.METRICS).write_text(json.dumps({"challenger": {"accuracy": 1.0}}))
    (run_dir / layout.DEPLOY).mkdir()
    blessing = {"deploy": True, "forced": False, "reasons": ["accuracy 1.0 >= 0.5"]}
    (run_dir / layout.DECISION).write_text(json.dumps(decision if decision is not None else blessing))
    return run_dir


@pytest.fixture
def volume(tmp_path: Path):  # noqa: ANN201
    volume = tmp_path / "volume"
    (volume / layout.MODELS).mkdir(parents=True)
    server = Server(volume / layout.MODELS).start(tmp_path / "server.log")
    yield volume, server
    server.stop()


def test_deploy_publishes_waits_and_smoke_tests(volume: tuple[Path, Server]) -> None:
    root, server = volume
    run_dir = fake_run(root, "r1", {**SMOKE, "probabilities": expected_probabilities()})
    result = deploy(CONFIG, root, run_dir, "r1", server.grpc)
    assert result["deployed"] and result["version"] == 1
    meta = json.loads((root / layout.MODELS / "tiny" / "1" / layout.VERSION_METADATA).read_text())
    assert meta["run_id"] == "r1" and meta["metrics"] == {"accuracy": 1.0} and meta["published_by"] == "hardlink"
    source = run_dir / layout.SAVED_MODEL / layout.SAVED_MODEL_PB
    assert os.stat(source).st_ino == os.stat(root / layout.MODELS / "tiny" / "1" / layout.SAVED_MODEL_PB).st_ino
    assert http("GET", server.url("/v1/models/tiny"))[1]["model_version_status"][0]["version"] == "1"


@pytest.mark.parametrize("decision", [
    {"deploy": False, "forced": False, "reasons": ["accuracy 0.61 < min 0.8"]},
    {"deploy": "yes", "reasons": ["not a boolean"]},
    ["not", "an", "object"],
])
def test_deploy_without_decide_s_blessing_publishes_nothing(volume: tuple[Path, Server], decision: object) -> None:
    root, server = volume
    run_dir = fake_run(root, "skipped", {**SMOKE, "probabilities": expected_probabilities()}, decision=decision)
    result = deploy(CONFIG, root, run_dir, "skipped", server.grpc)
    assert result["deployed"] is False and "says SKIP" in result["skipped"] and "force_deploy" in result["skipped"]
    assert layout.published_versions(root / layout.MODELS / "tiny") == []
    assert not (run_dir / layout.DEPLOY_RESULT).exists()


def test_deploy_without_a_decision_is_bad_input(volume: tuple[Path, Server]) -> None:
    root, server = volume
    run_dir = fake_run(root, "undecided", {**SMOKE, "probabilities": expected_probabilities()})
    (run_dir / layout.DECISION).unlink()
    with pytest.raises(StageError, match="decision.json is missing: decide must run before deploy"):
        deploy(CONFIG, root, run_dir, "undecided", server.grpc)
    (run_dir / layout.DECISION).write_text("{half")
    with pytest.raises(StageError, match="is not valid JSON"):
        deploy(CONFIG, root, run_dir, "undecided", server.grpc)
    assert layout.published_versions(root / layout.MODELS / "tiny") == []


def test_a_model_that_fails_the_smoke_test_is_rolled_back(volume: tuple[Path, Server]) -> None:
    root, server = volume
    good = fake_run(root, "good", {**SMOKE, "probabilities": expected_probabilities()})
    deploy(CONFIG, root, good, "good", server.grpc)
    wrong = fake_run(root, "wrong", {**SMOKE, "class_ids": [1, 1], "probabilities": expected_probabilities()})
    with pytest.raises(DeployFailed, match="served predictions \\[0, 1\\] differ from the evaluator's \\[1, 1\\]"):
        deploy(CONFIG, root, wrong, "wrong", server.grpc)
    assert sorted(p.name for p in (root / layout.MODELS / "tiny").iterdir() if p.name.isdigit()) == ["1"]
    assert json.loads((wrong / layout.DEPLOY_RESULT).read_text())["rolled_back"] is True
    assert wait_for(lambda: http("GET", server.url("/v1/models/tiny"))[1]["model_version_status"][-1]["version"] == "1")


def test_a_model_that_cannot_load_is_rolled_back(volume: tuple[Path, Server]) -> None:
    root, server = volume
    broken = fake_run(root, "broken", {**SMOKE, "probabilities": expected_probabilities()}, broken=True)
    with pytest.raises(DeployFailed, match="serving could not load version 1"):
        deploy(CONFIG, root, broken, "broken", server.grpc)
    assert not [p for p in (root / layout.MODELS / "tiny").iterdir() if p.name.isdigit()]


def test_racing_deploys_get_distinct_versions(tmp_path: Path) -> None:
    saved = export_tiny_model(tmp_path / layout.SAVED_MODEL.name)
    models = tmp_path / layout.MODELS / "tiny"
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
