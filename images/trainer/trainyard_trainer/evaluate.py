"""evaluate: score the exported SavedModel and the served champion on the same eval rows of this run.

Both models are called through their `serving_default` signatures (raw features by name, as clients send them) on
every eval example of this run's split, as TFX's Evaluator scores a candidate beside its baseline: the champion is
the highest published version (what TF Serving serves), loaded from the model base path. A champion whose
signature cannot take this run's examples (an input it needs that this run lacks, another dtype, other classes) is
reported with the reason and compared on nothing. With `evaluation.change_threshold`, a paired bootstrap of the
change metric on those rows (trainyard_trainer.significance) gives the improvement's confidence interval and
p-value, which decide reads. Writes `eval/metrics.json`, `eval/smoke.json` (examples and expected outputs for
deploy's smoke test) and `eval/report.html` (trainyard_trainer.report). Metrics are those of the task
(trainyard_contract.metrics), plus any the model module's `metrics(params, schema)` adds; `loss` is the loss the
model trained with (the module's `loss(params, schema)` where it has one), and metrics.json names it.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import tensorflow as tf

from trainyard_contract import artifacts, layout
from trainyard_contract.artifacts import EvalMetrics, SmokeSet
from trainyard_contract.atomic import staged_dir
from trainyard_contract.metrics import higher_is_better
from trainyard_contract.runtime import StageError
from trainyard_contract.schema import PipelineConfig
from trainyard_trainer.champion import champion
from trainyard_trainer.data import shard_files
from trainyard_trainer.features import parse_spec, raw_signature
from trainyard_trainer.metrics import COMPUTE, ClassificationScores, RegressionScores, compute
from trainyard_trainer.model_schema import ModelSchema
from trainyard_trainer.report import render_report
from trainyard_trainer.signature import Signature, describe
from trainyard_trainer.significance import paired_bootstrap

SMOKE_EXAMPLES = 16
SCATTER_POINTS = 400


@dataclass
class Scored:
    """One model's outputs on the eval rows, in row order."""

    signature: Signature
    call: Callable[..., dict[str, tf.Tensor]]
    outputs: dict[str, list[np.ndarray]] = field(default_factory=dict)
    failure: str | None = None

    def column(self, key: str) -> np.ndarray:
        return np.concatenate(self.outputs[key])


def load_signature(saved_model: Path) -> tuple[Callable[..., dict[str, tf.Tensor]], Signature]:
    function = tf.saved_model.load(str(saved_model)).signatures["serving_default"]
    return function, describe(function)


def cannot_take(champion_signature: Signature, schema: ModelSchema) -> str | None:
    """Why the champion cannot be called on this run's examples (None: it can): every input it declares must be
    one of this run's features, in the same dtype."""
    ours = {name: spec.dtype.name for name, spec in raw_signature(schema).items()}
    problems = []
    for name, spec in champion_signature["inputs"].items():
        if name not in ours:
            problems.append(f"it needs input {name!r}, which this run's examples do not have")
        elif spec["dtype"] != ours[name]:
            problems.append(f"its input {name!r} is {spec['dtype']}, this run's is {ours[name]}")
    outputs = champion_signature["outputs"]
    wanted = ("probabilities", "logits") if schema.is_classification else ("predictions",)
    problems += [f"it has no {key!r} output" for key in wanted if key not in outputs]
    return "; ".join(problems) or None


def score_eval_split(prepared: Path, schema: ModelSchema, models: dict[str, Scored]) -> dict[str, Any]:
    """Run every model's serving signature over every eval example of this run (each model is given the inputs
    its signature declares); labels and raw features come back too. A model whose call fails is marked failed
    (its reason kept) and not called again; the others go on."""
    spec = parse_spec(schema)
    names = schema.feature_names
    dataset = tf.data.TFRecordDataset(shard_files(prepared, "eval")).batch(1024).map(
        lambda batch: tf.io.parse_example(batch, spec))
    labels: list[np.ndarray] = []
    features: dict[str, list[np.ndarray]] = {name: [] for name in names}
    for batch in dataset:
        labels.append(batch[schema.label.name].numpy())
        for name in names:
            features[name].append(batch[name].numpy())
        for model in models.values():
            if model.failure is not None:
                continue
            try:
                out = model.call(**{name: batch[name] for name in model.signature["inputs"]})
            except (tf.errors.OpError, TypeError, ValueError) as exc:
                model.failure = f"its signature refused this run's examples: {str(exc).splitlines()[0][:300]}"
                continue
            for key, value in out.items():
                model.outputs.setdefault(key, []).append(value.numpy())
    return {"labels": np.concatenate(labels), "features": {n: np.concatenate(v) for n, v in features.items()}}


def champion_class_order(champ: dict[str, Any], scored: Scored, classes: list[str]) -> tuple[list[int] | None, str]:
    """The champion's probability column of each of this run's classes, in this run's order, or None and why.

    The class list comes from the champion's trainyard.json; a version published before it recorded one is read
    from its own outputs (each `class_ids` -> `classes` pair seen on the eval rows)."""
    width = scored.column("probabilities").shape[1]
    names: list[str | None]
    if champ.get("classes"):
        names = [str(c) for c in champ["classes"]]
    else:
        names = [None] * width
        if "classes" in scored.outputs and "class_ids" in scored.outputs:
            for index, name in zip(scored.column("class_ids").tolist(), scored.column("classes").tolist(),
                                   strict=True):
                names[int(index)] = name.decode("utf-8", "replace") if isinstance(name, bytes) else str(name)
        if width == len(classes) and all(n is None or n == c for n, c in zip(names, classes, strict=True)):
            names = list(classes)  # every class seen agrees with this run's order
    if len(names) != width or sorted(n for n in names if n is not None) != sorted(classes):
        known = [n for n in names if n is not None]
        return None, (f"its classes {known}{' (only those seen on these rows)' if None in names else ''} "
                      f"are not this run's {classes}")
    return [names.index(c) for c in classes], ""


@dataclass(frozen=True)
class LossFunction:
    """The loss the model trained with, per example: the module's `loss(params, schema)` or the default."""

    name: str
    source: str
    per_example: Callable[[np.ndarray, np.ndarray], np.ndarray]


def training_loss(config: PipelineConfig, schema: ModelSchema) -> LossFunction:
    from trainyard_trainer.train import default_loss, load_model_module

    module = load_model_module(config.training.model.module)
    custom = callable(getattr(module, "loss", None))
    loss = module.loss(dict(config.training.model.params), schema) if custom else default_loss(schema)
    name = getattr(loss, "name", None) or getattr(loss, "__name__", None) or type(loss).__name__
    rows_of = (lambda a: a) if schema.is_classification else (lambda a: a[:, np.newaxis])

    def per_example(labels: np.ndarray, outputs: np.ndarray) -> np.ndarray:
        values = np.asarray(loss(tf.constant(rows_of(labels)), tf.constant(rows_of(outputs))), dtype=np.float64)
        return values.reshape(len(labels), -1).mean(axis=1)

    source = f"{config.training.model.module}.loss" if custom else "Trainyard's default for the task"
    return LossFunction(str(name), source, per_example)


class ModelScores:
    """Everything the metrics of one model need on the eval rows: the task's scores, the raw outputs the loss
    and the module's metrics take (logits, or predictions), and the per-example training loss."""

    def __init__(self, schema: ModelSchema, labels: np.ndarray, scored: Scored, loss: LossFunction,
                 order: list[int] | None = None):
        if schema.is_classification:
            probabilities, logits = scored.column("probabilities"), scored.column("logits")
            if order is not None:
                probabilities, logits = probabilities[:, order], logits[:, order]
            self.outputs, self.loss_input = probabilities, logits
        else:
            self.outputs = self.loss_input = scored.column("predictions").astype(np.float64)
        self.labels = labels
        self.task = schema.task
        self.losses = loss.per_example(labels, self.loss_input)

    def scores(self, rows: np.ndarray | None = None) -> ClassificationScores | RegressionScores:
        labels, outputs = (self.labels, self.outputs) if rows is None else (self.labels[rows], self.outputs[rows])
        return ClassificationScores(labels, outputs) if self.task == "classification" else \
            RegressionScores(labels, outputs)

    def metric(self, name: str, rows: np.ndarray | None = None, extra: Any = None) -> float:
        """One metric on all rows or on `rows` (a bootstrap resample); `extra`: the module's Keras metric of
        that name, which wins over a built-in of the same name (as it always has)."""
        if extra is not None:
            extra.reset_state()
            extra.update_state(self.labels if rows is None else self.labels[rows],
                               self.outputs if rows is None else self.outputs[rows])
            return float(extra.result())
        if name == "loss":
            return float(self.losses.mean() if rows is None else self.losses[rows].mean())
        return float(COMPUTE[self.task][name](self.scores(rows)))

    def metrics(self, wanted: list[str], extras: list[Any]) -> dict[str, float]:
        values = compute(self.task, self.scores(), [n for n in wanted if n != "loss"])
        if "loss" in wanted:
            values = {name: (round(float(self.losses.mean()), 6) if name == "loss" else values[name])
                      for name in wanted}
        for metric in extras:
            values[metric.name] = round(self.metric(metric.name, extra=metric), 6)
        return values


def module_metrics(config: PipelineConfig, schema: ModelSchema) -> list[Any]:
    """The model module's own Keras metrics (`metrics(params, schema)`), fed the probabilities or predictions."""
    from trainyard_trainer.train import load_model_module

    module = load_model_module(config.training.model.module)
    if not callable(getattr(module, "metrics", None)):
        return []
    return list(module.metrics(dict(config.training.model.params), schema))


def compare(config: PipelineConfig, ours: ModelScores, theirs: ModelScores, extras: list[Any]) -> dict[str, Any]:
    """The change metric's improvement on the same rows, with its paired-bootstrap interval when
    `change_threshold.confidence` is above 0; positive is better whatever the metric's direction."""
    change = config.evaluation.change_threshold
    assert change is not None
    name = change.metric
    sign = 1.0 if higher_is_better(ours.task, name) else -1.0
    extra = next((m for m in extras if m.name == name), None)

    def improvement(rows: np.ndarray | None) -> float:
        return sign * (ours.metric(name, rows, extra) - theirs.metric(name, rows, extra))

    result: dict[str, Any] = {"metric": name, "rows": int(len(ours.labels)),
                              "challenger": round(ours.metric(name, None, extra), 6),
                              "champion": round(theirs.metric(name, None, extra), 6),
                              "improvement": round(improvement(None), 6), "confidence": change.confidence}
    if change.confidence > 0 and len(ours.labels) >= 2:
        result.update(paired_bootstrap(improvement, len(ours.labels), change.confidence).as_dict())
    return result


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


def json_values(values: np.ndarray) -> list[Any]:
    """A feature column for smoke.json: text as str, a missing number (NaN) as null."""
    if values.dtype.kind in "SO":
        return [v.decode("utf-8", "replace") if isinstance(v, bytes) else str(v) for v in values.tolist()]
    return [None if isinstance(v, float) and v != v else v for v in values.tolist()]


def evaluate(config: PipelineConfig, volume: Path, run_dir: Path, run_id: str) -> dict[str, Any]:
    prepared = run_dir / layout.PREPARED
    document = json.loads((run_dir / layout.MODEL_SCHEMA).read_text())
    schema = ModelSchema.from_document(document)  # as exported: vocabularies and train statistics included
    call, signature = load_signature(run_dir / layout.SAVED_MODEL)
    models = {"challenger": Scored(signature, call)}
    champ = load_champion(layout.models_dir(volume, config.model_name), schema, models)
    rows = score_eval_split(prepared, schema, models)
    if models["challenger"].failure is not None:
        raise StageError(f"the exported model fails on its own eval split: {models['challenger'].failure}")
    labels = rows["labels"]
    loss = training_loss(config, schema)
    extras = module_metrics(config, schema)
    wanted = list(config.metric_names)
    ours = ModelScores(schema, labels, models["challenger"], loss)
    take = min(SMOKE_EXAMPLES, len(labels))
    payload: dict[str, Any] = {"run_id": run_id, "task": schema.task, "eval_rows": int(len(labels)),
                               "loss": {"name": loss.name, "source": loss.source},
                               "challenger": ours.metrics(wanted, extras), "champion": champ,
                               "signature": {"challenger": signature,
                                             "champion": champ["signature"] if champ else None},
                               "comparison": None}
    if champ is not None:
        del champ["signature"], champ["path"]
        theirs = score_champion(champ, models.get("champion"), schema, labels, loss)
        if theirs is not None:
            champ.update(scored=True, rows=int(len(labels)), metrics=theirs.metrics(wanted, extras))
            if config.evaluation.change_threshold is not None:
                payload["comparison"] = compare(config, ours, theirs, extras)
    smoke: dict[str, Any] = {
        "inputs": {n: json_values(rows["features"][n][:take]) for n in schema.feature_names},
        "dtypes": {f.name: f.dtype for f in (*schema.numeric, *schema.categorical)},
    }
    add_task_sections(schema, ours, labels, take, payload, smoke)
    payload["training_curve"] = training_curve(run_dir / layout.TENSORBOARD_TRAIN)
    with staged_dir(run_dir / layout.EVAL) as out:
        artifacts.write(out / layout.METRICS.name, EvalMetrics(**payload))
        artifacts.write(out / layout.SMOKE_SET.name, SmokeSet(**smoke))
        (out / layout.REPORT.name).write_text(render_report(config, payload))
    return payload


def load_champion(models_dir: Path, schema: ModelSchema, models: dict[str, Scored]) -> dict[str, Any] | None:
    """The served champion's record, with its signature and, when it cannot be scored on this eval split, why
    not; a champion that can be scored is added to `models`. None when nothing is served."""
    champ = champion(models_dir)
    if champ is None:
        return None
    champ["signature"] = None
    try:
        champion_call, champ["signature"] = load_signature(Path(champ["path"]))
    except Exception as exc:  # noqa: BLE001 - a champion that cannot be loaded is reported, not fatal
        champ["why_not_scored"] = f"its SavedModel cannot be loaded: {type(exc).__name__}: {exc}"[:500]
        return champ
    champ["why_not_scored"] = cannot_take(champ["signature"], schema)
    if champ["why_not_scored"] is None:
        models["champion"] = Scored(champ["signature"], champion_call)
    return champ


def score_champion(champ: dict[str, Any], scored: Scored | None, schema: ModelSchema, labels: np.ndarray,
                   loss: LossFunction) -> ModelScores | None:
    """The champion's scores on the same rows, or None with the reason in `champ["why_not_scored"]` (it failed
    on the split, or its classes cannot be matched to ours)."""
    if scored is None:
        return None
    if scored.failure is not None:
        champ["why_not_scored"] = scored.failure
        return None
    order, why = (champion_class_order(champ, scored, [str(c) for c in schema.label.classes])
                  if schema.is_classification else (None, ""))
    if why:
        champ["why_not_scored"] = why
        return None
    return ModelScores(schema, labels, scored, loss, order)


def add_task_sections(schema: ModelSchema, ours: ModelScores, labels: np.ndarray, take: int,
                      payload: dict[str, Any], smoke: dict[str, Any]) -> None:
    """What only one task has: per-class figures and a confusion matrix, or residuals and a scatter sample; and
    the smoke set's expected classes and probabilities, or predictions."""
    if schema.is_classification:
        scores = ours.scores()
        assert isinstance(scores, ClassificationScores)
        payload["per_class"] = scores.per_class([str(c) for c in schema.label.classes])
        payload["confusion_matrix"] = scores.matrix.tolist()
        smoke["class_ids"] = ours.outputs[:take].argmax(axis=1).tolist()
        smoke["probabilities"] = ours.outputs[:take].tolist()
        return
    predictions = ours.outputs
    residuals = predictions - labels.astype(np.float64)
    payload["residuals"] = {"mean": float(residuals.mean()), "std": float(residuals.std()),
                            "max_abs": float(np.abs(residuals).max())}
    every = max(1, len(labels) // SCATTER_POINTS)
    payload["scatter"] = [[float(a), float(p)] for a, p in zip(labels[::every], predictions[::every],
                                                               strict=True)][:SCATTER_POINTS]
    smoke["predictions"] = predictions[:take].astype(float).tolist()
