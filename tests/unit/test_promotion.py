"""Promotion a team can trust: the paired bootstrap, the signature check and how decide uses both."""

from __future__ import annotations

import numpy as np
import pytest

from trainyard_contract.schema import PipelineConfig
from trainyard_trainer.decide import decide
from trainyard_trainer.signature import breaking_changes
from trainyard_trainer.significance import paired_bootstrap, resample_count


def regression(**deploy: object) -> PipelineConfig:
    return PipelineConfig.model_validate({
        "name": "r", "evaluation": {"metrics": ["rmse", "loss"],
                                    "change_threshold": {"metric": "loss", "min_delta": 0.0}},
        "deploy": deploy,
        "data": {"source": "d", "label": {"name": "y", "task": "regression"},
                 "features": [{"name": "a", "dtype": "int"}]},
    })


def loss_comparison(ours: np.ndarray, theirs: np.ndarray, confidence: float = 0.95) -> dict:
    """evaluate's comparison of a lower-is-better per-example loss, bootstrapped as evaluate does."""
    interval = paired_bootstrap(lambda rows: float(theirs[rows].mean() - ours[rows].mean()), len(ours), confidence)
    return {"metric": "loss", "challenger": float(ours.mean()), "champion": float(theirs.mean()),
            **interval.as_dict()}


def with_champion(comparison: dict, challenger_signature: dict | None = None,
                  champion_signature: dict | None = None) -> dict:
    signature = {"inputs": {"a": {"dtype": "int64", "shape": [None]}},
                 "outputs": {"predictions": {"dtype": "float32", "shape": [None]}}}
    return {"challenger": {"loss": comparison["challenger"]}, "comparison": comparison,
            "champion": {"version": 1, "scored": True, "rows": comparison["rows"], "metrics": {}},
            "signature": {"challenger": challenger_signature or signature, "champion": champion_signature or signature}}


RNG = np.random.default_rng(7)
CHAMPION_LOSS = RNG.gamma(2.0, 1.0, size=2000)


def test_a_noise_level_gain_is_refused_and_a_real_one_deployed() -> None:
    # the challenger differs from the champion row by row by zero-mean noise: its mean loss happens to be lower
    noise = RNG.normal(0.0, 1.0, size=2000)
    noisy = CHAMPION_LOSS + noise - noise.mean() - 0.01
    refused = decide(regression(), with_champion(loss_comparison(noisy, CHAMPION_LOSS)), force=False)
    comparison = refused["comparison"]
    assert comparison["improvement"] > 0 and comparison["lower"] < 0 < comparison["upper"]
    assert comparison["p_value"] > 0.05 and refused["deploy"] is False
    assert "95% lower bound" in refused["reasons"][0]
    # the same point gain with the bootstrap turned off deploys: the bootstrap made the difference
    point = loss_comparison(noisy, CHAMPION_LOSS)
    point = {k: point[k] for k in ("metric", "challenger", "champion", "improvement", "rows")}
    assert decide(regression(), with_champion(point), force=False)["deploy"] is True
    # a challenger whose loss is 10% lower on every row clears the bound
    better = decide(regression(), with_champion(loss_comparison(CHAMPION_LOSS * 0.9, CHAMPION_LOSS)), force=False)
    assert better["deploy"] is True and better["comparison"]["lower"] > 0 and better["comparison"]["p_value"] < 0.01


def test_the_bootstrap_is_seeded_and_bounded() -> None:
    ours = CHAMPION_LOSS * 0.99
    first, second = loss_comparison(ours, CHAMPION_LOSS), loss_comparison(ours, CHAMPION_LOSS)
    assert first == second
    assert resample_count(500) == 1000 and resample_count(1_000_000) == 200
    with pytest.raises(ValueError, match="confidence"):
        paired_bootstrap(lambda rows: 0.0, 10, 1.0)


INT_INPUT = {"inputs": {"a": {"dtype": "int64", "shape": [None]}},
             "outputs": {"predictions": {"dtype": "float32", "shape": [None]}}}
FLOAT_INPUT = {"inputs": {"a": {"dtype": "float32", "shape": [None]}},
               "outputs": {"predictions": {"dtype": "float32", "shape": [None]}}}


def test_an_int64_to_float_input_blocks_the_deploy_unless_allowed() -> None:
    gain = loss_comparison(CHAMPION_LOSS * 0.9, CHAMPION_LOSS)
    blocked = decide(regression(), with_champion(gain, FLOAT_INPUT, INT_INPUT), force=False)
    assert blocked["deploy"] is False
    assert blocked["signature"]["breaking"] == ["input 'a' dtype int64 -> float32 (clients sending int64 are refused)"]
    assert "deploy.allow_signature_change" in blocked["reasons"][-1]
    allowed = decide(regression(allow_signature_change=True), with_champion(gain, FLOAT_INPUT, INT_INPUT), False)
    assert allowed["deploy"] is True and allowed["signature"]["allowed"] is True
    forced = decide(regression(), with_champion(gain, FLOAT_INPUT, INT_INPUT), force=True)
    assert forced["deploy"] is True and any("breaks champion v1" in line for line in forced["ignored"])


def test_what_breaks_a_client_and_what_does_not() -> None:
    more_outputs = {"inputs": INT_INPUT["inputs"],
                    "outputs": {**INT_INPUT["outputs"], "variance": {"dtype": "float32", "shape": [None]}}}
    assert breaking_changes(INT_INPUT, more_outputs) == []  # an added output: nobody asked for it before
    assert breaking_changes(more_outputs, INT_INPUT) == ["output 'variance' removed (clients reading it find nothing)"]
    extra_input = {"inputs": {**INT_INPUT["inputs"], "b": {"dtype": "string", "shape": [None]}},
                   "outputs": INT_INPUT["outputs"]}
    assert breaking_changes(INT_INPUT, extra_input) == [
        "input 'b' (string) added (every input is required: clients that do not send it are refused)"]
    assert breaking_changes(extra_input, INT_INPUT) == ["input 'b' removed (clients that send it are refused)"]


def test_a_champion_that_could_not_be_scored_is_compared_on_nothing_and_says_why() -> None:
    evaluation = {"challenger": {"loss": 1.0}, "comparison": None,
                  "champion": {"version": 2, "scored": False, "metrics": {},
                               "why_not_scored": "it needs input 'b', which this run's examples do not have"}}
    decision = decide(regression(), evaluation, force=False)
    assert decision["deploy"] is True
    assert decision["reasons"][1:] == ["champion v2 could not be scored on this run's eval rows (it needs input 'b', "
                                   "which this run's examples do not have): compared on nothing"]
