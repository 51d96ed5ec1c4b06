"""Pin a run's inputs: pick the partitions in its window, hardlink them under the run folder, hash them.

The snapshot makes re-runs (retries, clears) read exactly the same bytes even after new partitions land, without
copying data: hardlinks share the blocks on the same volume.

Symbolic links are not followed silently: a hardlink of a symlink is the link itself, so the "snapshot" would
change whenever its target did, and the target may be outside the volume. A link in the dataset folder (the
folder itself, a partition or a file) fails the run with the link named, or with `data.symlinks: copy` its
target is copied into the snapshot and the manifest says so (`pinned_by: copy`, `symlink_target`).
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import os
import re
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trainyard_contract import artifacts, layout
from trainyard_contract.artifacts import InputsManifest
from trainyard_contract.atomic import staged_dir
from trainyard_contract.runtime import StageError, log
from trainyard_contract.schema import DataConfig


@dataclass(frozen=True)
class Partition:
    day: dt.date
    path: Path


def list_partitions(source: Path, key: str) -> list[Partition]:
    if not source.is_dir():
        raise StageError(f"data source {source} does not exist (data.source in the pipeline config)")
    pattern = re.compile(rf"^{re.escape(key)}=(\d{{4}}-\d{{2}}-\d{{2}})$")
    found = []
    for child in sorted(source.iterdir()):
        match = pattern.match(child.name)
        if match and child.is_dir():
            try:
                found.append(Partition(dt.date.fromisoformat(match.group(1)), child))
            except ValueError:
                raise StageError(f"{child}: {match.group(1)!r} is not a valid date") from None
    return found


def select_window(partitions: list[Partition], end: dt.datetime | None, days: int | None) -> list[Partition]:
    """Partitions whose day starts before `end` (all if no end) and, with a window, no earlier than `end - days`.

    A daily run for the interval [Dec 1, Dec 2) with `days: 1` reads exactly the Dec 1 partition.
    """
    if end is None:
        return list(partitions)
    end = end if end.tzinfo else end.replace(tzinfo=dt.UTC)
    start = end - dt.timedelta(days=days) if days is not None else None
    chosen = []
    for part in partitions:
        day_start = dt.datetime.combine(part.day, dt.time(), tzinfo=dt.UTC)
        if day_start < end and (start is None or day_start >= start):
            chosen.append(part)
    return chosen


def data_files(partition: Path, suffix: str) -> list[Path]:
    """A partition's data files; hidden and `_`-prefixed files (`_SUCCESS`, temp files) are not data."""
    return sorted(p for p in partition.iterdir() if p.is_file() and p.suffix == suffix and p.name[0] not in "._")


def sha256_file(path: Path, block: int = 1 << 20) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        while chunk := handle.read(block):
            digest.update(chunk)
    return digest.hexdigest()


def refuse_link(path: Path, source: Path) -> None:
    target = os.readlink(path)
    raise StageError(f"{path} is a symbolic link (to {target}): a dataset must stay inside the volume and not "
                     f"change under a pinned run; copy the data into {source}, or set `data.symlinks: copy` to pin "
                     "a copy of what the link points to")


def linked_path(path: Path, source: Path, symlinks: str) -> str | None:
    """None for a plain file or folder; the resolved target of a link that may be followed (`copy`)."""
    if not path.is_symlink():
        return None
    if symlinks != "copy":
        refuse_link(path, source)
    resolved = path.resolve()
    if not resolved.exists():
        raise StageError(f"{path} is a symbolic link to {os.readlink(path)}, which does not exist")
    return str(resolved)


def _link_or_copy(src: Path, dst: Path, follow: bool = False) -> str:
    """`follow`: src is (or lies under) a symbolic link, so its target's bytes are copied."""
    if follow:
        shutil.copyfile(src, dst)
        return "copy"
    try:
        os.link(src, dst)
        return "hardlink"
    except OSError as exc:
        log.warning("cannot hardlink %s (%s); copying instead (is the run folder on another filesystem?)", src, exc)
        shutil.copy2(src, dst)
        return "copy"


def pin_inputs(volume: Path, run_dir: Path, data: DataConfig, window_end: dt.datetime | None,
               trigger: dict[str, Any] | None = None) -> dict[str, Any]:
    """The run's input manifest; created once per run, reused as is by retries and later stages.

    `trigger` (run type and Param values) is recorded beside the pinned files: the lineage of what was asked for.
    """
    inputs_dir = run_dir / layout.INPUTS
    manifest_path = run_dir / layout.INPUTS_MANIFEST
    if manifest_path.is_file():
        log.info("inputs already pinned for this run: %s", manifest_path)
        return load_manifest(run_dir)
    source = volume / data.source
    source_link = linked_path(source, volume, data.symlinks)
    partitions = list_partitions(source, data.partition_key)
    days = data.window.days if data.window else None
    chosen = select_window(partitions, window_end, days)
    if not chosen:
        span = f"{partitions[0].day}..{partitions[-1].day}" if partitions else "none"
        window = f"the {days} day(s) before {window_end}" if days else f"before {window_end}"
        raise StageError(
            f"no partitions of {data.source} in the run's window ({window}); "
            f"{len(partitions)} partition(s) exist ({span}). Add data or widen data.window."
        )
    files: list[dict[str, Any]] = []
    with staged_dir(inputs_dir) as staging:
        for part in chosen:
            part_link = linked_path(part.path, source, data.symlinks) or source_link
            for path in sorted(p for p in part.path.iterdir() if p.suffix == f".{data.format}" and p.is_symlink()
                               and p.name[0] not in "._"):
                linked_path(path, source, data.symlinks)  # refused here, or a dangling one named
            found = data_files(part.path, f".{data.format}")
            if not found:
                raise StageError(f"{part.path}: partition has no .{data.format} files")
            (staging / part.path.name).mkdir()
            for path in found:
                target = (str(path.resolve()) if path.is_symlink() or part_link else None)
                how = _link_or_copy(path, staging / part.path.name / path.name, follow=target is not None)
                entry = {
                    "source": str(path.relative_to(volume)),
                    "snapshot": f"{layout.INPUTS}/{part.path.name}/{path.name}",
                    "partition": part.day.isoformat(),
                    "bytes": (staging / part.path.name / path.name).stat().st_size,
                    "sha256": sha256_file(staging / part.path.name / path.name),
                    "pinned_by": how,
                }
                if target is not None:
                    entry["symlink_target"] = target
                files.append(entry)
        manifest = {
            "source": data.source,
            "window_end": window_end.isoformat() if window_end else None,
            "window_days": days,
            "partitions": [p.day.isoformat() for p in chosen],
            "files": files,
            "total_bytes": sum(f["bytes"] for f in files),
            "trigger": trigger,
        }
        artifacts.write(staging / layout.INPUTS_MANIFEST.name, InputsManifest(**manifest))
    log.info("pinned %d file(s) from %d partition(s), %.1f MB", len(files), len(chosen), manifest["total_bytes"] / 1e6)
    return manifest


def load_run_json(run_dir: Path, artifact: layout.Artifact, written_by: str) -> dict[str, Any]:
    """A JSON artifact an earlier stage of this run wrote; a clear error naming that stage when it is missing."""
    path = run_dir / artifact
    if not path.is_file():
        raise StageError(f"{path} is missing: {written_by} and must run first")
    return json.loads(path.read_text())


def load_manifest(run_dir: Path) -> dict[str, Any]:
    """The pinned inputs, checked against what pinning writes (a hand-edited manifest is bad input, named)."""
    manifest = artifacts.read(run_dir, layout.INPUTS_MANIFEST, InputsManifest, "validate_data",
                              "the stages after it")
    return manifest.model_dump(exclude_unset=True)
