"""Every tabular task and format: Parquet with categorical, nullable and int features, regression, and each bad
input stopping at its stage with the file and field named."""

from __future__ import annotations

import datetime as dt
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from tests.integration.serving_helpers import Server, http
from tests.integration.test_pipeline_run import run_folder, trainyard
from trainyard.config.loader import load_pipeline_file
from trainyard.dag.stages import CONFIG_ENV
from trainyard_contract import layout
from trainyard_contract.runtime import StageError
from trainyard_contract.schema import PipelineConfig
from trainyard_prep.example_data import churn_frame, write_churn, write_diabetes
from trainyard_prep.inputs import pin_inputs
from trainyard_prep.prepare import prepare
from trainyard_prep.validate import validate_inputs

pytestmark = pytest.mark.integration
END = dt.date(2026, 11, 30)


def validate_and_prepare(config: PipelineConfig, volume: Path, run: str = "r1") -> tuple[Path, dict]:
    run_dir = volume / layout.RUNS / config.name / run
    manifest = pin_inputs(volume, run_dir, config.data, None)
    validate_inputs(run_dir, config, manifest)
    return run_dir, prepare(run_dir, config, manifest)


def with_data(config: PipelineConfig, **changes: object) -> PipelineConfig:
    return PipelineConfig.model_validate({**config.model_dump(), "data": {**config.data.model_dump(), **changes}})


def write_table(volume: Path, frame: pd.DataFrame, suffix: str, name: str = "churn") -> Path:
    folder = volume / layout.DATASETS / name / f"date={END.isoformat()}"
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"part-0.{suffix}"
    if suffix == "parquet":
        frame.to_parquet(path, index=False)
    else:
        frame.to_csv(path, index=False)
    return path


@pytest.fixture
def churn(pipelines_dir: Path, data_dir: Path) -> tuple[PipelineConfig, Path]:
    write_churn(data_dir / layout.DATASETS / "churn", rows=3000, days=2, end=END)
    return load_pipeline_file(pipelines_dir / "churn.yaml"), data_dir


def test_parquet_with_categorical_and_nullable_features_is_prepared(churn: tuple[PipelineConfig, Path]) -> None:
    config, volume = churn
    run_dir, out = validate_and_prepare(config, volume)
    schema = json.loads((run_dir / layout.PREPARED_SCHEMA).read_text())
    by_name = {f["name"]: f for f in schema["features"]}
    assert schema["task"] == "classification" and schema["label"]["classes"] == ["stay", "churn"]
    # vocabularies from the train split: country's min_count 30 leaves its rarest value(s) out of vocabulary
    assert set(by_name["plan"]["vocabulary"]) == {"basic", "plus", "pro", "enterprise"}
    assert by_name["device"]["vocabulary"] == [1, 2, 3] and by_name["device"]["dtype"] == "int"
    assert "PL" not in by_name["country"]["vocabulary"] and by_name["country"]["oov_buckets"] == 2
    assert by_name["country"]["out_of_vocabulary_rows"] > 0
    # the nullable float is imputed with the train split's mean, which the stats record apart from the missing
    stats = json.loads((run_dir / layout.PREPARED_STATS).read_text())
    spend = stats["features"]["monthly_spend"]
    assert spend["missing"] > 0 and by_name["monthly_spend"]["impute"] == pytest.approx(spend["mean"])
    assert stats["computed_on"] == "train split"
    assert spend["count"] + spend["missing"] == out["rows"]["train"]


def test_a_csv_and_a_parquet_file_of_the_same_table_give_the_same_shards(pipelines_dir: Path,
                                                                         data_dir: Path) -> None:
    config = load_pipeline_file(pipelines_dir / "churn.yaml")
    frame = churn_frame(2000, seed=5)
    write_table(data_dir, frame, "parquet")
    _, from_parquet = validate_and_prepare(config, data_dir, "parquet")
    for old in (data_dir / layout.DATASETS / "churn").rglob("*.parquet"):
        old.unlink()
    write_table(data_dir, frame, "csv")
    _, from_csv = validate_and_prepare(with_data(config, format="csv"), data_dir, "csv")
    assert [s["sha256"] for s in from_csv["shards"]] == [s["sha256"] for s in from_parquet["shards"]]
    assert from_csv["rows"] == from_parquet["rows"]


@pytest.mark.parametrize(("corrupt", "expected"), [
    (lambda f: f.assign(tenure_months=f["tenure_months"].astype(str).where(f.index != 4, "long")),
     "tenure_months: 1 value(s) of the wrong type text (expected one of ['int64', 'int32', 'int16']...), "
     "row 5: 'long'"),
    (lambda f: f.assign(churned=f["churned"].where(f.index != 2, "maybe")),
     "churned: 1 value(s) fail expect_column_values_to_be_in_set (value_set ['stay', 'churn']): row 3: 'maybe'"),
    (lambda f: f.assign(support_calls=f["support_calls"].astype(float).where(f.index != 7, np.nan)),
     "support_calls: 1 missing value(s) (empty or NaN cells), at row 8"),
])
def test_bad_parquet_rows_are_named_by_file_row_and_column(pipelines_dir: Path, data_dir: Path, corrupt,  # noqa: ANN001
                                                           expected: str) -> None:
    config = load_pipeline_file(pipelines_dir / "churn.yaml")
    path = write_table(data_dir, corrupt(churn_frame(1500, seed=1)), "parquet")
    with pytest.raises(StageError) as info:
        validate_and_prepare(config, data_dir)
    assert f"{path.relative_to(data_dir)}: {expected}" in str(info.value), str(info.value)
    assert not (data_dir / layout.RUNS / "churn" / "r1" / layout.PREPARED).exists()


def test_a_configured_class_missing_from_the_data_fails_unless_allowed(pipelines_dir: Path, data_dir: Path) -> None:
    config = load_pipeline_file(pipelines_dir / "churn.yaml")
    three = with_data(config, label={**config.data.label.model_dump(), "classes": ["stay", "churn", "paused"]})
    write_table(data_dir, churn_frame(1500, seed=2), "parquet")
    with pytest.raises(StageError) as info:
        validate_and_prepare(three, data_dir)
    message = str(info.value)
    assert "churned: class(es) ['paused'] never occur in the data (rows per class: stay: " in message
    assert "paused: 0); add data" in message and "allow_missing_classes: true" in message
    allowed = with_data(three, label={**three.data.label.model_dump(), "allow_missing_classes": True})
    _, out = validate_and_prepare(allowed, data_dir, "r2")
    assert out["rows"]["train"] > 0


def test_a_categorical_feature_with_one_value_stops_prepare(pipelines_dir: Path, data_dir: Path) -> None:
    config = load_pipeline_file(pipelines_dir / "churn.yaml")
    write_table(data_dir, churn_frame(1500, seed=3).assign(plan="basic"), "parquet")
    with pytest.raises(StageError, match="categorical feature 'plan' has only the value 'basic' in the train split"):
        validate_and_prepare(config, data_dir)
    run_dir = data_dir / layout.RUNS / "churn" / "r1"
    assert not (run_dir / layout.PREPARED).exists() and not (run_dir / layout.PREPARED_PARTS).exists()


def test_regression_labels_must_be_finite_and_within_bounds(pipelines_dir: Path, data_dir: Path) -> None:
    config = load_pipeline_file(pipelines_dir / "diabetes.yaml")
    write_diabetes(data_dir / layout.DATASETS / "diabetes", days=1, end=END)
    path = next((data_dir / layout.DATASETS / "diabetes").rglob("*.csv"))
    frame = pd.read_csv(path)
    frame.loc[3, "progression"] = np.inf
    frame.loc[9, "progression"] = 900.0
    frame.to_csv(path, index=False)
    with pytest.raises(StageError) as info:
        validate_and_prepare(config, data_dir)
    assert (f"{path.relative_to(data_dir)}: progression: 2 value(s) fail expect_column_values_to_be_between "
            "(min_value 0.0, max_value 500.0): line 5: inf, line 11: 900.0") in str(info.value), str(info.value)


BROKEN_MODEL = '''
import keras


def build_model(params, schema):
    inputs = {"numeric": keras.Input(shape=(len(schema.numeric),), name="numeric")}
    return keras.Model(inputs, keras.layers.Dense(1)(inputs["numeric"]))  # one output: the task has 2 classes
'''


def test_a_model_module_that_fails_on_the_schema_is_reported_by_check_and_by_the_train_task(
        pipelines_dir: Path, data_dir: Path, tmp_path: Path) -> None:
    models = tmp_path / "user_models"
    models.mkdir()
    (models / "broken_head.py").write_text(BROKEN_MODEL)
    path = pipelines_dir / "churn.yaml"
    path.write_text(path.read_text().replace("module: trainyard_trainer.models.mlp", "module: broken_head"))
    env = {**os.environ, "PYTHONPATH": f"{models}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    checked = subprocess.run([sys.executable, "-m", "trainyard.cli", "check", str(path)], capture_output=True,
                             text=True, timeout=300, env=env)
    assert checked.returncode == 1, checked.stdout + checked.stderr
    line = next(line for line in checked.stderr.splitlines() if "training.model.module" in line)
    module_line = next(i for i, text in enumerate(path.read_text().splitlines(), 1) if "module: broken_head" in text)
    assert line.startswith(f"{path}:{module_line}:")
    assert "broken_head returns shape (1,) per example, expected (2,): 2 logits, one per class" in line
    # the train task's model check (the stage before any replica starts) says the same and exits 3
    config = load_pipeline_file(path)
    write_churn(data_dir / layout.DATASETS / "churn", rows=1500, days=1, end=END)
    run_dir, _ = validate_and_prepare(config, data_dir)
    done = subprocess.run([sys.executable, "-m", "trainyard_trainer", "check", "--volume", str(data_dir),
                           "--run-dir", str(run_dir), "--run-id", "r1"], capture_output=True, text=True,
                          timeout=300, env={**env, CONFIG_ENV: config.model_dump_json()})
    assert done.returncode == 3 and "expected (2,): 2 logits, one per class" in done.stderr, done.stderr[-2000:]
    assert not (run_dir / layout.MODEL).exists()


def grpc_predict(server: Server, model: str, columns: dict[str, tuple[list, object]]) -> dict[str, np.ndarray]:
    import grpc
    import tensorflow as tf
    from tensorflow_serving.apis import predict_pb2, prediction_service_pb2_grpc

    request = predict_pb2.PredictRequest()
    request.model_spec.name = model
    for name, (values, dtype) in columns.items():
        request.inputs[name].CopyFrom(tf.make_tensor_proto(np.asarray(values, dtype=dtype)))
    with grpc.insecure_channel(server.grpc) as channel:
        response = prediction_service_pb2_grpc.PredictionServiceStub(channel).Predict(request, timeout=30)
    return {key: tf.make_ndarray(value) for key, value in response.outputs.items()}


def test_the_regression_and_the_parquet_categorical_examples_run_end_to_end(pipelines_dir: Path, data_dir: Path,
                                                                            serving: Server) -> None:
    """Both through Airflow on the local backend (parameter-server training), deployed, then answered over REST
    and gRPC with their raw feature types: strings, ints, a null spend, an unseen category."""
    write_churn(data_dir / layout.DATASETS / "churn")
    write_diabetes(data_dir / layout.DATASETS / "diabetes")
    for name in ("churn", "diabetes"):
        done = trainyard("run", name)
        assert done.returncode == 0 and "finished: success" in done.stdout, done.stdout[-3000:] + done.stderr[-3000:]
        run_dir = run_folder(done.stdout)
        assert json.loads((run_dir / layout.TRAINING_RECORD).read_text())["strategy"] == "parameter_server"
        assert json.loads((run_dir / layout.DEPLOY_RESULT).read_text())["version"] == 1
        metrics = json.loads((run_dir / layout.METRICS).read_text())
        report = (run_dir / layout.REPORT).read_text()
        assert "Decision: DEPLOY" in report, report[:2000]
        smoke = json.loads((run_dir / layout.SMOKE_SET).read_text())
        if name == "churn":  # its example config fans the data stages out over two mapped groups
            groups = json.loads((run_dir / layout.INPUT_GROUPS).read_text())["groups"]
            assert len(groups) == 2 and json.loads((run_dir / layout.VALIDATION_RESULTS).read_text())["groups"] == 2
            assert len(json.loads((run_dir / layout.PREPARED_MANIFEST).read_text())["groups"]) == 2
            assert metrics["challenger"]["accuracy"] >= 0.7 and metrics["challenger"]["auc"] >= 0.75
            assert [row["class"] for row in metrics["per_class"]] == ["stay", "churn"]
            assert "<h2>Per class</h2>" in report and report.count("<svg") == 2
        else:
            assert metrics["task"] == "regression" and metrics["challenger"]["r2"] >= 0.2
            assert "Predicted vs actual" in report and report.count("<svg") == 3
            assert set(smoke) == {"inputs", "dtypes", "predictions"}

    customers = {"plan": ["basic", "enterprise"], "country": ["Atlantis", "DE"], "device": [9, 1],
                 "tenure_months": [2, 60], "support_calls": [6, 0], "monthly_spend": [None, 20.5]}
    status, answer = http("POST", serving.url("/v1/models/churn:predict"), {"inputs": customers})
    assert status == 200, answer
    assert answer["outputs"]["classes"] == ["churn", "stay"]  # an unseen country and device are answered
    dtypes = {"plan": object, "country": object, "device": np.int64, "tenure_months": np.int64,
              "support_calls": np.int64, "monthly_spend": np.float32}
    served = grpc_predict(serving, "churn", {n: ([np.nan if v is None else v for v in values], dtypes[n])
                                             for n, values in customers.items()})
    np.testing.assert_allclose(served["probabilities"], answer["outputs"]["probabilities"], atol=1e-5)
    # a missing spend is the train mean, inside the model: the same answer as sending that mean
    (churn_run,) = (data_dir / layout.RUNS / "churn").iterdir()
    schema = json.loads((churn_run / layout.MODEL_SCHEMA).read_text())
    mean = next(f["impute"] for f in schema["features"] if f["name"] == "monthly_spend")
    imputed = {**customers, "monthly_spend": [mean, 20.5]}
    status, same = http("POST", serving.url("/v1/models/churn:predict"), {"inputs": imputed})
    np.testing.assert_allclose(same["outputs"]["probabilities"], answer["outputs"]["probabilities"], atol=1e-5)

    smoke = json.loads((run_dir / layout.SMOKE_SET).read_text())  # diabetes: served predictions match evaluate's
    status, answer = http("POST", serving.url("/v1/models/diabetes:predict"), {"inputs": smoke["inputs"]})
    assert status == 200 and len(answer["outputs"]) == len(smoke["predictions"])  # one output: a plain list
    np.testing.assert_allclose(answer["outputs"], smoke["predictions"], rtol=1e-4)
    rows = [{n: values[0] for n, values in smoke["inputs"].items()}]
    status, answer = http("POST", serving.url("/v1/models/diabetes:predict"), {"instances": rows})
    assert status == 200 and answer["predictions"] == pytest.approx(smoke["predictions"][:1], rel=1e-4)
    served = grpc_predict(serving, "diabetes", {n: (v, np.float32) for n, v in smoke["inputs"].items()})
    np.testing.assert_allclose(served["predictions"], smoke["predictions"], rtol=1e-4)
