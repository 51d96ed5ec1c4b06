"""The image -> local command mapping used by the local backend.

A pod runs `python -m <module> ...` inside one of Trainyard's images; locally the same module runs with this
venv's interpreter (or `TRAINYARD_STAGE_PYTHON`'s). The table of images and their modules comes from the stage
registry (`registry.images`); an image outside it cannot run on the local backend, and says so.
"""

from __future__ import annotations

from collections.abc import Mapping

from trainyard import settings


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


def local_command(image: str, command: list[str], images: Mapping[str, str]) -> list[str]:
    """The local argv for a container's command, or a ValueError that says what the local backend can run."""
    repository = image_repository(image)
    module = images.get(repository)
    if module is None:  # under a registry path (kubernetes.registry): registry.example.com/ml/trainyard/prep
        module = next((images[known] for known in sorted(images) if repository.endswith(f"/{known}")), None)
    if module is None:
        known = ", ".join(sorted(images))
        raise ValueError(
            f"image {image!r} has no local equivalent; the local backend runs Trainyard's own images ({known}). "
            "Use the kubernetes backend for custom images."
        )
    expected = ["python", "-m", module]
    if list(command[:3]) != expected:
        raise ValueError(f"image {image!r} runs {expected!r} locally, but the pod's command is {command!r}")
    return [settings.stage_python(), "-m", module, *command[3:]]
