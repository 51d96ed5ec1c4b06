"""Write-then-rename helpers: complete files only, readable by the group and the serving pods (the umask's mode)."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest

from trainyard_contract.atomic import staged_dir, write_json


@pytest.mark.parametrize(("umask", "mode"), [(0o022, 0o644), (0o002, 0o664), (0o077, 0o600)])
def test_files_get_the_mode_the_umask_gives(tmp_path: Path, umask: int, mode: int) -> None:
    previous = os.umask(umask)
    try:
        write_json(tmp_path / "a.json", {"accuracy": 0.9})
        with staged_dir(tmp_path / "stage") as out:
            write_json(out / "b.json", {"deploy": True})
    finally:
        os.umask(previous)
    assert stat.S_IMODE((tmp_path / "a.json").stat().st_mode) == mode  # mkstemp alone: 0600
    assert stat.S_IMODE((tmp_path / "stage" / "b.json").stat().st_mode) == mode
    assert stat.S_IMODE((tmp_path / "stage").stat().st_mode) == 0o777 & ~umask
    assert json.loads((tmp_path / "a.json").read_text()) == {"accuracy": 0.9}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.json", "stage"]  # no temporary left


def test_a_failed_stage_folder_leaves_the_old_one_untouched(tmp_path: Path) -> None:
    write_json(tmp_path / "stage" / "a.json", {"v": 1})
    with pytest.raises(RuntimeError), staged_dir(tmp_path / "stage") as out:
        write_json(out / "a.json", {"v": 2})
        raise RuntimeError("the stage crashed")
    assert json.loads((tmp_path / "stage" / "a.json").read_text()) == {"v": 1}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["stage"]
