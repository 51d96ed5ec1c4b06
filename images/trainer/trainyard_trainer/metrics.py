"""The evaluation metrics in numpy (no extra dependency), one function per name the contract declares.

`trainyard_contract.metrics` says which metrics each task has, their direction and range; `COMPUTE` here holds
how each is computed (a unit test checks both name sets are the same). Classification also reports a per-class
table (precision, recall, f1, support), regression a few residual statistics.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from trainyard_contract.metrics import CLASSIFICATION, REGRESSION


def confusion_matrix(labels: np.ndarray, predicted: np.ndarray, classes: int) -> np.ndarray:
    matrix = np.zeros((classes, classes), dtype=np.int64)
    np.add.at(matrix, (labels, predicted), 1)
    return matrix


def binary_auc(scores: np.ndarray, positive: np.ndarray) -> float | None:
    """Area under the ROC curve by the rank statistic (ties get average ranks); None if one class is absent."""
    n_pos = int(positive.sum())
    n_neg = len(positive) - n_pos
    if n_pos == 0 or n_neg == 0:
        return None
    order = np.argsort(scores, kind="mergesort")
    ranks = np.empty(len(scores), dtype=np.float64)
    sorted_scores = scores[order]
    _, starts, counts = np.unique(sorted_scores, return_index=True, return_counts=True)
    average = starts + (counts + 1) / 2.0
    ranks[order] = np.repeat(average, counts)
    return float((ranks[positive].sum() - n_pos * (n_pos + 1) / 2) / (n_pos * n_neg))


class ClassificationScores:
    """Everything the classification metrics share, computed once."""

    def __init__(self, labels: np.ndarray, probabilities: np.ndarray):
        self.labels = labels
        self.probabilities = probabilities
        self.classes = probabilities.shape[1]
        self.predicted = probabilities.argmax(axis=1)
        self.matrix = confusion_matrix(labels, self.predicted, self.classes)
        true_positive = np.diag(self.matrix).astype(np.float64)
        predicted_count = self.matrix.sum(axis=0)
        self.support = self.matrix.sum(axis=1)
        with np.errstate(divide="ignore", invalid="ignore"):
            self.precision = np.where(predicted_count > 0, true_positive / predicted_count, 0.0)
            self.recall = np.where(self.support > 0, true_positive / self.support, 0.0)
            both = self.precision + self.recall
            self.f1 = np.where(both > 0, 2 * self.precision * self.recall / both, 0.0)

    def auc(self) -> float:
        if self.classes == 2:  # binary: the positive class is the second listed one
            value = binary_auc(self.probabilities[:, 1], self.labels == 1)
            return value if value is not None else float("nan")
        aucs = [binary_auc(self.probabilities[:, k], self.labels == k) for k in range(self.classes)]
        present = [a for a in aucs if a is not None]
        return float(np.mean(present)) if present else float("nan")

    def per_class(self, names: list[str]) -> list[dict[str, object]]:
        return [{"class": names[k], "precision": round(float(self.precision[k]), 6),
                 "recall": round(float(self.recall[k]), 6), "f1": round(float(self.f1[k]), 6),
                 "support": int(self.support[k])} for k in range(self.classes)]


class RegressionScores:
    def __init__(self, labels: np.ndarray, predictions: np.ndarray):
        self.labels = labels.astype(np.float64)
        self.predictions = predictions.astype(np.float64)
        self.residuals = self.predictions - self.labels

    def mse(self) -> float:
        return float(np.mean(self.residuals**2))

    def r2(self) -> float:
        total = float(np.sum((self.labels - self.labels.mean()) ** 2))
        return 1.0 - float(np.sum(self.residuals**2)) / total if total > 0 else float("nan")


def _log_loss(s: ClassificationScores) -> float:
    picked = s.probabilities[np.arange(len(s.labels)), s.labels]
    return float(-np.log(np.clip(picked, 1e-7, 1.0)).mean())


COMPUTE: dict[str, dict[str, Callable[..., float]]] = {
    CLASSIFICATION: {
        "accuracy": lambda s: float((s.predicted == s.labels).mean()),
        "loss": _log_loss,
        "auc": lambda s: s.auc(),
        "precision": lambda s: float(s.precision.mean()),
        "recall": lambda s: float(s.recall.mean()),
        "f1": lambda s: float(s.f1.mean()),
    },
    REGRESSION: {
        "mse": lambda s: s.mse(),
        "rmse": lambda s: float(np.sqrt(s.mse())),
        "mae": lambda s: float(np.mean(np.abs(s.residuals))),
        "r2": lambda s: s.r2(),
        "loss": lambda s: s.mse(),
    },
}


def compute(task: str, scores: ClassificationScores | RegressionScores, wanted: list[str]) -> dict[str, float]:
    return {name: round(COMPUTE[task][name](scores), 6) for name in wanted}


def classification_metrics(labels: np.ndarray, probabilities: np.ndarray, wanted: list[str]) -> dict[str, float]:
    return compute(CLASSIFICATION, ClassificationScores(labels, probabilities), wanted)


def regression_metrics(labels: np.ndarray, predictions: np.ndarray, wanted: list[str]) -> dict[str, float]:
    return compute(REGRESSION, RegressionScores(labels, predictions), wanted)
