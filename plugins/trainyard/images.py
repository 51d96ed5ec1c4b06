"""The explicit image -> local command mapping used by the local backend.

A pod runs `python -m <module> ...` inside one of Trainyard's images; locally the same module runs with this
venv's interpreter. Images outside this table cannot run on the local backend, and say so.
"""

from __future__ import annotations

import sys

LOCAL_IMAGE_MODULES: dict[str, str] = {
    "trainyard/prep": "trainyard_prep",
    "trainyard/trainer": "trainyard_trainer",
    "trainyard/evaluate": "trainyard_trainer",
    "trainyard/serving": "trainyard_serving",
}


def image_repository(image: str) -> str:
    """`registry:5000/trainyard/prep:0.1.0@sha256:..` -> `trainyard/prep` (registry host and tag dropped)."""
    name = image.split("@", 1)[0]
    last = name.rsplit("/", 1)
    if ":" in last[-1]:
        name = name[: name.rindex(":")]
    parts = name.split("/")
    if len(parts) > 2 and ("." in parts[0] or ":" in parts[0] or parts[0] == "localhost"):
        parts = parts[1:]
    return "/".join(parts)


def local_command(image: str, command: list[str]) -> list[str]:
    """The local argv for a container's command, or a ValueError that says what the local backend can run."""
    repository = image_repository(image)
    module = LOCAL_IMAGE_MODULES.get(repository)
    if module is None:
        known = ", ".join(sorted(LOCAL_IMAGE_MODULES))
        raise ValueError(
            f"image {image!r} has no local equivalent; the local backend runs Trainyard's own images ({known}). "
            "Use the kubernetes backend for custom images."
        )
    expected = ["python", "-m", module]
    if list(command[:3]) != expected:
        raise ValueError(f"image {image!r} runs {expected!r} locally, but the pod's command is {command!r}")
    return [sys.executable, "-m", module, *command[3:]]
