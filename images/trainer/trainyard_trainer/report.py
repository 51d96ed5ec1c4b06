"""The evaluation report (layout.REPORT): self-contained (inline CSS and SVG), per task, rendered from the metrics.

evaluate writes it first; decide writes it again with the decision, the thresholds and the reasons, so the
report a reviewer opens says both how the model scored and what was done with it. No TensorFlow here.
"""

from __future__ import annotations

import html
from typing import Any

from trainyard_contract.metrics import higher_is_better
from trainyard_contract.schema import PipelineConfig


def svg_confusion(matrix: list[list[int]], classes: list[str]) -> str:
    cell, pad = 28, 40
    size = pad + cell * len(classes)
    peak = max((max(row) for row in matrix), default=1) or 1
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{size + 10}" height="{size + 10}" '
             'font-family="sans-serif" font-size="11">']
    for i, name in enumerate(classes):
        label = html.escape(name)
        parts.append(f'<text x="{pad + i * cell + cell / 2}" y="{pad - 6}" text-anchor="middle">{label}</text>')
        parts.append(f'<text x="{pad - 6}" y="{pad + i * cell + cell / 2 + 4}" text-anchor="end">{label}</text>')
        for j in range(len(classes)):
            value = int(matrix[i][j])
            shade = int(255 - 200 * value / peak)
            parts.append(f'<rect x="{pad + j * cell}" y="{pad + i * cell}" width="{cell}" height="{cell}" '
                         f'fill="rgb({shade},{shade},255)" stroke="#fff"/>')
            if value:
                parts.append(f'<text x="{pad + j * cell + cell / 2}" y="{pad + i * cell + cell / 2 + 4}" '
                             f'text-anchor="middle">{value}</text>')
    parts.append("</svg>")
    return "".join(parts)


def svg_curve(points: list[tuple[int, float]], width: int = 420, height: int = 180) -> str:
    if len(points) < 2:
        return "<p>(fewer than two logged steps)</p>"
    steps = [p[0] for p in points]
    values = [p[1] for p in points]
    lo, hi = min(values), max(values)
    span_x, span_y = max(steps[-1] - steps[0], 1), max(hi - lo, 1e-9)
    coords = " ".join(f"{40 + (s - steps[0]) / span_x * (width - 50):.1f},{10 + (hi - v) / span_y * (height - 40):.1f}"
                      for s, v in points)
    return (f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" font-family="sans-serif" '
            f'font-size="11"><polyline fill="none" stroke="#2e86c1" stroke-width="2" points="{coords}"/>'
            f'<text x="4" y="16">{hi:.3f}</text><text x="4" y="{height - 30}">{lo:.3f}</text>'
            f'<text x="40" y="{height - 10}">step {steps[0]}</text>'
            f'<text x="{width - 10}" y="{height - 10}" text-anchor="end">step {steps[-1]}</text></svg>')


def svg_scatter(points: list[list[float]], *, residuals: bool, size: int = 320) -> str:
    """Predicted vs actual (with the y = x line), or residual (predicted - actual) vs predicted (with y = 0)."""
    if not points:
        return "<p>(no points)</p>"
    xs = [p[1] if residuals else p[0] for p in points]
    ys = [p[1] - p[0] if residuals else p[1] for p in points]
    if residuals:
        lo_x, hi_x, lo_y, hi_y = min(xs), max(xs), min(ys + [0.0]), max(ys + [0.0])
    else:
        lo_x = lo_y = min(xs + ys)
        hi_x = hi_y = max(xs + ys)
    pad = 40
    span_x, span_y = max(hi_x - lo_x, 1e-9), max(hi_y - lo_y, 1e-9)

    def at(x: float, y: float) -> tuple[float, float]:
        return pad + (x - lo_x) / span_x * (size - pad - 10), 10 + (hi_y - y) / span_y * (size - pad - 10)

    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{size}" height="{size}" font-family="sans-serif" '
             'font-size="11">']
    if residuals:
        (x0, y0), (x1, y1) = at(lo_x, 0.0), at(hi_x, 0.0)
    else:
        (x0, y0), (x1, y1) = at(lo_x, lo_x), at(hi_x, hi_x)
    parts.append(f'<line x1="{x0:.1f}" y1="{y0:.1f}" x2="{x1:.1f}" y2="{y1:.1f}" stroke="#c0392b"/>')
    for x, y in zip(xs, ys, strict=True):
        cx, cy = at(x, y)
        parts.append(f'<circle cx="{cx:.1f}" cy="{cy:.1f}" r="2.5" fill="#2e86c1" fill-opacity="0.6"/>')
    x_name, y_name = ("predicted", "residual") if residuals else ("actual", "predicted")
    parts.append(f'<text x="{size / 2}" y="{size - 8}" text-anchor="middle">{x_name} '
                 f'({lo_x:.3g} .. {hi_x:.3g})</text>')
    parts.append(f'<text x="4" y="{size / 2}" transform="rotate(-90 10 {size / 2})">{y_name} '
                 f'({lo_y:.3g} .. {hi_y:.3g})</text></svg>')
    return "".join(parts)


def _metric_rows(config: PipelineConfig, payload: dict[str, Any]) -> str:
    champ = payload["champion"]
    task = config.data.label.task
    rows = []
    for name, value in payload["challenger"].items():
        other = champ["metrics"].get(name) if champ else None
        bound = config.evaluation.thresholds.get(name)
        limit = "" if bound is None else " ".join(
            part for part in (f"min {bound.min:g}" if bound.min is not None else "",
                              f"max {bound.max:g}" if bound.max is not None else "") if part)
        if other is None or value is None:
            delta, better = "", ""
        else:
            delta = f"{value - other:+.4f}"
            better = ("same" if value == other else
                      "better" if (value > other) == higher_is_better(task, name) else "worse")
        shown = "" if value is None else f"{value:.4f}"
        rows.append(f"<tr><td>{html.escape(name)}</td><td>{shown}</td>"
                    f"<td>{'' if other is None else f'{other:.4f}'}</td><td>{delta}</td><td>{better}</td>"
                    f"<td>{html.escape(limit)}</td></tr>")
    return "".join(rows)


def _comparison(payload: dict[str, Any]) -> str:
    """The change metric on the same rows, with the bootstrap's interval and p-value when there is one."""
    comparison = payload.get("comparison")
    if not comparison:
        return ""
    text = (f"{comparison['metric']}: challenger {comparison['challenger']:.4f}, champion "
            f"{comparison['champion']:.4f} on the same {comparison['rows']} rows; improvement "
            f"{comparison['improvement']:+.4f}")
    if "lower" in comparison:
        text += (f", {comparison['confidence']:.0%} confidence bounds [{comparison['lower']:+.4f}, "
                 f"{comparison['upper']:+.4f}], p = {comparison['p_value']:.4f} (paired bootstrap, "
                 f"{comparison['resamples']} resamples, seed {comparison['seed']})")
    return f"<p>{html.escape(text)}</p>"


def _signature_section(decision: dict[str, Any] | None) -> str:
    signature = (decision or {}).get("signature")
    if not signature:
        return ""
    items = "".join(f"<li>{html.escape(line)}</li>" for line in [*signature["breaking"], *signature["added"]])
    verdict = ("compatible with the served model's" if not signature["breaking"] else
               "breaks the served model's clients" + (" (allowed)" if signature["allowed"] else ""))
    return f"<h2>Serving signature</h2><p>{verdict}</p>" + (f"<ul>{items}</ul>" if items else "")


def _decision_section(config: PipelineConfig, payload: dict[str, Any], decision: dict[str, Any] | None) -> str:
    change = config.evaluation.change_threshold
    bound = ("" if change is None or change.confidence == 0 else
             f" (its {change.confidence:.0%} lower confidence bound, by a paired bootstrap on the same rows)")
    rule = (f"<p>Change threshold: {html.escape(change.metric)} must improve on the served model{bound} by at "
            f"least {change.min_delta:g} (and at all).</p>" if change else "<p>No change threshold.</p>")
    rule += _comparison(payload)
    if decision is None:
        return f"<h2>Decision</h2><p>Not decided yet (the decide task writes it here).</p>{rule}"
    verdict = "DEPLOY" + (" (forced)" if decision.get("forced") else "") if decision["deploy"] else "SKIP"
    reasons = "".join(f"<li>{html.escape(str(r))}</li>" for r in decision.get("reasons", []))
    ignored = "".join(f"<li>{html.escape(str(r))}</li>" for r in decision.get("ignored", []))
    extra = f"<p>Ignored because force_deploy was set:</p><ul>{ignored}</ul>" if ignored else ""
    held = "".join(f"<li>{html.escape(str(r))}</li>" for r in decision.get("held", []))
    extra += f"<p>What held:</p><ul>{held}</ul>" if held else ""
    return f"<h2>Decision: {verdict}</h2>{rule}<ul>{reasons}</ul>{extra}{_signature_section(decision)}"


def _task_section(config: PipelineConfig, payload: dict[str, Any]) -> str:
    if config.data.label.task == "regression":
        points = payload.get("scatter") or []
        residual = payload.get("residuals") or {}
        summary = ", ".join(f"{k} {v:.4g}" for k, v in residual.items() if isinstance(v, (int, float)))
        return (f"<h2>Predicted vs actual ({len(points)} eval examples)</h2>{svg_scatter(points, residuals=False)}"
                f"<h2>Residuals (predicted - actual)</h2><p>{html.escape(summary)}</p>"
                f"{svg_scatter(points, residuals=True)}")
    classes = [str(c) for c in config.data.label.classes or []]
    rows = "".join(f"<tr><td>{html.escape(r['class'])}</td><td>{r['precision']:.4f}</td><td>{r['recall']:.4f}</td>"
                   f"<td>{r['f1']:.4f}</td><td>{r['support']}</td></tr>" for r in payload.get("per_class", []))
    return (f"<h2>Per class</h2><table><tr><th>class</th><th>precision</th><th>recall</th><th>f1</th>"
            f"<th>support</th></tr>{rows}</table>"
            f"<h2>Confusion matrix (rows: true class, columns: predicted)</h2>"
            f"{svg_confusion(payload['confusion_matrix'], classes)}")


def render_report(config: PipelineConfig, payload: dict[str, Any], decision: dict[str, Any] | None = None) -> str:
    champ = payload["champion"]
    if not champ:
        champion_title = "champion (none served yet)"
    elif champ.get("scored"):
        champion_title = f"champion (version {champ['version']}, on the same {champ['rows']} rows)"
    else:
        champion_title = (f"champion (version {champ['version']}: not scored, "
                          f"{html.escape(str(champ.get('why_not_scored')))})")
    loss = payload.get("loss") or {}
    loss_note = (f" <code>loss</code> is the training loss, {html.escape(str(loss.get('name')))} "
                 f"({html.escape(str(loss.get('source')))})." if loss else "")
    curve = [tuple(p) for p in payload.get("training_curve", [])]
    return f"""<!doctype html><html><head><meta charset="utf-8"><title>{html.escape(config.name)} evaluation</title>
<style>body{{font-family:sans-serif;margin:2em;color:#222}}table{{border-collapse:collapse}}
td,th{{border:1px solid #ccc;padding:4px 10px;text-align:right}}th{{background:#eef}}</style></head><body>
<h1>{html.escape(config.name)}: evaluation of run {html.escape(payload['run_id'])}</h1>
<p>{config.data.label.task}: {payload['eval_rows']} eval examples, scored through the exported
<code>serving_default</code> signature, the challenger's and the champion's alike.{loss_note}</p>
<table><tr><th>metric</th><th>challenger</th><th>{champion_title}</th><th>change</th><th></th><th>threshold</th></tr>
{_metric_rows(config, payload)}</table>
{_decision_section(config, payload, decision)}
{_task_section(config, payload)}
<h2>Training loss</h2>{svg_curve(curve)}
</body></html>"""
