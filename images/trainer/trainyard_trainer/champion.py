"""The served champion as the trainer's stages see it on the volume: its published metadata, and whether this run
would only retrain it on the same inputs with the same config. No TensorFlow here (the model check imports it
anyway; decide must not)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from trainyard_contract import layout
from trainyard_contract.layout import published_versions


def champion(models_dir: Path) -> dict[str, Any] | None:
    """The served version (the highest published one) and its published metadata (lineage, and the metrics it
    had on its own run's eval rows, kept as `published_metrics`); None when nothing is published."""
    published = published_versions(models_dir)
    if not published:
        return None
    version = published[-1]
    meta_path = models_dir / str(version) / layout.VERSION_METADATA
    try:
        meta = json.loads(meta_path.read_text()) if meta_path.is_file() else {}
    except (OSError, json.JSONDecodeError):
        meta = {}
    meta = meta if isinstance(meta, dict) else {}
    return {"version": version, "path": str(models_dir / str(version)), "run_id": meta.get("run_id"),
            "data_window_end": meta.get("data_window_end"), "data_sha256": meta.get("data_sha256"),
            "config_sha256": meta.get("config_sha256"), "classes": meta.get("classes"),
            "published_metrics": meta.get("metrics", {}), "metrics": {}, "rows": 0, "scored": False,
            "why_not_scored": None}


def nothing_new(run_dir: Path, models_dir: Path) -> str | None:
    """Why training this run is pointless, or None: its pinned inputs' hash and its config's hash (both from
    prepare's manifest) are the ones the served champion was trained on, so a retrain could only differ by seed
    noise. A hash missing on either side never counts as equal."""
    served = champion(models_dir)
    manifest_path = run_dir / layout.PREPARED_MANIFEST
    if served is None or not manifest_path.is_file():
        return None
    manifest = json.loads(manifest_path.read_text())
    data, config = manifest.get("inputs", {}).get("sha256"), manifest.get("config_sha256")
    if not data or not config or (data, config) != (served["data_sha256"], served["config_sha256"]):
        return None
    return (f"nothing new: the pinned inputs (sha256 {data[:12]}) and the config (sha256 {config[:12]}) are those "
            f"champion v{served['version']} was trained on (run {served['run_id']}); training and deploy are "
            "skipped (trigger with force_retrain to train anyway)")
