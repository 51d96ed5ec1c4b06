"""Classification metrics in numpy (no extra dependency): accuracy, loss, macro precision/recall, macro OvR AUC."""

from __future__ import annotations

import numpy as np

HIGHER_IS_BETTER = {"accuracy": True, "auc": True, "precision": True, "recall": True, "loss": False}


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


def classification_metrics(labels: np.ndarray, probabilities: np.ndarray, wanted: list[str]) -> dict[str, float]:
    classes = probabilities.shape[1]
    predicted = probabilities.argmax(axis=1)
    matrix = confusion_matrix(labels, predicted, classes)
    true_positive = np.diag(matrix).astype(np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        precision = np.where(matrix.sum(axis=0) > 0, true_positive / matrix.sum(axis=0), 0.0)
        recall = np.where(matrix.sum(axis=1) > 0, true_positive / matrix.sum(axis=1), 0.0)
    aucs = [binary_auc(probabilities[:, k], labels == k) for k in range(classes)]
    aucs = [a for a in aucs if a is not None]
    picked = probabilities[np.arange(len(labels)), labels]
    values = {
        "accuracy": float((predicted == labels).mean()),
        "loss": float(-np.log(np.clip(picked, 1e-7, 1.0)).mean()),
        "precision": float(precision.mean()),
        "recall": float(recall.mean()),
        "auc": float(np.mean(aucs)) if aucs else float("nan"),
    }
    return {name: round(values[name], 6) for name in wanted}
