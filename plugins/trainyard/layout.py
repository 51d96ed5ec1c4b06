"""The shared-volume layout: the contract between stages (see DESIGN.md). Pure functions of names and run ids."""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

RUN_SUBDIRS = ("inputs", "validation", "prepared", "cluster", "checkpoints", "model", "tensorboard", "eval", "deploy")


def run_key(run_id: str) -> str:
    """A folder-safe, unique name for an Airflow run id.

    Characters outside `[A-Za-z0-9._-]` become `-`; when anything was replaced a short hash of the original
    run id is appended, so two run ids that sanitise alike (`a:b`, `a+b`) never share a folder.
    """
    if not run_id:
        raise ValueError("run_id is empty")
    safe = re.sub(r"[^A-Za-z0-9._-]", "-", run_id).strip(".-") or "run"
    if safe != run_id:
        safe = f"{safe[:80]}-{hashlib.sha1(run_id.encode()).hexdigest()[:6]}"
    return safe


@dataclass(frozen=True)
class RunLayout:
    """Paths of one run, relative to a volume root (`/data` in a pod, a local folder on the local backend)."""

    root: PurePosixPath
    pipeline: str
    key: str

    @classmethod
    def for_run(cls, root: str, pipeline: str, run_id: str) -> RunLayout:
        return cls(PurePosixPath(root), pipeline, run_key(run_id))

    @property
    def run_dir(self) -> PurePosixPath:
        return self.root / "runs" / self.pipeline / self.key

    def stage_dir(self, name: str) -> PurePosixPath:
        if name not in RUN_SUBDIRS:
            raise ValueError(f"unknown run sub-folder {name!r}; known: {', '.join(RUN_SUBDIRS)}")
        return self.run_dir / name

    def models_dir(self, model_name: str) -> PurePosixPath:
        return self.root / "models" / model_name


def published_versions(model_dir: Path) -> list[int]:
    """The integer version folders under `models/<name>/`, ascending; temporary and removed ones are hidden."""
    if not model_dir.is_dir():
        return []
    return sorted(int(p.name) for p in model_dir.iterdir() if p.name.isdigit())
