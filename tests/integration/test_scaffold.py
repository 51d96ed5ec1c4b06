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
from trainyard.commands.scaffold import models_dir
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
        (dags / "orphan.py").write_text('"""airflow dag"""\nfrom trainyard.dag.factory import dag_from_config\n'
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
    from trainyard.commands.scaffold import ScaffoldError, new_pipeline

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
    from trainyard.commands.scaffold import new_pipeline
    from trainyard.config.loader import load_pipeline_file

    sample = tmp_path / "s.csv"
    sample.write_text("price,size,city\n1.5,3,Lyon\n2.25,4,Oslo\n3.75,5,Lyon\n")
    written = new_pipeline(name, sample, "price", pipelines=pipelines_dir, dags=tmp_path, volume=data_dir)
    config = load_pipeline_file(written.config)
    assert config.data.label.task == "regression" and config.metric_names == ("rmse", "mae", "r2", "loss")
    assert [(f.name, f.dtype, f.is_categorical) for f in config.data.columns()] == [
        ("size", "int", False), ("city", "string", True)]
    assert any("a regression pipeline (task: regression)" in note for note in written.notes)


def test_new_reads_parquet_and_maps_names_that_are_not_identifiers(name: str, pipelines_dir: Path, data_dir: Path,
                                                                    tmp_path: Path) -> None:
    import pandas as pd
    from sklearn.datasets import load_wine

    from trainyard.commands.scaffold import new_pipeline
    from trainyard.config.loader import load_pipeline_file
    from trainyard_prep.inputs import pin_inputs
    from trainyard_prep.prepare import prepare
    from trainyard_prep.validate import validate_inputs

    frame = load_wine(as_frame=True).frame.rename(columns={"color_intensity": "color intensity",
                                                           "target": "class"})
    frame["2nd pass"] = frame["hue"] * 2
    frame["organic"] = frame["alcohol"] > 13  # types validation refuses: left out, with how to store them
    frame["batch"] = (frame["magnesium"] % 7).astype("uint8")
    frame["bottled"] = pd.date_range("2020-01-01", periods=len(frame))
    frame["region"] = pd.Categorical(np.where(frame["proline"] > 700, "north", "south"))
    frame["grower"] = np.where(frame["ash"] > 2.3, "a", "b")
    sample = tmp_path / "wine.data"  # no suffix to go by: Parquet is known by its magic bytes
    frame.to_parquet(sample, index=False)
    written = new_pipeline(name, sample, "class", pipelines=pipelines_dir, dags=tmp_path, volume=data_dir,
                           serving_running=True)
    config = load_pipeline_file(written.config)
    assert config.data.format == "parquet" and config.data.label.classes == [0, 1, 2]
    assert config.data.source_columns() == {"od280_od315_of_diluted_wines": "od280/od315_of_diluted_wines",
                                            "color_intensity": "color intensity", "c_2nd_pass": "2nd pass"}
    assert written.data is not None and written.data.name == "part-0.parquet"
    assert written.data.read_bytes()[:4] == b"PAR1"
    assert any("'od280/od315_of_diluted_wines' -> od280_od315_of_diluted_wines" in note for note in written.notes)
    left_out = {note.split("'")[1]: note for note in written.notes if note.startswith("left out column")}
    assert sorted(left_out) == ["batch", "bottled", "organic", "region"], written.notes
    assert "store it as integers 0/1" in left_out["organic"] and "signed integer" in left_out["batch"]
    assert "grower" in {f.name for f in config.data.columns()}
    # the config it wrote validates and prepares the partition it wrote
    run_dir = data_dir / layout.RUNS / name / "r1"
    manifest = pin_inputs(data_dir, run_dir, config.data, None)
    assert validate_inputs(run_dir, config, manifest)["rows"] == 178
    assert prepare(run_dir, config, manifest)["rows"]["train"] > 100

    (tmp_path / "text.csv").write_bytes(b"\x89PNG\r\n\x1a\n\xff\xfe\x00garbage")
    with pytest.raises(Exception, match="neither a Parquet file nor a CSV file pandas can read"):
        new_pipeline(name, tmp_path / "text.csv", "class", pipelines=pipelines_dir, dags=tmp_path, volume=data_dir,
                     force=True)


def test_task_says_what_a_whole_number_label_is(name: str, pipelines_dir: Path, data_dir: Path,
                                                tmp_path: Path) -> None:
    from trainyard.commands.scaffold import ScaffoldError, new_pipeline
    from trainyard.config.loader import load_pipeline_file

    rng = np.random.default_rng(0)
    speed = rng.uniform(20, 120, 400)
    sample = tmp_path / "trips.csv"
    import pandas as pd

    pd.DataFrame({"speed": speed, "hours": rng.uniform(0.5, 3, 400),
                  "km": np.round(speed * 2).astype(int)}).to_csv(sample, index=False)
    with pytest.raises(ScaffoldError, match=r"needs 2 to 100 classes \(use --task regression to predict it"):
        new_pipeline(name, sample, "km", pipelines=pipelines_dir, dags=tmp_path, volume=data_dir)
    written = new_pipeline(name, sample, "km", pipelines=pipelines_dir, dags=tmp_path, volume=data_dir,
                           task="regression", serving_running=True)
    config = load_pipeline_file(written.config)
    assert config.data.label.task == "regression" and config.metric_names == ("rmse", "mae", "r2", "loss")
    with pytest.raises(ScaffoldError, match="a classifier needs whole-number or text classes"):
        new_pipeline(name, sample, "speed", pipelines=pipelines_dir, dags=tmp_path, volume=data_dir, force=True,
                     task="classification")
    with pytest.raises(ScaffoldError, match="--task needs a --from sample"):
        new_pipeline(name, None, None, pipelines=pipelines_dir, dags=tmp_path, volume=data_dir, force=True,
                     task="regression")


def test_new_picks_free_ports_when_another_program_holds_the_defaults(name: str, pipelines_dir: Path,
                                                                      data_dir: Path, tmp_path: Path) -> None:
    import socket

    from trainyard.commands.scaffold import DEFAULT_PORTS, new_pipeline, port_free
    from trainyard.config.loader import load_pipeline_file

    sample = tmp_path / "s.csv"
    sample.write_text("price,size\n1,3\n2,4\n1,5\n")
    holder = socket.socket()
    if port_free(DEFAULT_PORTS[0]):  # another program (this test) takes 8500; if one already has it, so much the same
        holder.bind(("127.0.0.1", DEFAULT_PORTS[0]))
        holder.listen()
    try:
        assert not port_free(DEFAULT_PORTS[0])
        written = new_pipeline(name, sample, "price", pipelines=pipelines_dir, dags=tmp_path, volume=data_dir)
        config = load_pipeline_file(written.config)
        ports = (config.deploy.grpc_port, config.deploy.rest_port)
        assert DEFAULT_PORTS[0] not in ports and ports[0] != ports[1] and all(port_free(p) for p in ports)
        (note,) = [n for n in written.notes if "held by another program" in n]
        assert f"trainyard serve --grpc-port {ports[0]} --rest-port {ports[1]} --background" in note
        # Trainyard's own local server on the defaults serves every pipeline: the defaults stay
        again = new_pipeline(name, sample, "price", pipelines=pipelines_dir, dags=tmp_path, volume=data_dir,
                             force=True, serving_running=True)
        config = load_pipeline_file(again.config)
        assert (config.deploy.grpc_port, config.deploy.rest_port) == DEFAULT_PORTS
        assert not any("held by another program" in n for n in again.notes)
    finally:
        holder.close()


def test_a_teams_own_pipelines_folder_does_not_meet_the_examples(tmp_path: Path) -> None:
    """TRAINYARD_PIPELINES_DIR pointing at a team's folder, in a checkout, without AIRFLOW_HOME: the checkout's
    Airflow home (whose dags folder is the examples') is not used, so `check` sees only the team's pipelines."""
    team = tmp_path / "team" / "pipelines_config"
    team.mkdir(parents=True)
    (team / "wine.yaml").write_text("name: wine\ndata:\n  source: datasets/wine\n  label: {name: y, classes: [0, 1]}\n"
                                    "  features: [{name: a}]\n")
    home = tmp_path / "home"
    (home / "airflow" / "dags").mkdir(parents=True)  # Airflow's own default home, ~/airflow
    (home / "airflow" / "dags" / "wine.py").write_text(
        'from trainyard.dag.factory import dag_from_config\n\ndag = dag_from_config("wine")\n')
    env = {key: value for key, value in os.environ.items() if not key.startswith(("AIRFLOW", "TRAINYARD_"))}
    env.update({"HOME": str(home), "TRAINYARD_PIPELINES_DIR": str(team)})
    checked = subprocess.run([sys.executable, "-m", "trainyard.cli", "check", "--no-build"], capture_output=True,
                             text=True, timeout=300, env=env, cwd=tmp_path)
    assert checked.returncode == 0, checked.stderr
    assert checked.stdout.splitlines()[-1] == "ok  wine" and "churn" not in checked.stdout + checked.stderr


def test_a_column_name_no_config_could_hold_is_refused_before_anything_is_written(
        name: str, pipelines_dir: Path, data_dir: Path, tmp_path: Path) -> None:
    from trainyard.commands.scaffold import ScaffoldError, new_pipeline

    long_name = "reading (" + "x" * 260 + ")"  # over source_column's 255 characters
    sample = tmp_path / "s.csv"
    sample.write_text(f"price,{long_name}\n1,3\n2,4\n1,5\n")
    with pytest.raises(ScaffoldError, match=r"cannot be a source_column.*255 characters"):
        new_pipeline(name, sample, "price", pipelines=pipelines_dir, dags=tmp_path, volume=data_dir)
    assert not (pipelines_dir / f"{name}.yaml").exists()
