"""`trainyard new` from a sample CSV to a served prediction, as the README's "your own pipeline" walk-through does,
and `trainyard check` pairing configs, shims and model modules."""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from pathlib import Path

import numpy as np
import pytest

from tests.integration.serving_helpers import Server
from trainyard.scaffold import models_dir
from trainyard_contract import layout

pytestmark = pytest.mark.integration


@pytest.fixture
def name() -> str:
    """A pipeline name nobody else uses; its model module (written into the trainer package) is removed after."""
    chosen = f"cancer_{uuid.uuid4().hex[:6]}"
    yield chosen
    (models_dir() / f"{chosen}.py").unlink(missing_ok=True)


def sample_csv(path: Path) -> Path:
    """A real tabular dataset a package ships: scikit-learn's breast cancer data (569 rows, 30 float columns)."""
    from sklearn.datasets import load_breast_cancer

    frame = load_breast_cancer(as_frame=True).frame
    frame.columns = [c.replace(" ", "_") for c in frame.columns]
    frame["clinic"] = "north"  # one value: left out, and said so
    frame["ward"] = np.where(frame["mean_radius"] > 14, "east", "west")  # text: a categorical feature
    frame.to_csv(path, index=False)
    return path


def test_new_pipeline_from_a_sample_to_a_served_prediction(name: str, pipelines_dir: Path, data_dir: Path,
                                                            tmp_path: Path) -> None:
    dags = tmp_path / "dags"
    dags.mkdir()
    server = Server(data_dir / layout.MODELS).start(tmp_path / "serving.log")
    env = {**os.environ, "AIRFLOW__CORE__DAGS_FOLDER": str(dags), "TRAINYARD_SERVING_GRPC": server.grpc,
           "AIRFLOW_HOME": str(tmp_path / "home")}

    def trainyard(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "trainyard.cli", *args], capture_output=True, text=True,
                              timeout=900, env=env)

    try:
        (data_dir / layout.MODELS).mkdir(exist_ok=True)
        sample = sample_csv(tmp_path / "cancer.csv")
        made = trainyard("new", name, "--from", str(sample), "--label", "target")
        assert made.returncode == 0, made.stderr
        assert "left out column 'clinic': it has 1 distinct value(s) in the sample" in made.stdout
        config = (pipelines_dir / f"{name}.yaml").read_text()
        assert "- {name: mean_radius, dtype: float, min: 6.981, max: 28.11}" in config
        assert "- {name: ward, dtype: string}  # text: a categorical feature" in config
        assert "classes: [0, 1]" in config and f"module: trainyard_trainer.models.{name}" in config
        assert (dags / f"{name}.py").read_text().count(f'dag_from_config("{name}")') == 1
        assert (layout.dataset_dir(data_dir, name)).is_dir()
        assert trainyard("new", name, "--from", str(sample), "--label", "target").returncode == 2  # no overwrite

        checked = trainyard("check")
        assert checked.returncode == 1  # the examples' configs have no shim in this dags folder: said so
        examples = sorted(p.stem for p in pipelines_dir.glob("[!_]*.yaml") if p.stem != name)
        assert examples == ["churn", "diabetes", "digits"]
        assert [line.split(":")[0] for line in checked.stderr.splitlines()[:3]] == examples
        assert all(" no DAG shim in " in line for line in checked.stderr.splitlines()[:3])
        for example in examples:
            (pipelines_dir / f"{example}.yaml").unlink()
        checked = trainyard("check")
        assert checked.returncode == 0 and f"ok  {name}" in checked.stdout, checked.stderr

        run = trainyard("run", name, "--conf", '{"steps": 60}')
        assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
        assert layout.published_versions(layout.models_dir(data_dir, name.replace("_", "-"))) == [1]
        (dags / "orphan.py").write_text('"""airflow dag"""\nfrom trainyard.dag_factory import dag_from_config\n'
                                        'dag = dag_from_config("gone")\n')
        (models_dir() / f"{name}.py").write_text("def build_model(params, schema:\n")
        checked = trainyard("check")
        assert checked.returncode == 1
        assert f"{dags / 'orphan.py'}: builds pipeline 'gone', which has no config" in checked.stderr
        line = next(line for line in checked.stderr.splitlines() if "does not compile" in line)
        assert f"training.model.module: {models_dir() / (name + '.py')}:1: does not compile" in line
        assert line.startswith(f"{pipelines_dir / (name + '.yaml')}:"), line
    finally:
        server.stop()


def test_new_refuses_what_cannot_work(name: str, pipelines_dir: Path, data_dir: Path, tmp_path: Path) -> None:
    from trainyard.scaffold import ScaffoldError, new_pipeline

    sample = tmp_path / "s.csv"
    sample.write_text("price,size\n1.5,3\n2.25,4\n3.75,5\n")
    (tmp_path / "one.csv").write_text("price,size\n1.5,3\n2.25,3\n")
    with pytest.raises(ScaffoldError, match="label 'size' has 1 distinct value"):
        new_pipeline(name, tmp_path / "one.csv", "size", pipelines=pipelines_dir, dags=tmp_path, volume=data_dir)
    with pytest.raises(ScaffoldError, match="no column 'Size' to use as the label; did you mean 'size'"):
        new_pipeline(name, sample, "Size", pipelines=pipelines_dir, dags=tmp_path, volume=data_dir)
    with pytest.raises(ScaffoldError, match="no feature column besides the label 'price' has two or more values"):
        new_pipeline(name, tmp_path / "one.csv", "price", pipelines=pipelines_dir, dags=tmp_path, volume=data_dir)
    with pytest.raises(ScaffoldError, match="'Bad-Name' is not a pipeline name"):
        new_pipeline("Bad-Name", sample, "size", pipelines=pipelines_dir, dags=tmp_path, volume=data_dir)
    assert not (pipelines_dir / f"{name}.yaml").exists() and not (models_dir() / f"{name}.py").exists()


def test_a_float_label_makes_a_regression_pipeline(name: str, pipelines_dir: Path, data_dir: Path,
                                                   tmp_path: Path) -> None:
    from trainyard.config_loader import load_pipeline_file
    from trainyard.scaffold import new_pipeline

    sample = tmp_path / "s.csv"
    sample.write_text("price,size,city\n1.5,3,Lyon\n2.25,4,Oslo\n3.75,5,Lyon\n")
    written = new_pipeline(name, sample, "price", pipelines=pipelines_dir, dags=tmp_path, volume=data_dir)
    config = load_pipeline_file(written.config)
    assert config.data.label.task == "regression" and config.metric_names == ("rmse", "mae", "r2", "loss")
    assert [(f.name, f.dtype, f.is_categorical) for f in config.data.columns()] == [
        ("size", "int", False), ("city", "string", True)]
    assert any("a regression pipeline (task: regression)" in note for note in written.notes)
