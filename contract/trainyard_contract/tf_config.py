"""TF_CONFIG, read once into a typed object."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass

from trainyard_contract.runtime import StageError


@dataclass(frozen=True)
class TaskConfig:
    cluster: dict[str, list[str]]
    role: str
    index: int

    @property
    def is_chief(self) -> bool:
        return self.role == "chief"

    def count(self, role: str) -> int:
        return len(self.cluster.get(role, []))


def read_tf_config(environ: dict[str, str] | None = None) -> TaskConfig | None:
    """The task from TF_CONFIG, or None when unset (single-process training)."""
    raw = (environ if environ is not None else os.environ).get("TF_CONFIG")
    if not raw:
        return None
    try:
        data = json.loads(raw)
        return TaskConfig(cluster=data["cluster"], role=data["task"]["type"], index=int(data["task"]["index"]))
    except (ValueError, KeyError, TypeError) as exc:
        raise StageError(f"TF_CONFIG is not a valid cluster spec: {exc}") from None
