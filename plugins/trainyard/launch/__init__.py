"""Backends launch the pods a stage is made of. One seam: `launcher_for(name)`; the stage logic is shared.

The backends are the config schema's `Backend` names; `LAUNCHERS` builds each (imported lazily: the local backend
never loads the provider's operator). Adding one is a name there and a factory here (DESIGN.md, "Add a backend");
`tests/unit/test_kubernetes_backend.py` holds the two lists equal."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from trainyard.launch.base import Launcher
    from trainyard_contract.schema import PipelineConfig


def _local(config: PipelineConfig, images: Mapping[str, str] | None) -> Launcher:
    from trainyard.launch.local import LocalLauncher

    return LocalLauncher(config, images=images)


def _kubernetes(config: PipelineConfig, images: Mapping[str, str] | None) -> Launcher:
    from trainyard.launch.kubernetes import KubernetesLauncher

    return KubernetesLauncher(config)


LAUNCHERS: dict[str, Callable[[PipelineConfig, Mapping[str, str] | None], Launcher]] = {
    "local": _local, "kubernetes": _kubernetes}


def launcher_for(name: str, config: PipelineConfig, images: Mapping[str, str] | None = None) -> Launcher:
    """The launcher of backend `name`. `images` maps image repositories to entrypoint modules (from the stage
    registry): the local backend runs those images' modules as processes."""
    try:
        factory = LAUNCHERS[name]
    except KeyError:
        raise ValueError(f"unknown backend {name!r}; use one of {', '.join(map(repr, LAUNCHERS))}") from None
    return factory(config, images)
