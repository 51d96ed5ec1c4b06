"""File groups: how the pinned input files are shared out among the mapped validate / prepare tasks.

A group is a run of consecutive files of the input manifest, so reading the groups one after the other reads the
files in manifest order: concatenating each group's shard parts in group order gives the bytes one pod would have
written, and folding each file's partial statistics in manifest order gives the same numbers, whatever the number
of groups. The unit is a whole file (a partition usually holds one or a few), so a run never has more groups
than files. Groups are balanced by bytes: each cut falls where the running total comes nearest its share.
"""

from __future__ import annotations

import bisect
import itertools
import json
from pathlib import Path
from typing import Any

from trainyard_contract import layout
from trainyard_contract.atomic import write_json
from trainyard_contract.runtime import StageError
from trainyard_prep.inputs import load_run_json


def cut_into_groups(sizes: list[int], parallelism: int) -> list[list[int]]:
    """Indices of the files in each group: `min(parallelism, files)` non-empty runs of consecutive files, each
    holding about its share of the bytes."""
    if parallelism < 1:
        raise ValueError(f"parallelism must be at least 1, not {parallelism}")
    count = min(parallelism, len(sizes))
    if count == 0:
        return []
    prefix = list(itertools.accumulate(sizes, initial=0))  # prefix[i]: the bytes of the first i files
    cuts = [0]
    for group in range(1, count):
        share = prefix[-1] * group / count
        reached = bisect.bisect_left(prefix, share)  # the first cut at or past the share, or the one before it
        if reached > 0 and share - prefix[reached - 1] < prefix[min(reached, len(sizes))] - share:
            reached -= 1
        cuts.append(min(max(reached, cuts[-1] + 1), len(sizes) - (count - group)))  # every group non-empty
    cuts.append(len(sizes))
    return [list(range(start, end)) for start, end in itertools.pairwise(cuts)]


def write_groups(run_dir: Path, manifest: dict[str, Any], parallelism: int) -> dict[str, Any]:
    """`inputs/groups.json` for the pinned manifest (rewritten each time: it is a pure function of both)."""
    files = manifest["files"]
    groups = cut_into_groups([int(f["bytes"]) for f in files], parallelism)
    document = {
        "parallelism": parallelism,
        "groups": [{"index": i, "files": [files[f]["source"] for f in members],
                    "bytes": sum(int(files[f]["bytes"]) for f in members)} for i, members in enumerate(groups)],
    }
    write_json(run_dir / layout.INPUT_GROUPS, document)
    return document


def load_groups(run_dir: Path) -> dict[str, Any]:
    return load_run_json(run_dir, layout.INPUT_GROUPS, "pin_inputs cuts the pinned files into groups")


def group_entries(manifest: dict[str, Any], groups: dict[str, Any], group: int) -> list[dict[str, Any]]:
    """The manifest entries of group `group`, in manifest order."""
    known = groups["groups"]
    if not 0 <= group < len(known):
        raise StageError(f"group {group} does not exist: the run's inputs are cut into {len(known)} group(s) "
                         f"({layout.INPUT_GROUPS})")
    by_source = {entry["source"]: entry for entry in manifest["files"]}
    return [by_source[source] for source in known[group]["files"]]


def load_group_parts(parts: list[Path], name: str, written_by: str) -> list[dict[str, Any]]:
    """The JSON file `name` of each group's part folder, in group order; a missing one names the stage that
    did not finish for its group."""
    found = []
    for part in parts:
        if not (part / name).is_file():
            raise StageError(f"{part / name} is missing: {written_by} did not finish for that group")
        found.append(json.loads((part / name).read_text()))
    return found
