"""evaluate: score the exported SavedModel on the eval split through its serving signature, beside the champion.

The champion is the version TF Serving serves now for this model name (the highest published version); its
metrics come from the `trainyard.json` published with it. Writes `eval/metrics.json`, `eval/smoke.json` (examples
and expected outputs for deploy's smoke test) and `eval/report.html` (self-contained: inline CSS and SVG plots).
"""

from __future__ import annotations

import html
import json
from pathlib import Path
from typing import Any

import numpy as np
import tensorflow as tf

from trainyard_contract import layout
from trainyard_contract.atomic import staged_dir, write_json
from trainyard_contract.layout import published_versions
from trainyard_contract.schema import PipelineConfig
from trainyard_trainer.data import feature_spec, shard_files
from trainyard_trainer.metrics import HIGHER_IS_BETTER, classification_metrics, confusion_matrix

SMOKE_EXAMPLES = 16


def champion(models_dir: Path) -> dict[str, Any] | None:
    """The served version (the highest published one) and its published metadata."""
    published = published_versions(models_dir)
    if not published:
        return None
    version = published[-1]
    meta_path = models_dir / str(version) / layout.VERSION_METADATA
    meta = json.loads(meta_path.read_text()) if meta_path.is_file() else {}
    return {"version": version, "metrics": meta.get("metrics", {}), "run_id": meta.get("run_id"),
            "data_window_end": meta.get("data_window_end")}


def predict_eval_split(saved_model: Path, prepared: Path, schema: dict[str, Any]) -> dict[str, np.ndarray]:
    """Run the serving signature (raw features by name, as clients send them) over every eval example."""
    signature = tf.saved_model.load(str(saved_model)).signatures["serving_default"]
    spec = feature_spec(schema)
    label = schema["label"]["name"]
    names = [f["name"] for f in schema["features"]]
    dataset = tf.data.TFRecordDataset(shard_files(prepared, "eval")).batch(1024).map(
        lambda batch: tf.io.parse_example(batch, spec))
    labels, probabilities, features = [], [], {name: [] for name in names}
    for batch in dataset:
        out = signature(**{name: batch[name] for name in names})
        labels.append(batch[label].numpy())
        probabilities.append(out["probabilities"].numpy())
        for name in names:
            features[name].append(batch[name].numpy())
    return {"labels": np.concatenate(labels), "probabilities": np.concatenate(probabilities),
            **{f"feature:{n}": np.concatenate(v) for n, v in features.items()}}


def training_curve(folder: Path) -> list[tuple[int, float]]:
    """The training loss by step, from the chief's TensorBoard event files in `folder`."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    if not folder.is_dir():
        return []
    events = EventAccumulator(str(folder), size_guidance={"tensors": 0})
    events.Reload()
    if "loss" not in events.Tags().get("tensors", []):
        return []
    return sorted((e.step, float(tf.make_ndarray(e.tensor_proto))) for e in events.Tensors("loss"))


def svg_confusion(matrix: np.ndarray, classes: list[str]) -> str:
    cell, pad = 28, 40
    size = pad + cell * len(classes)
    peak = max(int(matrix.max()), 1)
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{size + 10}" height="{size + 10}" '
             'font-family="sans-serif" font-size="11">']
    for i, name in enumerate(classes):
        label = html.escape(name)
        parts.append(f'<text x="{pad + i * cell + cell / 2}" y="{pad - 6}" text-anchor="middle">{label}</text>')
        parts.append(f'<text x="{pad - 6}" y="{pad + i * cell + cell / 2 + 4}" text-anchor="end">{label}</text>')
        for j in range(len(classes)):
            value = int(matrix[i, j])
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


def render_report(config: PipelineConfig, payload: dict[str, Any], matrix: np.ndarray,
                  curve: list[tuple[int, float]]) -> str:
    champ = payload["champion"]
    rows = []
    for name, value in payload["challenger"].items():
        other = champ["metrics"].get(name) if champ else None
        delta = "" if other is None else f"{value - other:+.4f}"
        better = "" if other is None else ("better" if (value > other) == HIGHER_IS_BETTER[name] and value != other
                                           else ("same" if value == other else "worse"))
        rows.append(f"<tr><td>{name}</td><td>{value:.4f}</td><td>{'' if other is None else f'{other:.4f}'}</td>"
                    f"<td>{delta}</td><td>{better}</td></tr>")
    champion_title = f"champion (version {champ['version']})" if champ else "champion (none served yet)"
    classes = [str(c) for c in config.data.label.classes]
    return f"""<!doctype html><html><head><meta charset="utf-8"><title>{html.escape(config.name)} evaluation</title>
<style>body{{font-family:sans-serif;margin:2em;color:#222}}table{{border-collapse:collapse}}
td,th{{border:1px solid #ccc;padding:4px 10px;text-align:right}}th{{background:#eef}}</style></head><body>
<h1>{html.escape(config.name)}: evaluation of run {html.escape(payload['run_id'])}</h1>
<p>{payload['eval_rows']} eval examples, scored through the exported <code>serving_default</code> signature.</p>
<table><tr><th>metric</th><th>challenger</th><th>{champion_title}</th><th>change</th><th></th></tr>
{''.join(rows)}</table>
<h2>Confusion matrix (rows: true class, columns: predicted)</h2>{svg_confusion(matrix, classes)}
<h2>Training loss</h2>{svg_curve(curve)}
</body></html>"""


def evaluate(config: PipelineConfig, volume: Path, run_dir: Path, run_id: str) -> dict[str, Any]:
    prepared = run_dir / layout.PREPARED
    schema = json.loads((run_dir / layout.MODEL_SCHEMA).read_text())
    scored = predict_eval_split(run_dir / layout.SAVED_MODEL, prepared, schema)
    labels, probabilities = scored["labels"], scored["probabilities"]
    metrics = classification_metrics(labels, probabilities, list(config.evaluation.metrics))
    matrix = confusion_matrix(labels, probabilities.argmax(axis=1), probabilities.shape[1])
    payload = {
        "run_id": run_id, "eval_rows": int(len(labels)), "challenger": metrics,
        "champion": champion(layout.models_dir(volume, config.model_name)),
        "confusion_matrix": matrix.tolist(),
    }
    names = [f["name"] for f in schema["features"]]
    take = min(SMOKE_EXAMPLES, len(labels))
    smoke = {"inputs": {n: scored[f"feature:{n}"][:take].tolist() for n in names},
             "dtypes": {f["name"]: f["dtype"] for f in schema["features"]},
             "class_ids": probabilities[:take].argmax(axis=1).tolist(),
             "probabilities": probabilities[:take].tolist()}
    with staged_dir(run_dir / layout.EVAL) as out:
        write_json(out / layout.METRICS.name, payload)
        write_json(out / layout.SMOKE_SET.name, smoke)
        curve = training_curve(run_dir / layout.TENSORBOARD_TRAIN)
        (out / layout.REPORT.name).write_text(render_report(config, payload, matrix, curve))
    return payload
