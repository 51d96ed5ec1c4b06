"""Write-then-rename helpers: complete files only, readable by the group and the serving pods (the umask's mode)."""

from __future__ import annotations

import json
import os
import signal
import stat
import subprocess
import sys
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


KILLED_WRITER = """
import os, signal, sys
from pathlib import Path
from trainyard_contract.atomic import staged_dir, write_json
with staged_dir(Path(sys.argv[1])) as out:
    write_json(out / "part.json", {"half": "written"})
    os.kill(os.getpid(), signal.SIGKILL)
"""


def test_the_next_writer_removes_what_a_killed_writer_left(tmp_path: Path) -> None:
    write_json(tmp_path / "stage" / "a.json", {"v": 1})
    write_json(tmp_path / "stage-2" / "a.json", {"v": 1})
    for folder in ("stage", "stage-2"):
        killed = subprocess.run([sys.executable, "-c", KILLED_WRITER, str(tmp_path / folder)], check=False)
        assert killed.returncode == -signal.SIGKILL
    (tmp_path / ".stage.old-0badc0de").mkdir()  # killed between its two renames, another time
    assert len(list(tmp_path.glob(".stage.tmp-*"))) == 1

    with staged_dir(tmp_path / "stage") as out:
        write_json(out / "a.json", {"v": 2})

    assert json.loads((tmp_path / "stage" / "a.json").read_text()) == {"v": 2}
    assert list(tmp_path.glob(".stage.*")) == []  # the dead attempt's temporary and moved-aside folders
    assert len(list(tmp_path.glob(".stage-2.tmp-*"))) == 1  # another folder's leftover is its own writer's
    assert sorted(p.name for p in tmp_path.iterdir() if not p.name.startswith(".")) == ["stage", "stage-2"]
