"""Write-then-rename helpers: a reader of the shared volume never sees a half-written file or folder."""

from __future__ import annotations

import glob
import json
import os
import shutil
import tempfile
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any


def fsync_dir(path: Path) -> None:
    """Make a folder's entries durable: a rename inside it is on disk once this returns."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_tree(root: Path) -> None:
    """Flush every file and folder under `root` (files first, then their folders, `root` last)."""
    for folder, _, files in os.walk(root, topdown=False):
        for name in files:
            fd = os.open(Path(folder) / name, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        fsync_dir(Path(folder))


def current_umask() -> int:
    """This process's umask, read without changing it (os.umask sets while it reads, racing other threads)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def file_mode() -> int:
    """The mode a plain `open()` would give a new file under this process's umask (0644 under 022, 0664 under
    002): what other users and the serving pods of a shared volume expect. `mkstemp` alone would give 0600."""
    return 0o666 & ~current_umask()


def write_bytes(path: Path, data: bytes) -> None:
    """Write `data` to a temporary sibling, fsync, then rename over `path` (and fsync the folder)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        os.fchmod(fd, file_mode())
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    fsync_dir(path.parent)


def write_json(path: Path, payload: Any) -> None:
    write_bytes(path, (json.dumps(payload, indent=2, sort_keys=True, default=str) + "\n").encode())


@contextmanager
def staged_dir(final: Path) -> Iterator[Path]:
    """Yield an empty temporary sibling of `final`; on success it replaces `final` in two renames.

    A retry that finds an old `final` moves it aside first and removes it only after the new one is in place, so a
    reader finds the complete old folder, the complete new one, or (between the two renames) none, never a
    mix. On failure the temporary folder is removed and `final` is untouched. A writer killed outright (SIGKILL,
    a lost node) cannot clean up: the next writer of the same folder removes what it left first, so a retry
    does not keep a dead attempt's gigabytes of shards. One writer per folder at a time (one task attempt).
    """
    final.parent.mkdir(parents=True, exist_ok=True)
    for kind in ("tmp", "old"):
        for leftover in final.parent.glob(f".{glob.escape(final.name)}.{kind}-*"):
            shutil.rmtree(leftover, ignore_errors=True)
    tmp = final.parent / f".{final.name}.tmp-{uuid.uuid4().hex[:8]}"
    tmp.mkdir()
    try:
        yield tmp
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    old = None
    if final.exists():
        old = final.parent / f".{final.name}.old-{uuid.uuid4().hex[:8]}"
        os.rename(final, old)
    os.rename(tmp, final)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)
