"""evaluate: score the exported SavedModel on the eval split through its serving signature, beside the champion.

The champion is the version TF Serving serves now for this model name (the highest published version); its
metrics come from the `trainyard.json` published with it. Writes `eval/metrics.json`, `eval/smoke.json` (examples
and expected outputs for deploy's smoke test) and `eval/report.html` (trainyard_trainer.report). Metrics are those
of the task (trainyard_contract.metrics), plus any the model module's `metrics(params, schema)` adds.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import tensorflow as tf

from trainyard_contract import layout
from trainyard_contract.atomic import staged_dir, write_json
from trainyard_contract.layout import published_versions
from trainyard_contract.schema import PipelineConfig
from trainyard_trainer.data import shard_files
from trainyard_trainer.features import parse_spec
from trainyard_trainer.metrics import ClassificationScores, RegressionScores, compute
from trainyard_trainer.model_schema import ModelSchema
from trainyard_trainer.report import render_report

SMOKE_EXAMPLES = 16


def champion(models_dir: Path) -> dict[str, Any] | None:
    """The served version (the highest published one) and its published metadata."""
    published = published_versions(models_dir)
    if not published:
        return None
    version = published[-1]
    meta_path = models_dir / str(version) / layout.VERSION_METADATA
    meta = json.loads(meta_path.read_text()) if meta_path.is_file() else {}
    return {"version": version, "metrics": meta.get("metrics", {}), "run_id": meta.get("run_id"),
            "data_window_end": meta.get("data_window_end")}


SCATTER_POINTS = 400


def predict_eval_split(saved_model: Path, prepared: Path, schema: ModelSchema) -> dict[str, Any]:
    """Run the serving signature (raw features by name, as clients send them) over every eval example."""
    signature = tf.saved_model.load(str(saved_model)).signatures["serving_default"]
    spec = parse_spec(schema)
    label = schema.label.name
    names = schema.feature_names
    dataset = tf.data.TFRecordDataset(shard_files(prepared, "eval")).batch(1024).map(
        lambda batch: tf.io.parse_example(batch, spec))
    labels: list[np.ndarray] = []
    outputs: dict[str, list[np.ndarray]] = {}
    features: dict[str, list[np.ndarray]] = {name: [] for name in names}
    for batch in dataset:
        out = signature(**{name: batch[name] for name in names})
        labels.append(batch[label].numpy())
        for key in ("probabilities", "predictions"):
            if key in out:
                outputs.setdefault(key, []).append(out[key].numpy())
        for name in names:
            features[name].append(batch[name].numpy())
    return {"labels": np.concatenate(labels), **{k: np.concatenate(v) for k, v in outputs.items()},
            "features": {n: np.concatenate(v) for n, v in features.items()}}


def training_curve(folder: Path) -> list[tuple[int, float]]:
    """The training loss by step, from the chief's TensorBoard event files in `folder`."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    if not folder.is_dir():
        return []
    events = EventAccumulator(str(folder), size_guidance={"tensors": 0})
    events.Reload()
    if "loss" not in events.Tags().get("tensors", []):
        return []
    return sorted((e.step, float(tf.make_ndarray(e.tensor_proto))) for e in events.Tensors("loss"))


def extra_metrics(config: PipelineConfig, schema: ModelSchema, labels: np.ndarray,
                  outputs: np.ndarray) -> dict[str, float]:
    """The model module's own Keras metrics (`metrics(params, schema)`), fed the probabilities or predictions."""
    from trainyard_trainer.train import load_model_module

    module = load_model_module(config.training.model.module)
    if not callable(getattr(module, "metrics", None)):
        return {}
    values = {}
    for metric in module.metrics(dict(config.training.model.params), schema):
        metric.update_state(labels, outputs)
        values[metric.name] = round(float(metric.result()), 6)
    return values


def json_values(values: np.ndarray) -> list[Any]:
    """A feature column for smoke.json: text as str, a missing number (NaN) as null."""
    if values.dtype.kind in "SO":
        return [v.decode("utf-8", "replace") if isinstance(v, bytes) else str(v) for v in values.tolist()]
    return [None if isinstance(v, float) and v != v else v for v in values.tolist()]


def evaluate(config: PipelineConfig, volume: Path, run_dir: Path, run_id: str) -> dict[str, Any]:
    prepared = run_dir / layout.PREPARED
    document = json.loads((run_dir / layout.MODEL_SCHEMA).read_text())
    schema = ModelSchema.from_document(document)  # as exported: vocabularies and train statistics included
    scored = predict_eval_split(run_dir / layout.SAVED_MODEL, prepared, schema)
    labels = scored["labels"]
    task = schema.task
    take = min(SMOKE_EXAMPLES, len(labels))
    payload: dict[str, Any] = {"run_id": run_id, "task": task, "eval_rows": int(len(labels)),
                               "champion": champion(layout.models_dir(volume, config.model_name))}
    smoke: dict[str, Any] = {
        "inputs": {n: json_values(scored["features"][n][:take]) for n in schema.feature_names},
        "dtypes": {f.name: f.dtype for f in (*schema.numeric, *schema.categorical)},
    }
    if schema.is_classification:
        probabilities = scored["probabilities"]
        scores = ClassificationScores(labels, probabilities)
        outputs = probabilities
        payload["challenger"] = compute(task, scores, list(config.metric_names))
        payload["per_class"] = scores.per_class([str(c) for c in schema.label.classes])
        payload["confusion_matrix"] = scores.matrix.tolist()
        smoke["class_ids"] = probabilities[:take].argmax(axis=1).tolist()
        smoke["probabilities"] = probabilities[:take].tolist()
    else:
        predictions = scored["predictions"]
        scores = RegressionScores(labels, predictions)
        outputs = predictions
        payload["challenger"] = compute(task, scores, list(config.metric_names))
        residuals = scores.residuals
        payload["residuals"] = {"mean": float(residuals.mean()), "std": float(residuals.std()),
                                "max_abs": float(np.abs(residuals).max())}
        every = max(1, len(labels) // SCATTER_POINTS)
        payload["scatter"] = [[float(a), float(p)] for a, p in zip(labels[::every], predictions[::every],
                                                                   strict=True)][:SCATTER_POINTS]
        smoke["predictions"] = predictions[:take].astype(float).tolist()
    payload["challenger"].update(extra_metrics(config, schema, labels, outputs))
    payload["training_curve"] = training_curve(run_dir / layout.TENSORBOARD_TRAIN)
    with staged_dir(run_dir / layout.EVAL) as out:
        write_json(out / layout.METRICS.name, payload)
        write_json(out / layout.SMOKE_SET.name, smoke)
        (out / layout.REPORT.name).write_text(render_report(config, payload))
    return payload
