"""A new stage is one declaration plus one entrypoint: the DAG, `render` and a local run pick it up unchanged.

The throwaway stage lives in tests/fixtures/echo_stage; nothing in plugins/ or images/ knows about it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from trainyard.config.loader import load_pipeline_file
from trainyard.dag.factory import build_dag
from trainyard.dag.registry import STAGES
from trainyard.launch.render import render_run
from trainyard_contract.layout import run_key, runs_dir

pytestmark = pytest.mark.integration

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
sys.path.insert(0, str(FIXTURES))

from echo_stage.artifacts import HELLO  # noqa: E402
from echo_stage.declaration import ECHO  # noqa: E402

SHIM = f'''"""Airflow DAG shim: the digits pipeline with the throwaway echo stage in front."""
import sys
sys.path.insert(0, {str(FIXTURES)!r})
from echo_stage.declaration import ECHO
from trainyard.config.loader import find_pipeline_file, load_pipeline_file
from trainyard.dag.factory import build_dag
from trainyard.dag.registry import STAGES
from trainyard.settings import pipelines_dir

dag = build_dag(load_pipeline_file(find_pipeline_file(pipelines_dir(), "digits")), stages=(ECHO, *STAGES))
'''


def test_the_declaration_alone_puts_the_stage_in_the_dag_and_the_manifests(pipelines_dir: Path) -> None:
    config = load_pipeline_file(pipelines_dir / "digits.yaml")
    dag = build_dag(config, stages=(ECHO, *STAGES))
    assert [t.task_id for t in dag.tasks][:2] == ["echo", "validate_data"]
    assert dag.get_task("validate_data").upstream_task_ids == {"echo"}
    row = "| `echo` | CPU | Writes what it was started with into the run folder. | - | `echo/hello.json` |"
    assert row in dag.doc_md
    pods = [m for m in render_run(config, "manual__r1", stages=(ECHO, *STAGES)) if m["kind"] == "Pod"]
    (echo,) = [p for p in pods if p["metadata"]["labels"]["trainyard/stage"] == "echo"]
    container = echo["spec"]["containers"][0]
    assert container["image"] == "trainyard/echo:0.1.0"
    assert container["command"] == ["python", "-m", "echo_stage"] and container["args"][0] == "hello"
    assert echo["spec"]["securityContext"]["runAsNonRoot"] is True  # the same hardening as every stage


def test_the_stage_runs_as_an_airflow_task_on_the_local_backend(pipelines_dir: Path, data_dir: Path,
                                                                tmp_path: Path) -> None:
    home, dags = tmp_path / "airflow", tmp_path / "dags"
    dags.mkdir()
    (dags / "digits_with_echo.py").write_text(SHIM)
    env = {**os.environ, "AIRFLOW_HOME": str(home), "AIRFLOW__CORE__DAGS_FOLDER": str(dags),
           "AIRFLOW__CORE__LOAD_EXAMPLES": "False", "PYTHONPATH": str(FIXTURES)}
    airflow = str(Path(sys.executable).with_name("airflow"))
    subprocess.run([airflow, "db", "migrate"], env=env, check=True, capture_output=True, timeout=300)
    done = subprocess.run([airflow, "tasks", "test", "digits", "echo", "2026-12-01"], env=env,
                          capture_output=True, text=True, timeout=300)
    log = done.stdout + done.stderr
    assert done.returncode == 0, log[-4000:]
    assert "local backend: running pod" in log and "echo_stage hello" in log
    (run_dir,) = runs_dir(data_dir, "digits").iterdir()
    seen = json.loads((run_dir / HELLO).read_text())
    assert seen["pipeline"] == "digits" and run_key(seen["run_id"]) == run_dir.name
    assert seen["window_end"].startswith("2026-12-01")
