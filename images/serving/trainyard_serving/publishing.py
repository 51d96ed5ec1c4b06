"""Model versions on the shared volume: publish, withdraw, and settle what a killed deploy left.

`models/<name>/` holds the integer version folders TF Serving (or the local server) polls, and some hidden files
that no server reads:
- `.publish.lock`: an exclusive lock per model name, held while a version number is taken and while leftovers are
  settled, so racing deploys get distinct numbers.
- `.last-version`: the highest number ever published. A number is never reused, even after a rollback removed the
  newest version: a client or a log that says "version 20" always means the same bytes.
- `.tmp-*` / `.removed-*`: a version being assembled or deleted. Only a live publisher has one, under the lock, so
  the next publisher deletes any it finds.
- `.unverified-<N>`: version N is published but its deploy has not verified it yet. The deploy holds an exclusive
  `flock` on this file from before the rename until the version is verified (the file is deleted) or withdrawn. A
  marker whose lock is free belongs to a deploy that died after publishing: the next deploy of the same run verifies
  that version (a retry does not publish the model again); any other deploy, or the local server when it starts,
  removes it, so an unverified version is never left serving.

A version's files are copies of the run's export, made read-only: editing a run's files in place never changes a
published version, and versions published from one run share nothing with each other.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import fcntl
import json
import os
import shutil
import stat
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from trainyard_contract import layout
from trainyard_contract.artifacts import VersionRecord
from trainyard_contract.atomic import fsync_dir, fsync_tree, write_bytes, write_json
from trainyard_contract.layout import published_versions
from trainyard_contract.runtime import StageError, log

LOCK_FILE = ".publish.lock"
LAST_VERSION_FILE = ".last-version"
UNVERIFIED_PREFIX = ".unverified-"
STAGING_PREFIXES = (".tmp-", ".removed-")
READ_ONLY = stat.S_IRUSR | stat.S_IRGRP | stat.S_IROTH


@contextlib.contextmanager
def model_lock(model_dir: Path) -> Iterator[None]:
    """An exclusive lock per model name on the shared volume, held while a version number is taken."""
    model_dir.mkdir(parents=True, exist_ok=True)
    with (model_dir / LOCK_FILE).open("a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def copy_read_only(source: Path, target: Path) -> None:
    """Recreate `source` under `target` as copies whose files are read-only (folders stay writable, so a
    rollback can delete them)."""
    for root, _, files in os.walk(source):
        rel = Path(root).relative_to(source)
        (target / rel).mkdir(parents=True, exist_ok=True)
        for name in files:
            copy = target / rel / name
            shutil.copyfile(Path(root) / name, copy)
            os.chmod(copy, READ_ONLY)


def remove_stale_staging(model_dir: Path) -> list[str]:
    """Delete what dead publishers left (`.tmp-*` being assembled, `.removed-*` being deleted). Called with the
    model lock held: a live publisher only has such a folder while it holds the lock, so these are all dead."""
    stale = sorted(p.name for p in model_dir.iterdir() if p.is_dir() and p.name.startswith(STAGING_PREFIXES))
    for name in stale:
        shutil.rmtree(model_dir / name, ignore_errors=True)
    if stale:
        log.warning("removed %d folder(s) a killed publish left in %s: %s", len(stale), model_dir, ", ".join(stale))
    return stale


def last_version(model_dir: Path) -> int:
    """The highest version number ever published here (the counter, or the folders when it is missing)."""
    counted = 0
    try:
        counted = int((model_dir / LAST_VERSION_FILE).read_text().strip() or 0)
    except (OSError, ValueError):
        pass
    return max([counted, *published_versions(model_dir)])


def unpublish(model_dir: Path, version: int) -> bool:
    """Remove a version in one rename (serving falls back to the previous one), then delete its files."""
    path = model_dir / str(version)
    if not path.exists():
        return False
    trash = model_dir / f".removed-{version}-{uuid.uuid4().hex[:8]}"
    os.rename(path, trash)
    fsync_dir(model_dir)
    shutil.rmtree(trash, ignore_errors=True)
    return True


@dataclass
class Publication:
    """A version this process published and has not verified yet; holds the lock on its `.unverified-N` marker."""

    model_dir: Path
    version: int
    marker: Path
    handle: IO[str] | None

    def verified(self) -> int:
        """The version passed its checks: it stays, and nobody will remove it as a leftover."""
        self.marker.unlink(missing_ok=True)
        self._release()
        return self.version

    def withdraw(self) -> bool:
        """Remove the version (a failed check, an interrupted deploy); True when it was still there."""
        removed = unpublish(self.model_dir, self.version)
        self.marker.unlink(missing_ok=True)
        self._release()
        return removed

    def _release(self) -> None:
        if self.handle is not None:
            self.handle.close()  # closing drops the flock
            self.handle = None


def hold_marker(marker: Path, owner: dict[str, Any]) -> IO[str]:
    """Create `.unverified-N` with its owner and hold an exclusive lock on it for as long as this process lives."""
    write_bytes(marker, json.dumps(owner).encode())
    handle = marker.open("r")
    fcntl.flock(handle, fcntl.LOCK_EX)
    return handle


def publish_unverified(model_dir: Path, saved_model: Path, metadata: VersionRecord,
                       owner: dict[str, Any] | None = None) -> Publication:
    """Publish `saved_model` as the next version and return it unverified (its marker held by this process).

    Durable across a crash or power loss: every file and folder of the staged version is fsynced before the
    rename, and the model folder after it, so a version that is visible is also complete on disk."""
    if not (saved_model / layout.SAVED_MODEL_PB).is_file():
        raise StageError(f"{saved_model} holds no {layout.SAVED_MODEL_PB}: did the train task export the model?")
    with model_lock(model_dir):
        remove_stale_staging(model_dir)
        version = last_version(model_dir) + 1
        staging = model_dir / f".tmp-{version}-{uuid.uuid4().hex[:8]}"
        marker = model_dir / f"{UNVERIFIED_PREFIX}{version}"
        handle = None
        renamed = False
        try:
            copy_read_only(saved_model, staging)
            metadata_path = staging / layout.VERSION_METADATA
            record = metadata.model_copy(update={"version": version, "published_by": "copy",
                                                 "published_at": dt.datetime.now(dt.UTC).isoformat()})
            write_json(metadata_path, record.model_dump())
            os.chmod(metadata_path, READ_ONLY)
            fsync_tree(staging)
            write_bytes(model_dir / LAST_VERSION_FILE, f"{version}\n".encode())
            handle = hold_marker(marker, {**(owner or {}), "version": version, "pid": os.getpid()})
            os.rename(staging, model_dir / str(version))
            renamed = True
            fsync_dir(model_dir)
        except BaseException:
            shutil.rmtree(staging, ignore_errors=True)
            if renamed:  # interrupted between the rename and the return: nobody would verify it
                unpublish(model_dir, version)
            marker.unlink(missing_ok=True)
            if handle is not None:
                handle.close()
            raise
    log.info("published %s version %d (not verified yet)", model_dir.name, version)
    return Publication(model_dir, version, marker, handle)


def publish(model_dir: Path, saved_model: Path, metadata: VersionRecord) -> int:
    """Publish and trust at once (no verification step): for tools and tests that verify by other means."""
    return publish_unverified(model_dir, saved_model, metadata).verified()


def try_lock(marker: Path) -> IO[str] | None:
    """The marker opened and locked when its deploy is gone; None while a live deploy holds it (or it vanished)."""
    try:
        handle = marker.open("r")
    except FileNotFoundError:
        return None
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        handle.close()
        return None
    if not marker.exists():  # settled by someone else between the open and the lock
        handle.close()
        return None
    return handle


def settle_unverified(model_dir: Path, adopt_run_dir: str | None = None) -> tuple[Publication | None, list[str]]:
    """Deal with versions whose deploy died after publishing them (their markers' locks are free).

    The one published by `adopt_run_dir` (this run's earlier attempt) is returned, still unverified and now held
    by this process, for the caller to verify; every other one is removed. Returns (adopted, what was done, one
    line each). Versions a live deploy is verifying are left alone."""
    if not model_dir.is_dir():
        return None, []
    adopted: Publication | None = None
    notes: list[str] = []
    with model_lock(model_dir):
        for marker in sorted(model_dir.glob(f"{UNVERIFIED_PREFIX}*")):
            handle = try_lock(marker)
            if handle is None:
                continue
            try:
                owner = json.loads(marker.read_text() or "{}")
            except (OSError, ValueError):
                owner = {}
            version_text = marker.name.removeprefix(UNVERIFIED_PREFIX)
            version = int(version_text) if version_text.isdigit() else None
            present = version is not None and (model_dir / str(version)).is_dir()
            if (adopted is None and present and adopt_run_dir is not None
                    and owner.get("run_dir") == adopt_run_dir):
                adopted = Publication(model_dir, version, marker, handle)  # type: ignore[arg-type]
                notes.append(f"version {version} was published by an earlier attempt of this run and never "
                             "verified: verifying it now instead of publishing the model again")
                continue
            if present:
                unpublish(model_dir, version)  # type: ignore[arg-type]
                notes.append(f"removed version {version} of {model_dir.name}: it was published by run "
                             f"{owner.get('run_id', '?')} whose deploy died before verifying it")
            marker.unlink(missing_ok=True)
            handle.close()
    for note in notes:
        log.warning("%s", note)
    return adopted, notes
