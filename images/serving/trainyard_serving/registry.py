"""Model versions on disk -> loaded SavedModels, following TF Serving's default policy: serve the latest version.

`models/<name>/<version>/` folders are polled every `poll_seconds`. A new latest version is loaded while the old
one keeps serving, then swapped in with one reference assignment, so requests never fail during a switch. When the
latest version disappears (a rollback), the highest remaining one is served again. A version that fails to load is
reported END with its error and never served; the next older one is tried in the same poll, so a server started
over several broken newest versions serves the last good one from its first answer.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import tensorflow as tf
from tensorflow.core.protobuf import saved_model_pb2

from trainyard_contract.layout import SAVED_MODEL_PB

log = logging.getLogger("trainyard.serving")

SIGNATURE = "serving_default"


class NotFound(LookupError):
    """Unknown model or version (HTTP 404, gRPC NOT_FOUND)."""


def unknown_label(label: str) -> str:
    """TF Serving's answer for a version label its config does not define (HTTP 400, gRPC INVALID_ARGUMENT); the
    local server has no label config, so every label is unknown to it."""
    return f"Unrecognized servable version label: {label}"


@dataclass
class LoadedVersion:
    name: str
    version: int
    path: Path
    module: Any
    signature: Any
    inputs: dict[str, tf.TensorSpec]
    outputs: dict[str, tf.TensorSpec]
    signature_defs: Any  # map<string, SignatureDef> from saved_model.pb

    @classmethod
    def load(cls, name: str, version: int, path: Path) -> LoadedVersion:
        module = tf.saved_model.load(str(path))
        if SIGNATURE not in module.signatures:
            raise ValueError(f"no {SIGNATURE!r} signature (has: {sorted(module.signatures)})")
        signature = module.signatures[SIGNATURE]
        saved = saved_model_pb2.SavedModel()
        saved.ParseFromString((path / SAVED_MODEL_PB).read_bytes())
        return cls(name=name, version=version, path=path, module=module, signature=signature,
                   inputs=dict(signature.structured_input_signature[1]),
                   outputs=dict(signature.structured_outputs), signature_defs=saved.meta_graphs[0].signature_def)


@dataclass
class VersionStatus:
    state: str  # START, LOADING, AVAILABLE, UNLOADING, END
    error: str = ""


@dataclass
class ModelState:
    serving: LoadedVersion | None = None
    statuses: dict[int, VersionStatus] = field(default_factory=dict)
    failed: dict[int, float] = field(default_factory=dict)  # version -> mtime of the folder that failed


def disk_versions(model_dir: Path) -> dict[int, Path]:
    """Integer-named version folders that hold a saved_model.pb (temporary and hidden folders are ignored)."""
    found = {}
    if model_dir.is_dir():
        for child in model_dir.iterdir():
            if child.name.isdigit() and (child / SAVED_MODEL_PB).is_file():
                found[int(child.name)] = child
    return found


class ModelRegistry:
    def __init__(self, base: Path, poll_seconds: float = 1.0):
        self.base = base
        self.poll_seconds = poll_seconds
        self.models: dict[str, ModelState] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # --- lookups (any thread) -------------------------------------------------------------------------------
    def get(self, name: str, version: int | None = None) -> LoadedVersion:
        state = self.models.get(name)
        serving = state.serving if state else None
        if serving is None:
            raise NotFound(f"Servable not found for request: Latest({name})" if version is None
                           else f"Servable not found for request: Specific({name}, {version})")
        if version is not None and version != serving.version:
            raise NotFound(f"Servable not found for request: Specific({name}, {version})")
        return serving

    def status(self, name: str, version: int | None = None) -> list[tuple[int, VersionStatus]]:
        state = self.models.get(name)
        if state is None or not state.statuses:
            raise NotFound(f"Could not find any versions of model {name}")
        items = sorted(state.statuses.items())
        if version is not None:
            items = [(v, s) for v, s in items if v == version]
            if not items:
                raise NotFound(f"Could not find version {version} of model {name}")
        return items

    # --- polling -------------------------------------------------------------------------------------------
    def poll_once(self) -> None:
        if not self.base.is_dir():
            return
        for model_dir in sorted(p for p in self.base.iterdir() if p.is_dir() and not p.name.startswith(".")):
            with self._lock:
                self._reconcile(model_dir.name, disk_versions(model_dir))

    def _reconcile(self, name: str, versions: dict[int, Path]) -> None:
        state = self.models.setdefault(name, ModelState())
        for version, path in versions.items():
            mtime = path.stat().st_mtime
            if version in state.failed and state.failed[version] != mtime:
                del state.failed[version]  # the folder was replaced: try again
        candidates = [v for v in versions if v not in state.failed]
        current = state.serving.version if state.serving else None
        for version in list(state.statuses):
            if version not in versions and version != current:
                state.statuses.pop(version)
        loaded = None
        for target in sorted(candidates, reverse=True):  # the newest that loads, all in this one poll
            if target == current:
                return
            state.statuses[target] = VersionStatus("LOADING")
            try:
                loaded = LoadedVersion.load(name, target, versions[target])
                break
            except Exception as exc:  # any load failure: report it, try the next older one, keep serving
                state.failed[target] = versions[target].stat().st_mtime
                state.statuses[target] = VersionStatus("END", f"failed to load version {target}: {exc}")
                log.error("%s: version %d failed to load: %s", name, target, exc)
        if loaded is None:
            return
        target = loaded.version
        previous = state.serving
        state.serving = loaded  # the switch: one reference assignment
        state.statuses[target] = VersionStatus("AVAILABLE")
        if previous is not None:
            state.statuses[previous.version] = VersionStatus("END")
            if previous.version not in versions:
                state.statuses.pop(previous.version, None)
        log.info("%s: serving version %d (was %s)", name, target, previous.version if previous else "none")

    def start(self) -> None:
        self.poll_once()
        self._thread = threading.Thread(target=self._loop, name="model-poller", daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        while not self._stop.wait(self.poll_seconds):
            try:
                self.poll_once()
            except Exception:  # a poll must never kill the server
                log.exception("polling %s failed", self.base)

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
