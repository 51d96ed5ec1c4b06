"""Backends launch the pods a stage is made of. One seam: `launcher_for(name)`; the stage logic is shared."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from trainyard.backends.base import Launcher
    from trainyard.schema import PipelineConfig


def launcher_for(name: str, config: PipelineConfig) -> Launcher:
    """The launcher of backend `name` (imported lazily: the local backend never loads the provider's operator)."""
    if name == "local":
        from trainyard.backends.local import LocalLauncher

        return LocalLauncher()
    if name == "kubernetes":
        from trainyard.backends.kubernetes import KubernetesLauncher

        return KubernetesLauncher(config)
    raise ValueError(f"unknown backend {name!r}; use 'local' or 'kubernetes'")
