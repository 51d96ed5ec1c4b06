"""Promotion on real models: the champion is re-scored on this run's eval rows through its own signature, the
signature change that would break its clients is caught on real SavedModels, and the reported loss is the one the
model trained with."""

from __future__ import annotations

import datetime as dt
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from tests.integration.test_tabular_tasks import END, validate_and_prepare
from trainyard.config.loader import load_pipeline_file
from trainyard.dag.stages import CONFIG_ENV
from trainyard_contract import layout
from trainyard_contract.runtime import result_from_log
from trainyard_contract.schema import PipelineConfig
from trainyard_prep.example_data import write_churn
from trainyard_serving.deploy import lineage
from trainyard_serving.publishing import publish

pytestmark = pytest.mark.integration


def single(config: PipelineConfig, **data: object) -> PipelineConfig:
    """The config trained on the chief alone, quickly; `data` changes the data section."""
    raw = config.model_dump()
    raw["training"].update(strategy="single", ps={"replicas": 0}, workers={"replicas": 0}, steps=60)
    raw["data"].update(data)
    return PipelineConfig.model_validate(raw)


def stage(command: str, volume: Path, run_dir: Path, config: PipelineConfig,
          env: dict[str, str] | None = None) -> dict:
    done = subprocess.run([sys.executable, "-m", "trainyard_trainer", command, "--volume", str(volume),
                           "--run-dir", str(run_dir), "--run-id", run_dir.name], capture_output=True, text=True,
                          timeout=600, env={**os.environ, **(env or {}), CONFIG_ENV: config.model_dump_json()})
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    path = run_dir / (layout.DECISION if command == "decide" else layout.METRICS)
    return json.loads(path.read_text()) if command in ("evaluate", "decide") else {}


def check(volume: Path, run_dir: Path, config: PipelineConfig, *flags: str) -> dict:
    """The train task's model check, as it runs before any replica: its result line."""
    done = subprocess.run([sys.executable, "-m", "trainyard_trainer", "check", "--volume", str(volume),
                           "--run-dir", str(run_dir), "--run-id", run_dir.name, *flags], capture_output=True,
                          text=True, timeout=600, env={**os.environ, CONFIG_ENV: config.model_dump_json()})
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return result_from_log(done.stdout.splitlines())


def trained_run(config: PipelineConfig, volume: Path, run: str) -> Path:
    run_dir, _ = validate_and_prepare(config, volume, run)
    stage("train", volume, run_dir, config)
    stage("evaluate", volume, run_dir, config)
    return run_dir


def publish_run(config: PipelineConfig, volume: Path, run_dir: Path) -> int:
    return publish(layout.models_dir(volume, config.model_name), run_dir / layout.SAVED_MODEL,
                   lineage(config, run_dir, run_dir.name))


def with_nullable_tenure(config: PipelineConfig) -> PipelineConfig:
    features = [{**f, "nullable": True} if f["name"] == "tenure_months" else f
                for f in config.data.model_dump()["features"]]
    return single(config, features=features)


def test_the_champion_is_scored_on_this_runs_rows_and_a_breaking_signature_is_held_back(
        pipelines_dir: Path, data_dir: Path) -> None:
    config = single(load_pipeline_file(pipelines_dir / "churn.yaml"))
    datasets = data_dir / layout.DATASETS / "churn"
    write_churn(datasets, rows=1500, days=1, end=END - dt.timedelta(days=1))
    first = trained_run(config, data_dir, "r1")
    assert publish_run(config, data_dir, first) == 1
    published = json.loads((layout.models_dir(data_dir, "churn") / "1" / layout.VERSION_METADATA).read_text())
    assert published["classes"] == ["stay", "churn"] and published["eval_rows"] > 0
    # the same inputs and config again: the model check says there is nothing new, unless forced
    again = check(data_dir, first, config)
    assert again["skipped"].startswith("nothing new: the pinned inputs (sha256 ") and "champion v1" in again["skipped"]
    assert "skipped" not in check(data_dir, first, config, "--force-retrain")
    # a new daily partition: the next run's eval split has more rows than the champion's run had
    write_churn(datasets, rows=1500, days=1, end=END, seed=1)
    second = trained_run(config, data_dir, "r2")
    metrics = json.loads((second / layout.METRICS).read_text())
    champion = metrics["champion"]
    assert champion["scored"] is True and champion["version"] == 1
    assert champion["rows"] == metrics["eval_rows"] > published["eval_rows"]
    assert champion["published_metrics"] == published["metrics"]
    assert champion["metrics"]["accuracy"] != published["metrics"]["accuracy"]  # re-scored, not copied
    comparison = metrics["comparison"]
    assert comparison["metric"] == "auc" and comparison["rows"] == metrics["eval_rows"]
    assert comparison["lower"] <= comparison["improvement"] <= comparison["upper"]
    assert 0 < comparison["p_value"] <= 1 and comparison["resamples"] == 1000
    report = (second / layout.REPORT).read_text()
    assert f"champion (version 1, on the same {metrics['eval_rows']} rows)" in report
    # tenure_months made nullable: its serving input turns from int64 into float
    nullable = with_nullable_tenure(config)
    third = trained_run(nullable, data_dir, "r3")
    metrics = json.loads((third / layout.METRICS).read_text())
    assert metrics["champion"]["scored"] is False
    assert metrics["champion"]["why_not_scored"] == "its input 'tenure_months' is int64, this run's is float32"
    blocked = stage("decide", data_dir, third, nullable)
    assert blocked["deploy"] is False
    assert blocked["signature"]["breaking"] == [
        "input 'tenure_months' dtype int64 -> float32 (clients sending int64 are refused)"]
    assert blocked["comparison"] is None
    assert "champion v1 could not be scored on this run's eval rows (its input 'tenure_months' is int64, this " \
           "run's is float32): compared on nothing" in blocked["held"]
    allowed = PipelineConfig.model_validate(
        {**nullable.model_dump(), "deploy": {**nullable.deploy.model_dump(), "allow_signature_change": True}})
    assert stage("decide", data_dir, third, allowed)["deploy"] is True


HUBER = '''
import keras

from trainyard_trainer.models.mlp import build_model  # noqa: F401 - the example's model, with its own loss


def loss(params, schema):
    return keras.losses.Huber(delta=1.0, reduction="none")
'''


def test_the_reported_loss_is_the_training_loss(pipelines_dir: Path, data_dir: Path, tmp_path: Path) -> None:
    models = tmp_path / "user_models"
    models.mkdir()
    (models / "huber_mlp.py").write_text(HUBER)
    env = {"PYTHONPATH": f"{models}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    raw = load_pipeline_file(pipelines_dir / "diabetes.yaml").model_dump()
    raw["training"]["model"]["module"] = "huber_mlp"
    raw["training"].update(strategy="single", ps={"replicas": 0}, workers={"replicas": 0}, steps=60)
    config = PipelineConfig.model_validate(raw)
    from trainyard_prep.example_data import write_diabetes

    write_diabetes(data_dir / layout.DATASETS / "diabetes", days=2, end=END)
    run_dir, _ = validate_and_prepare(config, data_dir)
    stage("train", data_dir, run_dir, config, env)
    metrics = stage("evaluate", data_dir, run_dir, config, env)
    assert metrics["loss"] == {"name": "huber_loss", "source": "huber_mlp.loss"}
    # the Huber loss of the scatter's points, by its definition, is far below their mean squared error
    points = np.asarray(metrics["scatter"], dtype=np.float64)
    residual = np.abs(points[:, 1] - points[:, 0])
    huber = np.where(residual <= 1.0, 0.5 * residual**2, residual - 0.5)
    assert metrics["challenger"]["loss"] == pytest.approx(huber.mean(), rel=0.15)
    assert metrics["challenger"]["loss"] < 0.1 * metrics["challenger"]["rmse"] ** 2
