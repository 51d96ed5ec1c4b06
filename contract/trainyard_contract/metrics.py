"""Every evaluation metric Trainyard computes, declared once: its task, direction and the range its values take.

The schema uses these to refuse a threshold on a metric the task does not have or one that cannot hold (an
accuracy min of 90) when the config is loaded; decide reads the direction; the evaluator computes each by name
(`trainyard_trainer.metrics.COMPUTE`, a test checks both name sets match). Pure data: the DAG parse imports it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

CLASSIFICATION = "classification"
REGRESSION = "regression"
TASKS = (CLASSIFICATION, REGRESSION)


@dataclass(frozen=True)
class MetricSpec:
    name: str
    task: str
    higher_is_better: bool
    lowest: float
    highest: float
    meaning: str


_SPECS = [
    MetricSpec("accuracy", CLASSIFICATION, True, 0.0, 1.0, "share of eval examples whose top class is right"),
    MetricSpec("loss", CLASSIFICATION, False, 0.0, math.inf,
               "the training loss: the model module's loss(), else cross-entropy of the true class from the logits"),
    MetricSpec("auc", CLASSIFICATION, True, 0.0, 1.0,
               "ROC AUC; binary: of the positive (second listed) class; multiclass: macro one-vs-rest average"),
    MetricSpec("precision", CLASSIFICATION, True, 0.0, 1.0, "macro average over the classes"),
    MetricSpec("recall", CLASSIFICATION, True, 0.0, 1.0, "macro average over the classes"),
    MetricSpec("f1", CLASSIFICATION, True, 0.0, 1.0, "macro average of the per-class F1 scores"),
    MetricSpec("mse", REGRESSION, False, 0.0, math.inf, "mean squared error"),
    MetricSpec("rmse", REGRESSION, False, 0.0, math.inf, "root mean squared error (label units)"),
    MetricSpec("mae", REGRESSION, False, 0.0, math.inf, "mean absolute error (label units)"),
    MetricSpec("r2", REGRESSION, True, -math.inf, 1.0, "coefficient of determination (1 is perfect)"),
    MetricSpec("loss", REGRESSION, False, 0.0, math.inf,
               "the training loss: the model module's loss() (Huber, say), else mean squared error"),
]

METRICS: dict[str, dict[str, MetricSpec]] = {
    task: {spec.name: spec for spec in _SPECS if spec.task == task} for task in TASKS
}
DEFAULT_METRICS: dict[str, tuple[str, ...]] = {
    CLASSIFICATION: ("accuracy", "loss"),
    REGRESSION: ("rmse", "mae", "loss"),
}


def metric(task: str, name: str) -> MetricSpec | None:
    return METRICS[task].get(name)


def higher_is_better(task: str, name: str) -> bool:
    """The direction of a built-in metric; an extra metric of the user's model module counts as higher-is-better
    unless its name says loss or error (as Keras names them)."""
    spec = metric(task, name)
    if spec is not None:
        return spec.higher_is_better
    return not any(word in name for word in ("loss", "error"))


def impossible_bound(spec: MetricSpec, minimum: float | None, maximum: float | None) -> str | None:
    """Why a `{min, max}` threshold can never hold (or always holds vacuously out of range), or None."""
    if minimum is not None and minimum > spec.highest:
        return f"{spec.name} is at most {spec.highest:g}: min {minimum:g} can never hold"
    if maximum is not None and maximum < spec.lowest:
        return f"{spec.name} is at least {spec.lowest:g}: max {maximum:g} can never hold"
    if minimum is not None and maximum is not None and minimum > maximum:
        return f"min {minimum:g} is greater than max {maximum:g}"
    return None
