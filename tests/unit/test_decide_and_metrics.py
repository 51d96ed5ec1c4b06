"""The deploy decision and the numpy metrics."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from sklearn.metrics import roc_auc_score

from trainyard_contract import artifacts, layout
from trainyard_contract.schema import PipelineConfig
from trainyard_trainer.decide import decide
from trainyard_trainer.metrics import binary_auc, classification_metrics


def config(**evaluation: object) -> PipelineConfig:
    return PipelineConfig.model_validate({
        "name": "p", "evaluation": {"metrics": ["accuracy", "loss"], **evaluation},
        "data": {"source": "d", "label": {"name": "y", "classes": [0, 1]}, "features": [{"name": "a"}]},
    })


STRICT = config(thresholds={"accuracy": {"min": 0.8}}, change_threshold={"metric": "accuracy", "min_delta": 0.01})


def served(version: int, **metrics: float) -> dict:
    """A champion as evaluate writes it after scoring it on this run's eval rows."""
    return {"version": version, "metrics": metrics, "scored": True, "rows": 500, "why_not_scored": None}


def point(metric: str, ours: float, theirs: float, higher_is_better: bool = True) -> dict:
    """evaluate's comparison without a bootstrap (confidence 0): the signed improvement alone."""
    gain = (ours - theirs) if higher_is_better else (theirs - ours)
    return {"metric": metric, "rows": 500, "challenger": ours, "champion": theirs, "improvement": gain,
            "confidence": 0.0}


def evaluation(accuracy: float, champion: float | None) -> dict:
    champ = None if champion is None else served(3, accuracy=champion)
    return {"challenger": {"accuracy": accuracy, "loss": 0.3}, "champion": champ,
            "comparison": None if champion is None else point("accuracy", accuracy, champion)}


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
    better = {"challenger": {"accuracy": 0.9, "loss": 0.2}, "champion": served(1, loss=0.3),
              "comparison": point("loss", 0.2, 0.3, higher_is_better=False)}
    worse = {"challenger": {"accuracy": 0.9, "loss": 0.4}, "champion": served(1, loss=0.3),
             "comparison": point("loss", 0.4, 0.3, higher_is_better=False)}
    assert decide(by_loss, better, False)["deploy"] and not decide(by_loss, worse, False)["deploy"]


def test_force_skips_the_comparison_and_says_so() -> None:
    forced = decide(STRICT, evaluation(0.5, 0.9), force=True)
    assert forced["deploy"] and forced["forced"] and forced["ignored"]
    assert forced["reasons"][0] == "force_deploy was set: comparison skipped"


def windowed(accuracy: float, champion: float, champion_end: str | None) -> dict:
    champ = {**served(4, accuracy=champion), "data_window_end": champion_end}
    return {"challenger": {"accuracy": accuracy, "loss": 0.3}, "champion": champ,
            "comparison": point("accuracy", accuracy, champion)}


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


def test_every_declared_metric_is_computed_and_nothing_else() -> None:
    from trainyard_contract.metrics import METRICS
    from trainyard_trainer.metrics import COMPUTE

    assert {task: set(specs) for task, specs in METRICS.items()} == {task: set(f) for task, f in COMPUTE.items()}


def test_binary_auc_is_of_the_positive_class_and_f1_is_macro() -> None:
    from sklearn.metrics import f1_score, precision_recall_fscore_support

    rng = np.random.default_rng(4)
    labels = rng.integers(0, 2, size=400)
    positive = np.clip(0.5 + (labels - 0.5) * 0.3 + rng.normal(scale=0.25, size=400), 0, 1)
    probabilities = np.stack([1 - positive, positive], axis=1)
    values = classification_metrics(labels, probabilities, ["auc", "f1"])
    assert values["auc"] == pytest.approx(roc_auc_score(labels, positive), abs=1e-6)
    assert values["f1"] == pytest.approx(f1_score(labels, probabilities.argmax(1), average="macro"), abs=1e-6)
    from trainyard_trainer.metrics import ClassificationScores

    table = ClassificationScores(labels, probabilities).per_class(["no", "yes"])
    precision, recall, f1, support = precision_recall_fscore_support(labels, probabilities.argmax(1))
    assert [row["support"] for row in table] == support.tolist()
    assert [row["f1"] for row in table] == pytest.approx(f1.tolist(), abs=1e-6)


def test_regression_metrics_match_scikit_learn() -> None:
    from sklearn.metrics import mean_absolute_error, mean_squared_error, r2_score

    from trainyard_trainer.metrics import regression_metrics

    rng = np.random.default_rng(5)
    labels = rng.normal(150, 60, size=300)
    predictions = labels + rng.normal(0, 30, size=300)
    values = regression_metrics(labels, predictions, ["mse", "rmse", "mae", "r2", "loss"])
    assert values["mse"] == pytest.approx(mean_squared_error(labels, predictions), rel=1e-6)
    assert values["rmse"] == pytest.approx(np.sqrt(mean_squared_error(labels, predictions)), rel=1e-6)
    assert values["mae"] == pytest.approx(mean_absolute_error(labels, predictions), rel=1e-6)
    assert values["r2"] == pytest.approx(r2_score(labels, predictions), abs=1e-6)
    assert values["loss"] == values["mse"]


def regression_config(**evaluation: object) -> PipelineConfig:
    return PipelineConfig.model_validate({
        "name": "r", "evaluation": evaluation,
        "data": {"source": "d", "label": {"name": "y", "task": "regression"}, "features": [{"name": "a"}]},
    })


def test_regression_errors_are_lower_is_better_against_the_champion() -> None:
    by_rmse = regression_config(metrics=["rmse", "r2"], change_threshold={"metric": "rmse", "min_delta": 1.0})
    assert by_rmse.metric_names == ("rmse", "r2")

    def rmse(ours: float) -> dict:
        return {"challenger": {"rmse": ours, "r2": 0.5}, "champion": served(2, rmse=50.0),
                "comparison": point("rmse", ours, 50.0, higher_is_better=False)}

    assert decide(by_rmse, rmse(45.0), False)["deploy"]
    assert not decide(by_rmse, rmse(49.5), False)["deploy"]
    assert not decide(by_rmse, rmse(55.0), False)["deploy"]
    assert regression_config().metric_names == ("rmse", "mae", "loss")


def test_a_nan_metric_fails_its_threshold_with_a_reason() -> None:
    nan = decide(STRICT, {"challenger": {"accuracy": float("nan"), "loss": 0.3}, "champion": None}, False)
    assert nan["deploy"] is False and nan["reasons"] == ["accuracy: undefined on this eval split (NaN)"]


def test_a_champion_whose_lineage_is_unreadable_is_still_the_champion_and_never_the_same_data(
        tmp_path: Path) -> None:
    from trainyard_contract.artifacts import InputsDigest, PreparedManifest
    from trainyard_trainer.champion import champion, nothing_new

    models = layout.models_dir(tmp_path, "m")
    (models / "1").mkdir(parents=True)
    (models / "1" / layout.VERSION_METADATA).write_text('{"data_sha256": "d", "config_sha256": "c", "run_id": "r"}')
    run_dir = tmp_path / "run"
    (run_dir / layout.PREPARED).mkdir(parents=True)
    artifacts.write(run_dir / layout.PREPARED_MANIFEST, PreparedManifest(
        rows={"train": 1}, shards=[], inputs=InputsDigest(files=1, bytes=1, sha256="d"), split={},
        config_sha256="c", groups=[], seconds=0.0, throughput={}))
    assert nothing_new(run_dir, models) is not None and "champion v1" in nothing_new(run_dir, models)
    (models / "1" / layout.VERSION_METADATA).write_text('{"data_sha256": ["d"], "config_sha256": "c"}')
    served = champion(models)
    assert served is not None and served["version"] == 1 and served["data_sha256"] is None
    assert nothing_new(run_dir, models) is None
