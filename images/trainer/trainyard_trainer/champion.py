"""The served champion as the trainer's stages see it on the volume: its published metadata, and whether this run
would only retrain it on the same inputs with the same config. No TensorFlow here (the model check imports it
anyway; decide must not)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import ValidationError

from trainyard_contract import artifacts, layout
from trainyard_contract.artifacts import PreparedManifest, VersionRecord
from trainyard_contract.layout import published_versions
from trainyard_contract.runtime import log


def champion(models_dir: Path) -> dict[str, Any] | None:
    """The served version (the highest published one) and its published metadata (lineage, and the metrics it
    had on its own run's eval rows, kept as `published_metrics`); None when nothing is published."""
    published = published_versions(models_dir)
    if not published:
        return None
    version = published[-1]
    meta = published_record(models_dir / str(version) / layout.VERSION_METADATA)
    return {"version": version, "path": str(models_dir / str(version)), "run_id": meta.run_id,
            "data_window_end": meta.data_window_end, "data_sha256": meta.data_sha256,
            "config_sha256": meta.config_sha256, "classes": meta.classes,
            "published_metrics": dict(meta.metrics), "metrics": {}, "rows": 0, "scored": False,
            "why_not_scored": None}


def published_record(path: Path) -> VersionRecord:
    """A published version's lineage; an empty record (nothing known) when the file is missing or unreadable, as
    for a version copied in by hand: the version is still the champion, it is just never "the same data"."""
    try:
        return VersionRecord.model_validate_json(path.read_bytes())
    except FileNotFoundError:
        return VersionRecord()
    except (OSError, ValidationError) as exc:
        log.warning("%s is unreadable (%s): the champion's lineage is treated as unknown", path,
                    str(exc).splitlines()[0])
        return VersionRecord()


def nothing_new(run_dir: Path, models_dir: Path) -> str | None:
    """Why training this run is pointless, or None: its pinned inputs' hash and its config's hash (both from
    prepare's manifest) are the ones the served champion was trained on, so a retrain could only differ by seed
    noise. A hash missing on either side never counts as equal."""
    served = champion(models_dir)
    manifest = artifacts.read_if_present(run_dir, layout.PREPARED_MANIFEST, PreparedManifest, "prepare_data",
                                         "train")
    if served is None or manifest is None:
        return None
    data, config = manifest.inputs.sha256, manifest.config_sha256
    if not data or not config or (data, config) != (served["data_sha256"], served["config_sha256"]):
        return None
    return (f"nothing new: the pinned inputs (sha256 {data[:12]}) and the config (sha256 {config[:12]}) are those "
            f"champion v{served['version']} was trained on (run {served['run_id']}); training and deploy are "
            "skipped (trigger with force_retrain to train anyway)")
