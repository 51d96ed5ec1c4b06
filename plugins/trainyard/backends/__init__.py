"""Backends launch the pods a stage is made of. One seam: `launcher_for(name)`; the stage logic is shared."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from trainyard.backends.base import Launcher
    from trainyard_contract.schema import PipelineConfig


def launcher_for(name: str, config: PipelineConfig, images: Mapping[str, str] | None = None) -> Launcher:
    """The launcher of backend `name` (imported lazily: the local backend never loads the provider's operator).

    `images` maps image repositories to entrypoint modules (from the stage registry): the local backend runs
    those images' modules as processes."""
    if name == "local":
        from trainyard.backends.local import LocalLauncher

        return LocalLauncher(images=images)
    if name == "kubernetes":
        from trainyard.backends.kubernetes import KubernetesLauncher

        return KubernetesLauncher(config)
    raise ValueError(f"unknown backend {name!r}; use 'local' or 'kubernetes'")
