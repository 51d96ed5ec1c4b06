"""decide: deploy only when the new model earns it. Pure logic over eval/metrics.json; imports no TensorFlow.

Deploy when every value threshold holds (`evaluation.thresholds`: min/max per metric) and, when a model is already
served:
- the change threshold holds (`evaluation.change_threshold`): on the same eval rows, scored by evaluate for both
  models, the improvement must clear `min_delta` and be above 0; with `confidence` above 0 (default 0.95) it is the
  improvement's lower confidence bound from a paired bootstrap that must clear it, so a gain within the noise of
  this eval sample is not deployed. Direction by metric (loss is lower-is-better). A champion that could not be
  scored on these rows is compared on nothing, and the decision says why;
- the serving signature stays compatible (trainyard_trainer.signature): a change a current client would feel holds
  the model back unless `deploy.allow_signature_change` is set.
The first model of a name needs only the value thresholds. A candidate trained on data that ends before the
champion's (`data_window_end`: a backfill or a catch-up run) never replaces it: the newest data wins over a better
metric on older data. `force_deploy` skips these checks but never the deploy step's smoke test.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

from trainyard_contract.schema import PipelineConfig
from trainyard_trainer.signature import additions, breaking_changes


def parse_instant(value: str | None) -> dt.datetime | None:
    """An ISO 8601 instant from a manifest; naive values are UTC (as Airflow's are)."""
    if not value:
        return None
    parsed = dt.datetime.fromisoformat(value)
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=dt.UTC)


def compare_data_windows(candidate_end: str | None, champion: dict[str, Any] | None) -> tuple[bool, str] | None:
    """(candidate is not older, why), or None when there is nothing to compare."""
    if champion is None:
        return None
    served_end = champion.get("data_window_end")
    ours, theirs = parse_instant(candidate_end), parse_instant(served_end)
    if ours is None or theirs is None:
        return True, (f"data window end not compared (candidate {candidate_end or 'unbounded'}, "
                      f"champion v{champion['version']} {served_end or 'unbounded'})")
    if ours < theirs:
        return False, (f"trained on data up to {candidate_end}, older than champion v{champion['version']}'s "
                       f"{served_end}: a backfill or catch-up run never replaces a model trained on newer data "
                       f"(force_deploy overrides)")
    return True, f"data up to {candidate_end} is not older than champion v{champion['version']}'s {served_end}"


def decide(config: PipelineConfig, evaluation: dict[str, Any], force: bool,
           data_window_end: str | None = None) -> dict[str, Any]:
    """The decision.json of a run; `data_window_end` is the candidate's, from its pinned inputs manifest."""
    metrics = evaluation["challenger"]
    champion = evaluation.get("champion")
    reasons: list[str] = []
    failed: list[str] = []
    window = compare_data_windows(data_window_end, champion)
    if window is not None:
        (reasons if window[0] else failed).append(window[1])
    windows = {"candidate": data_window_end, "champion": champion.get("data_window_end") if champion else None,
               "older_than_champion": window is not None and not window[0]}
    for name, bound in config.evaluation.thresholds.items():
        value = metrics.get(name)
        if value is None or value != value:  # absent or NaN (e.g. AUC when the eval split has one class)
            failed.append(f"{name}: not computed (add it to evaluation.metrics)" if value is None else
                          f"{name}: undefined on this eval split (NaN)")
            continue
        if bound.min is not None and value < bound.min:
            failed.append(f"{name} {value:.4f} is below the minimum {bound.min}")
        elif bound.max is not None and value > bound.max:
            failed.append(f"{name} {value:.4f} is above the maximum {bound.max}")
        else:
            reasons.append(f"{name} {value:.4f} is within its thresholds")
    change = config.evaluation.change_threshold
    comparison = evaluation.get("comparison")
    if champion is None:
        reasons.append("no model is served under this name yet: value thresholds only")
    elif change is not None:
        if not champion.get("scored"):
            reasons.append(f"champion v{champion['version']} could not be scored on this run's eval rows "
                           f"({champion.get('why_not_scored') or 'unknown reason'}): compared on nothing")
        elif not comparison:
            failed.append(f"{change.metric}: no comparison with champion v{champion['version']} in metrics.json "
                          "(re-run evaluate)")
        else:
            (reasons if change_holds(comparison, change.min_delta) else failed).append(
                change_text(comparison, champion["version"], change.min_delta))
    signature = signature_check(config, evaluation)
    if signature is not None:
        (reasons if signature["allowed"] else failed).append(signature["text"])
    if force:
        return {"deploy": True, "forced": True, "reasons": ["force_deploy was set: comparison skipped"] + reasons,
                "ignored": failed, "champion": champion, "metrics": metrics, "data_window_end": windows,
                "comparison": comparison, "signature": signature}
    return {"deploy": not failed, "forced": False, "reasons": failed or reasons, "held": reasons if failed else [],
            "champion": champion, "metrics": metrics, "data_window_end": windows, "comparison": comparison,
            "signature": signature}


def change_holds(comparison: dict[str, Any], min_delta: float) -> bool:
    """The improvement (or, with a bootstrap, its lower confidence bound) clears min_delta and is above 0."""
    bound = comparison["lower"] if "lower" in comparison else comparison["improvement"]
    return bound > 0 and bound >= min_delta


def change_text(comparison: dict[str, Any], version: int, min_delta: float) -> str:
    metric = comparison["metric"]
    text = (f"{metric} {comparison['challenger']:.4f} vs champion v{version} {comparison['champion']:.4f} on the "
            f"same {comparison['rows']} eval rows (improvement {comparison['improvement']:+.4f}")
    if "lower" in comparison:
        return (f"{text}; {comparison['confidence']:.0%} lower bound {comparison['lower']:+.4f}, "
                f"p={comparison['p_value']:.3f} by a paired bootstrap of {comparison['resamples']} resamples: "
                f"the bound must be above 0 and at least min_delta {min_delta:g})")
    return (f"{text}, must be above 0 and at least min_delta {min_delta:g}; no bootstrap: "
            "change_threshold.confidence is 0)")


def signature_check(config: PipelineConfig, evaluation: dict[str, Any]) -> dict[str, Any] | None:
    """The challenger's serving signature against the champion's: None without a champion (or for a metrics.json
    written before signatures were recorded); else the breaking changes, the additions and whether they pass."""
    signatures = evaluation.get("signature") or {}
    ours, theirs = signatures.get("challenger"), signatures.get("champion")
    champion = evaluation.get("champion")
    if not ours or not theirs or champion is None:
        return None
    breaking = breaking_changes(theirs, ours)
    allowed = not breaking or config.deploy.allow_signature_change
    version = champion["version"]
    if not breaking:
        text = f"serving signature compatible with champion v{version}'s"
    elif allowed:
        text = (f"serving signature breaks champion v{version}'s clients, allowed by deploy.allow_signature_change: "
                + "; ".join(breaking))
    else:
        text = (f"serving signature breaks champion v{version}'s clients: " + "; ".join(breaking)
                + " (set deploy.allow_signature_change: true once clients are updated, or trigger with force_deploy)")
    return {"breaking": breaking, "added": additions(theirs, ours), "allowed": allowed, "text": text}
