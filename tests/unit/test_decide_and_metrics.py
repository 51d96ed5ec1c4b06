"""The deploy decision and the numpy metrics."""

from __future__ import annotations

import numpy as np
import pytest
from sklearn.metrics import roc_auc_score

from trainyard_contract.schema import PipelineConfig
from trainyard_trainer.decide import decide
from trainyard_trainer.metrics import binary_auc, classification_metrics


def config(**evaluation: object) -> PipelineConfig:
    return PipelineConfig.model_validate({
        "name": "p", "evaluation": {"metrics": ["accuracy", "loss"], **evaluation},
        "data": {"source": "d", "label": {"name": "y", "classes": [0, 1]}, "features": [{"name": "a"}]},
    })


STRICT = config(thresholds={"accuracy": {"min": 0.8}}, change_threshold={"metric": "accuracy", "min_delta": 0.01})


def evaluation(accuracy: float, champion: float | None) -> dict:
    champ = None if champion is None else {"version": 3, "metrics": {"accuracy": champion}}
    return {"challenger": {"accuracy": accuracy, "loss": 0.3}, "champion": champ}


def test_first_model_needs_only_the_value_thresholds() -> None:
    assert decide(STRICT, evaluation(0.85, None), force=False)["deploy"] is True
    low = decide(STRICT, evaluation(0.5, None), force=False)
    assert low["deploy"] is False and low["reasons"] == ["accuracy 0.5000 is below the minimum 0.8"]


@pytest.mark.parametrize(("ours", "theirs", "deploy"), [(0.95, 0.90, True), (0.905, 0.90, False), (0.90, 0.90, False),
                                                        (0.85, 0.90, False)])
def test_change_threshold_against_the_champion(ours: float, theirs: float, deploy: bool) -> None:
    decision = decide(STRICT, evaluation(ours, theirs), force=False)
    assert decision["deploy"] is deploy
    assert any("vs champion v3" in reason for reason in decision["reasons"])


def test_loss_is_lower_is_better() -> None:
    by_loss = config(change_threshold={"metric": "loss", "min_delta": 0.0})
    better = {"challenger": {"accuracy": 0.9, "loss": 0.2}, "champion": {"version": 1, "metrics": {"loss": 0.3}}}
    worse = {"challenger": {"accuracy": 0.9, "loss": 0.4}, "champion": {"version": 1, "metrics": {"loss": 0.3}}}
    assert decide(by_loss, better, False)["deploy"] and not decide(by_loss, worse, False)["deploy"]


def test_force_skips_the_comparison_and_says_so() -> None:
    forced = decide(STRICT, evaluation(0.5, 0.9), force=True)
    assert forced["deploy"] and forced["forced"] and forced["ignored"]
    assert forced["reasons"][0] == "force_deploy was set: comparison skipped"


def windowed(accuracy: float, champion: float, champion_end: str | None) -> dict:
    served = {"version": 4, "metrics": {"accuracy": champion}, "data_window_end": champion_end}
    return {"challenger": {"accuracy": accuracy, "loss": 0.3}, "champion": served}


def test_a_model_on_older_data_never_replaces_the_champion_even_when_better() -> None:
    # a backfill run for Nov 2 scores higher than the model served from Nov 5's data: still skipped
    decision = decide(STRICT, windowed(0.99, 0.85, "2026-11-05T00:00:00+00:00"), False, "2026-11-02T00:00:00+00:00")
    assert decision["deploy"] is False
    assert decision["data_window_end"] == {"candidate": "2026-11-02T00:00:00+00:00",
                                           "champion": "2026-11-05T00:00:00+00:00", "older_than_champion": True}
    assert decision["reasons"] == ["trained on data up to 2026-11-02T00:00:00+00:00, older than champion v4's "
                                   "2026-11-05T00:00:00+00:00: a backfill or catch-up run never replaces a model "
                                   "trained on newer data (force_deploy overrides)"]
    forced = decide(STRICT, windowed(0.99, 0.85, "2026-11-05T00:00:00+00:00"), True, "2026-11-02T00:00:00+00:00")
    assert forced["deploy"] and forced["ignored"][0].startswith("trained on data up to 2026-11-02")


@pytest.mark.parametrize(("candidate", "champion_end", "deploy"), [
    ("2026-11-05T00:00:00+00:00", "2026-11-05T00:00:00+00:00", True),   # same window: the metrics decide
    ("2026-11-06T00:00:00+00:00", "2026-11-05T00:00:00+00:00", True),   # newer data
    ("2026-11-05T00:00:00", "2026-11-05T01:00:00+01:00", True),         # naive is UTC: the same instant
    ("2026-11-05T00:00:00+00:00", None, True),                          # champion's window unknown: not compared
    ("2026-11-04T23:59:59+00:00", "2026-11-05T00:00:00+00:00", False),
])
def test_data_window_comparison(candidate: str, champion_end: str | None, deploy: bool) -> None:
    decision = decide(STRICT, windowed(0.95, 0.85, champion_end), False, candidate)
    assert decision["deploy"] is deploy
    assert decision["data_window_end"]["older_than_champion"] is (not deploy)


def test_metrics_match_scikit_learn() -> None:
    rng = np.random.default_rng(1)
    labels = rng.integers(0, 3, size=500)
    logits = rng.normal(size=(500, 3)) + np.eye(3)[labels] * 1.5
    probabilities = np.exp(logits) / np.exp(logits).sum(axis=1, keepdims=True)
    values = classification_metrics(labels, probabilities, ["accuracy", "auc", "loss", "precision", "recall"])
    expected_auc = roc_auc_score(labels, probabilities, multi_class="ovr", average="macro")
    assert values["auc"] == pytest.approx(expected_auc, abs=1e-6)
    assert values["accuracy"] == pytest.approx((probabilities.argmax(1) == labels).mean(), abs=1e-6)
    scores = np.array([0.1, 0.4, 0.4, 0.8])
    assert binary_auc(scores, np.array([False, True, False, True])) == pytest.approx(0.875)
    assert binary_auc(scores, np.array([True] * 4)) is None
