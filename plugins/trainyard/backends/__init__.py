"""Backends launch the pods a stage is made of. One seam: `launcher_for(name)`; the stage logic is shared."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from trainyard.backends.base import Launcher


def launcher_for(name: str) -> Launcher:
    """The launcher of backend `name` (imported lazily: the local backend never loads the Kubernetes client)."""
    if name == "local":
        from trainyard.backends.local import LocalLauncher

        return LocalLauncher()
    if name == "kubernetes":
        raise NotImplementedError(
            "the kubernetes backend is not available in this Trainyard version yet; "
            "unset TRAINYARD_BACKEND or set `backend: local` in the pipeline config"
        )
    raise ValueError(f"unknown backend {name!r}; use 'local' or 'kubernetes'")
