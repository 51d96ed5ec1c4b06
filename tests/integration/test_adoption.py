"""Adopting Trainyard on an Airflow one already runs: the wheel `make wheel` builds, installed into a fresh venv that
has Airflow and nothing of this checkout, parses and runs (`airflow dags test`) a team's own folder outside the
repository: its config, its DAG shim, a bad config beside them that breaks only its own DAG, and a dataset whose
column `od280/od315_of_diluted_wines` (scikit-learn's own name) is mapped with `source_column` and served as an
identifier. The stages run with the checkout's interpreter (`TRAINYARD_STAGE_PYTHON`), as they would in their
images."""

from __future__ import annotations

import datetime as dt
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO
from tests.integration.serving_helpers import Server, http
from trainyard_contract import layout

pytestmark = pytest.mark.integration

WINE_CONFIG = """\
name: wine
description: scikit-learn's wine data, its column names as they come
owner: team-a
schedule: null
start_date: 2026-01-01
data:
  source: datasets/wine
  format: parquet
  label: {name: cultivar, source_column: target, classes: [0, 1, 2]}
  features:
    - {name: alcohol, dtype: float}
    - {name: malic_acid, dtype: float}
    - {name: flavanoids, dtype: float}
    - {name: color_intensity, dtype: float, source_column: "color intensity"}
    - {name: od280_od315, dtype: float, source_column: "od280/od315_of_diluted_wines"}
    - {name: proline, dtype: float}
  split: {eval_fraction: 0.25, seed: 3}
training:
  model: {module: trainyard_trainer.models.mlp, params: {hidden_units: [16]}}
  steps: 120
  batch_size: 32
  learning_rate: 0.05
evaluation:
  metrics: [accuracy, loss]
  thresholds: {accuracy: {min: 0.0}}
"""
# the README's shim (Airflow's safe mode parses only files that name both "airflow" and "dag")
SHIM = '"""Airflow DAG shim: Trainyard builds it from ../pipelines_config/{name}.yaml."""\n' \
       "from trainyard.dag.factory import dag_from_config\n\ndag = dag_from_config(\"{name}\")\n"


@pytest.fixture(scope="module")
def airflow_venv(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fresh venv with the pinned Airflow and cncf provider and Trainyard's two wheels: no TensorFlow, no
    pandas, nothing of the checkout on its path."""
    root = tmp_path_factory.mktemp("adopt")
    dist = root / "dist"
    built = subprocess.run(["scripts/build-wheel.sh"], cwd=REPO, env={**os.environ, "DIST": str(dist),
                                                                      "PYTHON": sys.executable},
                           capture_output=True, text=True, timeout=300)
    assert built.returncode == 0, built.stderr[-3000:]
    wheels = sorted(str(p) for p in dist.glob("*.whl"))
    assert [Path(w).name for w in wheels] == ["trainyard-0.1.0-py3-none-any.whl",
                                              "trainyard_contract-0.1.0-py3-none-any.whl"]
    venv = root / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    pins = [line.strip() for line in (REPO / "requirements.txt").read_text().splitlines()
            if line.startswith(("apache-airflow==", "apache-airflow-providers-cncf-kubernetes=="))]
    installed = subprocess.run([str(venv / "bin/python"), "-m", "pip", "install", "-q", "--disable-pip-version-check",
                                "-c", str(REPO / "constraints.txt"), *pins, *wheels],
                               capture_output=True, text=True, timeout=900)
    assert installed.returncode == 0, installed.stderr[-3000:]
    return venv


def team_folder(root: Path) -> Path:
    """The team's repository: `dags/` and `pipelines_config/` side by side, the wine dataset on a volume."""
    from sklearn.datasets import load_wine

    repo = root / "team-repo"
    (repo / "dags").mkdir(parents=True)
    (repo / "pipelines_config").mkdir()
    (repo / "pipelines_config" / "wine.yaml").write_text(WINE_CONFIG)
    (repo / "dags" / "wine.py").write_text(SHIM.format(name="wine"))
    broken = WINE_CONFIG.replace("name: wine", "name: broken").replace("learning_rate: 0.05", "learning_rat: 0.05")
    (repo / "pipelines_config" / "broken.yaml").write_text(broken)
    (repo / "dags" / "broken.py").write_text(SHIM.format(name="broken"))
    frame = load_wine(as_frame=True).frame
    frame = frame.rename(columns={"color_intensity": "color intensity"})
    assert "od280/od315_of_diluted_wines" in frame.columns
    day = (dt.date.today() - dt.timedelta(days=1)).isoformat()
    partition = layout.dataset_dir(root / "volume", "wine") / f"date={day}"
    partition.mkdir(parents=True)
    frame.to_parquet(partition / "part-0.parquet")
    return repo


def test_the_wheel_runs_a_team_folder_on_an_existing_airflow(airflow_venv: Path, tmp_path: Path) -> None:
    repo = team_folder(tmp_path)
    bin_ = airflow_venv / "bin"
    server = Server(tmp_path / "volume" / layout.MODELS)
    (tmp_path / "volume" / layout.MODELS).mkdir()
    server.start(tmp_path / "serving.log")
    env = {key: value for key, value in os.environ.items()
           if not key.startswith(("TRAINYARD_", "AIRFLOW", "PYTHONPATH", "VIRTUAL_ENV"))}
    env.update({"PATH": f"{bin_}:{env['PATH']}", "AIRFLOW_HOME": str(tmp_path / "airflow-home"),
                "AIRFLOW__CORE__DAGS_FOLDER": str(repo / "dags"), "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
                "TRAINYARD_DATA_DIR": str(tmp_path / "volume"), "TRAINYARD_STAGE_PYTHON": sys.executable,
                "TRAINYARD_SERVING_GRPC": server.grpc})

    def run(*argv: str, timeout: int = 600) -> subprocess.CompletedProcess[str]:
        return subprocess.run(list(argv), cwd=tmp_path, env=env, capture_output=True, text=True, timeout=timeout)

    try:
        nothing_else = run(str(bin_ / "python"), "-c", "import importlib.util as u; print([m for m in ("
                           "'tensorflow', 'pandas', 'trainyard_prep', 'trainyard_trainer', 'trainyard_serving') "
                           "if u.find_spec(m)]); import trainyard; print(trainyard.__file__)")
        assert nothing_else.returncode == 0, nothing_else.stderr
        assert nothing_else.stdout.splitlines()[0] == "[]"
        assert str(airflow_venv) in nothing_else.stdout.splitlines()[1]

        assert run(str(bin_ / "airflow"), "db", "migrate").returncode == 0
        # `trainyard new` there: no trainer package to write a model module into, no pandas to read a sample
        made = run(str(bin_ / "trainyard"), "new", "starter")
        assert made.returncode == 0, made.stderr
        assert "module: trainyard_trainer.models.mlp" in (repo / "pipelines_config" / "starter.yaml").read_text()
        assert (repo / "dags" / "starter.py").is_file() and "no model module was written" in made.stdout
        sample = run(str(bin_ / "trainyard"), "new", "other", "--from", str(repo / "dags" / "wine.py"), "--label", "y")
        assert sample.returncode == 2 and "needs pandas and pyarrow" in sample.stderr, sample.stderr
        assert not (repo / "pipelines_config" / "other.yaml").exists()
        no_data = run(str(bin_ / "trainyard"), "data", "digits")
        assert no_data.returncode == 1 and "not installed here" in no_data.stderr, no_data.stderr

        checked = run(str(bin_ / "trainyard"), "check")  # the folder beside the dags folder; models built there
        assert checked.returncode == 1
        assert "ok  wine" in checked.stdout and "ok  starter" in checked.stdout  # starter: built on its placeholders
        assert "churn" not in checked.stdout + checked.stderr
        assert "broken.yaml:" in checked.stderr and "training.learning_rat" in checked.stderr, checked.stderr

        errors = run(str(bin_ / "airflow"), "dags", "list-import-errors", "--local", "-o", "plain")
        assert "broken.py" in errors.stdout and "broken.yaml" in errors.stdout, errors.stdout + errors.stderr
        assert "wine.py" not in errors.stdout
        listed = run(str(bin_ / "airflow"), "dags", "list", "--local", "-o", "plain")
        assert "wine" in listed.stdout and "churn" not in listed.stdout, listed.stdout

        tested = run(str(bin_ / "airflow"), "dags", "test", "wine", timeout=900)
        output = tested.stdout + tested.stderr
        assert tested.returncode == 0, output[-6000:]
        published = layout.published_versions(layout.models_dir(tmp_path / "volume", "wine"))
        assert published == [1], output[-6000:]
        row = {"alcohol": 13.2, "malic_acid": 1.78, "flavanoids": 2.76, "color_intensity": 4.38,
               "od280_od315": 3.4, "proline": 1050.0}
        status, body = http("POST", server.url("/v1/models/wine:predict"), {"instances": [row]})
        assert status == 200 and len(body["predictions"][0]["probabilities"]) == 3, body
        row["od280/od315_of_diluted_wines"] = row.pop("od280_od315")  # the source name is not the served one
        status, body = http("POST", server.url("/v1/models/wine:predict"), {"instances": [row]})
        assert status == 400 and "od280_od315" in body["error"], body
    finally:
        server.stop()
