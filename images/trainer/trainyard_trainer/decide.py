"""decide: deploy only when the new model earns it. Pure logic over eval/metrics.json; imports no TensorFlow.

Deploy when every value threshold holds (`evaluation.thresholds`: min/max per metric) and, when a model is already
served, the change threshold holds (`evaluation.change_threshold`: the metric must improve by at least `min_delta`
and improve at all; direction by metric, loss is lower-is-better). The first model of a name needs only the value
thresholds. `force_deploy` skips the comparison (and the thresholds) but never the deploy step's smoke test.
"""

from __future__ import annotations

from typing import Any

from trainyard.schema import PipelineConfig
from trainyard_trainer.metrics import HIGHER_IS_BETTER


def decide(config: PipelineConfig, evaluation: dict[str, Any], force: bool) -> dict[str, Any]:
    metrics = evaluation["challenger"]
    champion = evaluation.get("champion")
    reasons: list[str] = []
    failed: list[str] = []
    for name, bound in config.evaluation.thresholds.items():
        value = metrics.get(name)
        if value is None:
            failed.append(f"{name}: not computed (add it to evaluation.metrics)")
            continue
        if bound.min is not None and value < bound.min:
            failed.append(f"{name} {value:.4f} is below the minimum {bound.min}")
        elif bound.max is not None and value > bound.max:
            failed.append(f"{name} {value:.4f} is above the maximum {bound.max}")
        else:
            reasons.append(f"{name} {value:.4f} is within its thresholds")
    change = config.evaluation.change_threshold
    if champion is None:
        reasons.append("no model is served under this name yet: value thresholds only")
    elif change is not None:
        ours, theirs = metrics.get(change.metric), champion["metrics"].get(change.metric)
        if ours is None or theirs is None:
            failed.append(f"{change.metric}: missing for the {'challenger' if ours is None else 'champion'}")
        else:
            improvement = (ours - theirs) if HIGHER_IS_BETTER[change.metric] else (theirs - ours)
            text = (f"{change.metric} {ours:.4f} vs champion v{champion['version']} {theirs:.4f} "
                    f"(improvement {improvement:+.4f}, needs >= {change.min_delta} and > 0)")
            (reasons if improvement > 0 and improvement >= change.min_delta else failed).append(text)
    if force:
        return {"deploy": True, "forced": True, "reasons": ["force_deploy was set: comparison skipped"] + reasons,
                "ignored": failed, "champion": champion, "metrics": metrics}
    return {"deploy": not failed, "forced": False, "reasons": failed or reasons, "champion": champion,
            "metrics": metrics}
