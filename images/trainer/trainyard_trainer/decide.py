"""decide: deploy only when the new model earns it. Pure logic over eval/metrics.json; imports no TensorFlow.

Deploy when every value threshold holds (`evaluation.thresholds`: min/max per metric) and, when a model is already
served, the change threshold holds (`evaluation.change_threshold`: the metric must improve by at least `min_delta`
and improve at all; direction by metric, loss is lower-is-better). The first model of a name needs only the value
thresholds. A candidate trained on data that ends before the champion's (`data_window_end`: a backfill or a
catch-up run) never replaces it: the newest data wins over a better metric on older data. `force_deploy` skips
these checks but never the deploy step's smoke test.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

from trainyard_contract.metrics import higher_is_better
from trainyard_contract.schema import PipelineConfig


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
    if champion is None:
        reasons.append("no model is served under this name yet: value thresholds only")
    elif change is not None:
        ours, theirs = metrics.get(change.metric), champion["metrics"].get(change.metric)
        if ours is None or theirs is None or ours != ours or theirs != theirs:
            failed.append(f"{change.metric}: missing for the {'challenger' if ours is None else 'champion'}")
        else:
            higher = higher_is_better(config.data.label.task, change.metric)
            improvement = (ours - theirs) if higher else (theirs - ours)
            text = (f"{change.metric} {ours:.4f} vs champion v{champion['version']} {theirs:.4f} "
                    f"(improvement {improvement:+.4f}, needs >= {change.min_delta} and > 0)")
            (reasons if improvement > 0 and improvement >= change.min_delta else failed).append(text)
    if force:
        return {"deploy": True, "forced": True, "reasons": ["force_deploy was set: comparison skipped"] + reasons,
                "ignored": failed, "champion": champion, "metrics": metrics, "data_window_end": windows}
    return {"deploy": not failed, "forced": False, "reasons": failed or reasons, "champion": champion,
            "metrics": metrics, "data_window_end": windows}
