"""How pinned files are cut into the groups of a fanned-out run: consecutive, non-empty, balanced by bytes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from trainyard_contract import layout
from trainyard_contract.runtime import StageError
from trainyard_prep.groups import cut_into_groups, group_entries, load_groups, write_groups


@pytest.mark.parametrize(("sizes", "parallelism", "expected"), [
    ([10, 10, 10, 10], 2, [[0, 1], [2, 3]]),
    ([10, 10, 10, 10, 10], 2, [[0, 1, 2], [3, 4]]),  # a tie: the later cut
    ([100, 1, 1, 1], 2, [[0], [1, 2, 3]]),  # a big file alone
    ([1, 1, 1, 100], 2, [[0, 1, 2], [3]]),
    ([1, 2, 3, 4, 5, 6], 3, [[0, 1, 2], [3, 4], [5]]),  # 6 / 9 / 6 bytes
    ([0, 0, 0, 0, 0], 3, [[0], [1], [2, 3, 4]]),  # empty files still give non-empty groups
    ([7], 4, [[0]]),  # never more groups than files
    ([3, 3, 3], 5, [[0], [1], [2]]),
    ([5, 5], 1, [[0, 1]]),
    ([], 3, []),
])
def test_files_are_cut_into_consecutive_groups_balanced_by_bytes(sizes: list[int], parallelism: int,
                                                                 expected: list[list[int]]) -> None:
    assert cut_into_groups(sizes, parallelism) == expected


@pytest.mark.parametrize("parallelism", range(1, 12))
def test_every_file_is_in_exactly_one_group_in_manifest_order(parallelism: int) -> None:
    sizes = [(i * 7919) % 23 + 1 for i in range(9)]
    groups = cut_into_groups(sizes, parallelism)
    assert [i for group in groups for i in group] == list(range(9))
    assert len(groups) == min(parallelism, 9) and all(groups)


def test_parallelism_below_one_is_refused() -> None:
    with pytest.raises(ValueError, match="at least 1"):
        cut_into_groups([1, 2], 0)


def manifest(*sizes: int) -> dict:
    files = [{"source": f"datasets/t/date=2026-11-0{i + 1}/part-0.csv", "bytes": size} for i, size in enumerate(sizes)]
    return {"files": files, "total_bytes": sum(sizes)}


def test_groups_are_written_beside_the_manifest_and_name_their_files(tmp_path: Path) -> None:
    pinned = manifest(10, 10, 30)
    written = write_groups(tmp_path, pinned, 2)
    assert json.loads((tmp_path / layout.INPUT_GROUPS).read_text()) == written == load_groups(tmp_path)
    assert [(g["index"], g["bytes"]) for g in written["groups"]] == [(0, 20), (1, 30)]
    assert group_entries(pinned, written, 1) == [pinned["files"][2]]
    with pytest.raises(StageError, match="group 2 does not exist: the run's inputs are cut into 2 group"):
        group_entries(pinned, written, 2)


def test_a_group_stage_before_pin_says_what_must_run_first(tmp_path: Path) -> None:
    with pytest.raises(StageError, match="pin_inputs cuts the pinned files into groups and must run first"):
        load_groups(tmp_path)
