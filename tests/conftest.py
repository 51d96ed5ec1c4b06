"""Shared fixtures: every test gets its own pipelines folder and volume root, never the repo's."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
# The embedded Airflow home that `make test` bootstraps; set before any test imports Airflow.
os.environ.setdefault("AIRFLOW_HOME", str(REPO / ".airflow"))
EXAMPLES = REPO / "pipelines_config"


@pytest.fixture
def pipelines_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A copy of the example pipelines (and defaults) that tests may edit."""
    folder = tmp_path / "pipelines"
    shutil.copytree(EXAMPLES, folder)
    monkeypatch.setenv("TRAINYARD_PIPELINES_DIR", str(folder))
    return folder


@pytest.fixture
def data_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    folder = tmp_path / "volume"
    folder.mkdir()
    monkeypatch.setenv("TRAINYARD_DATA_DIR", str(folder))
    monkeypatch.delenv("TRAINYARD_BACKEND", raising=False)
    return folder
