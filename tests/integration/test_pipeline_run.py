"""`trainyard run` drives the real DAG through Airflow (dag.test) on the local backend, stage by stage."""

from __future__ import annotations

import datetime as dt
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.integration.serving_helpers import Server, http
from tests.run_table import task_table
from trainyard_contract import artifacts, layout
from trainyard_prep.example_data import write_digits

pytestmark = pytest.mark.integration
REPO = Path(__file__).resolve().parents[2]


def trainyard(*args: str, timeout: int = 600, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "trainyard.cli", *args], capture_output=True, text=True,
                          timeout=timeout, env={**os.environ, **(env or {})})


def run_folder(output: str) -> Path:
    line = next(line for line in output.splitlines() if "run folder:" in line)
    return Path(line.split("run folder:", 1)[1].strip())


def test_example_pipeline_runs_through_airflow(pipelines_dir: Path, data_dir: Path, serving: Server) -> None:
    # five daily partitions ending yesterday; the run's data interval ends now, so a 4-day window
    # ([now - 4 days, now)) holds exactly the last three partitions (1,077 rows, above min_rows: 1000)
    write_digits(data_dir / layout.DATASETS / "digits", days=5)
    done = trainyard("run", "digits", "--conf", '{"window_days": 4, "steps": 120, "workers": 1}')
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "finished: success" in done.stdout
    run_dir = run_folder(done.stdout)
    assert run_dir.parent == data_dir / layout.RUNS / "digits"
    yesterday = dt.datetime.now(dt.UTC).date() - dt.timedelta(days=1)
    manifest = json.loads((run_dir / layout.INPUTS_MANIFEST).read_text())
    assert manifest["window_days"] == 4
    assert manifest["partitions"] == [(yesterday - dt.timedelta(days=d)).isoformat() for d in (2, 1, 0)]
    validation = json.loads((run_dir / layout.VALIDATION_RESULTS).read_text())
    prepared = json.loads((run_dir / layout.PREPARED_MANIFEST).read_text())
    assert validation["success"] and validation["rows"] == prepared["rows"]["train"] + prepared["rows"]["eval"]
    assert validation["rows"] == 1077
    assert prepared["inputs"]["files"] == 3 and len(prepared["shards"]) == 5
    # the train task ran the job with the overridden steps and replica count, and the chief exported the model
    training = json.loads((run_dir / layout.TRAINING_RECORD).read_text())
    assert (training["steps"], training["workers"], training["strategy"]) == (120, 1, "parameter_server")
    assert (run_dir / layout.SAVED_MODEL / layout.SAVED_MODEL_PB).is_file()
    # the run's task table: every task with its state, wall time and retries; the train row with its rates
    table = task_table(done.stdout)
    assert [task for task, row in table.items() if row["seconds"] is not None][:3] == [
        "validate_data", "prepare_data", "train"], table
    assert {task: row["state"] for task, row in table.items()} == {
        "validate_data": "success", "prepare_data": "success", "train": "success", "evaluate": "success",
        "teardown_train": "success", "decide": "success", "deploy": "success", "skip_deploy": "skipped"}, table
    assert table["skip_deploy"]["seconds"] is None and table["train"]["retries"] == 0
    rates = re.fullmatch(r"120 steps in (\d+\.\d)s: (\d+\.\d) steps/s, (\d+) examples/s", table["train"]["note"])
    assert rates, table["train"]
    assert abs(float(rates[1]) * float(rates[2]) - 120) < 0.05 * 120 + float(rates[2]) * 0.05  # time x rate = steps
    assert abs(int(rates[3]) - training["examples_per_second"]) <= 1
    assert table["train"]["seconds"] >= training["seconds"]  # the task's wall time holds the training's
    logs = sorted(p.name.rsplit("-", 2)[-2] for p in (run_dir / layout.CLUSTER_LOGS).glob("*.log"))
    assert logs == ["ps", "worker"]
    assert "[chief]" in done.stdout + done.stderr and "step 120 loss" in done.stdout + done.stderr
    for chatter in ("absl::InitializeLog", "cudart_stub.cc", "cuInit", "cpu_feature_guard.cc"):  # TF's start-up
        assert chatter not in done.stdout + done.stderr, chatter
    # evaluate -> decide -> deploy: the first model of the name is deployed as version 1 and answers over REST
    metrics = json.loads((run_dir / layout.METRICS).read_text())
    assert metrics["champion"] is None and metrics["challenger"]["accuracy"] >= 0.8
    assert (run_dir / layout.REPORT).read_text().count("<svg") == 2
    decision = json.loads((run_dir / layout.DECISION).read_text())
    assert decision["deploy"] is True and not decision["forced"]
    assert json.loads((run_dir / layout.DEPLOY_RESULT).read_text())["version"] == 1
    for artifact, model in artifacts.TYPED.items():  # what one image writes, another reads: the typed run files
        model.model_validate_json((run_dir / artifact).read_bytes())
    smoke = json.loads((run_dir / layout.SMOKE_SET).read_text())
    instance = {name: values[0] for name, values in smoke["inputs"].items()}
    status, answer = http("POST", serving.url("/v1/models/digits:predict"), {"instances": [instance]})
    assert status == 200 and answer["predictions"][0]["class_ids"] == smoke["class_ids"][0]

    # a second run that is not better (one training step) is not deployed, and the run still succeeds
    worse = trainyard("run", "digits", "--conf", '{"window_days": 4, "steps": 1, "workers": 1}')
    assert worse.returncode == 0, worse.stdout[-3000:]
    second = run_folder(worse.stdout)
    decision = json.loads((second / layout.DECISION).read_text())
    assert decision["deploy"] is False and decision["champion"]["version"] == 1
    assert any("vs champion v1" in reason for reason in decision["reasons"])
    metrics = json.loads((second / layout.METRICS).read_text())
    assert metrics["champion"]["scored"] is True and metrics["champion"]["rows"] == metrics["eval_rows"]
    assert metrics["comparison"]["lower"] < 0  # one training step: worse at any confidence
    assert not (second / layout.DEPLOY_RESULT).exists()
    assert layout.published_versions(data_dir / layout.MODELS / "digits") == [1]

    # clearing and re-running deploy on that run from the CLI publishes nothing: decide did not bless the model
    run_id = re.search(r"^trainyard run: digits run (\S+) finished: success$", worse.stdout, re.M).group(1)
    rerun = subprocess.run([str(Path(sys.executable).with_name("airflow")), "tasks", "test", "digits", "deploy",
                            run_id], capture_output=True, text=True, timeout=300, env=dict(os.environ))
    log = rerun.stdout + rerun.stderr
    assert rerun.returncode == 0, log[-3000:]
    assert f"deploy skipped: this run's decision ({layout.DECISION}) says SKIP" in log
    assert layout.published_versions(data_dir / layout.MODELS / "digits") == [1]
    assert not (second / layout.DEPLOY_RESULT).exists()

    # the first run's inputs and config again: nothing new to learn, so no training job and no deploy
    same = trainyard("run", "digits", "--conf", '{"window_days": 4, "steps": 120, "workers": 1}')
    assert same.returncode == 0 and "finished: success" in same.stdout, same.stdout[-3000:]
    notes = [line for line in same.stdout.splitlines() if line.startswith("trainyard run: train skipped: ")]
    assert len(notes) == 1 and "nothing new: the pinned inputs (sha256 " in notes[0] and "champion v1" in notes[0]
    third = run_folder(same.stdout)
    assert not (third / layout.TRAINING_RECORD).exists() and not (third / layout.METRICS).exists()
    assert layout.published_versions(data_dir / layout.MODELS / "digits") == [1]


def test_bad_data_fails_the_run_and_nothing_downstream_runs(pipelines_dir: Path, data_dir: Path,
                                                            tmp_path: Path) -> None:
    """On an Airflow home nobody prepared: the database is initialised, a missing shim is one line, and the failed
    run ends with a summary (task, the stage's own message, no retry for bad input, run folder, log)."""
    write_digits(data_dir / layout.DATASETS / "digits", days=2)
    bad = sorted((data_dir / layout.DATASETS / "digits").glob("date=*/part-0.csv"))[0]
    bad.write_text(bad.read_text().replace("\n0.0,", "\nzero,", 1))
    fresh = {"AIRFLOW_HOME": str(tmp_path / "fresh-home")}
    no_shim = trainyard("run", "digits", env=fresh)  # dags folder: $AIRFLOW_HOME/dags, empty
    assert no_shim.returncode == 1 and "initialising the Airflow database" in no_shim.stdout
    assert [line for line in no_shim.stderr.splitlines() if line.startswith("trainyard run:")] == [
        f"trainyard run: no DAG shim for pipeline 'digits' in the dags folder: {tmp_path}/fresh-home/dags/digits.py "
        "is missing (create it with `trainyard new digits`, or copy dags/digits.py and change the name)"]
    done = trainyard("run", "digits", env={**fresh, "AIRFLOW__CORE__DAGS_FOLDER": str(REPO / "dags")})
    assert done.returncode == 1
    assert "finished: failed" in done.stdout
    summary = [line for line in done.stdout.splitlines() if line.startswith("trainyard run: ")]
    assert summary[1:4] == [
        "trainyard run: failed task: validate_data (attempt 1)",
        "trainyard run: error: validate failed: data validation failed: 1 problem(s) in datasets/digits",
        "trainyard run: a retry would fail the same way: fix the data, the config or the model code, then run again",
    ], summary
    # the task table: what ran, for how long, with how many retries; the tasks that never ran say so
    table = task_table(done.stdout)
    assert table["validate_data"]["state"] == "failed" and table["validate_data"]["retries"] == 0, table
    assert table["validate_data"]["seconds"] > 0 and table["teardown_train"]["state"] == "success", table
    assert {task: row["state"] for task, row in table.items() if row["seconds"] is None} == {
        "prepare_data": "upstream_failed", "train": "upstream_failed", "evaluate": "upstream_failed",
        "decide": "upstream_failed", "deploy": "upstream_failed", "skip_deploy": "upstream_failed"}, table
    assert summary[4] == "trainyard run: " + "task".ljust(14) + "  state" + " " * 16 + "wall  retries", summary
    assert re.fullmatch(r"trainyard run: whole run\s+\d+\.\ds", summary[-3]), summary
    log_file = Path(summary[-1].split("log: ", 1)[1])
    assert summary[-1].startswith("trainyard run: log: ") and "pixel_0: 1 value(s) of the wrong type" in \
        log_file.read_text()
    log = done.stdout + done.stderr
    assert "pixel_0: 1 value(s) of the wrong type text" in log and "line 2: 'zero'" in log and "not retried" in log
    run_dir = run_folder(done.stdout)
    assert (run_dir / layout.VALIDATION_RESULTS).is_file()
    assert not (run_dir / layout.PREPARED).exists()


def test_run_usage_errors(pipelines_dir: Path, data_dir: Path) -> None:
    assert trainyard("run", "digits", "--conf", "{not json").returncode == 2
    assert trainyard("run", "digits", "--conf", '{"stepz": 3}').returncode == 2
    missing = trainyard("run", "digitz")
    assert missing.returncode == 1 and "did you mean 'digits'?" in missing.stderr


def wait_for_text(path: Path, text: str, seconds: float = 180) -> bool:
    import time

    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if text in path.read_text(errors="replace"):
            return True
        time.sleep(0.5)
    return False


def processes_of(run_dir_fragment: str) -> list[str]:
    found = subprocess.run(["pgrep", "-af", run_dir_fragment], capture_output=True, text=True).stdout
    return [line for line in found.splitlines() if "pgrep" not in line]


def run_state(run_id: str) -> str:
    from airflow.models.dagrun import DagRun

    (run,) = DagRun.find(dag_id="digits", run_id=run_id)
    return str(getattr(run.state, "value", run.state))


def test_ctrl_c_stops_a_run_and_a_killed_run_is_cleared_by_the_next(pipelines_dir: Path, data_dir: Path,
                                                                   tmp_path: Path) -> None:
    import signal
    import time

    write_digits(data_dir / layout.DATASETS / "digits", days=5)
    command = [sys.executable, "-m", "trainyard.cli", "run", "digits", "--conf", '{"steps": 5000, "workers": 1}']
    output = tmp_path / "interrupted.log"
    with output.open("w") as sink:
        run = subprocess.Popen(command, stdout=sink, stderr=subprocess.STDOUT, env=dict(os.environ))
    try:
        assert wait_for_text(output, "first step done"), output.read_text()[-3000:]  # the training job runs
        run.send_signal(signal.SIGINT)
        assert run.wait(timeout=90) == 130
    finally:
        if run.poll() is None:
            run.kill()
    text = output.read_text()
    assert "trainyard run: stopped by Ctrl-C: the running stage's processes were stopped" in text
    found = re.search(r"^trainyard run: digits run (\S+) finished: failed$", text, re.M)
    assert found, text[-3000:]
    run_id = found.group(1)
    assert run_state(run_id) == "failed" and "up_for_retry" not in text.split("Ctrl-C", 1)[-1]
    time.sleep(2)
    assert processes_of(f"runs/digits/{layout.run_key(run_id)}") == []  # chief, PS, worker: stopped and reaped

    killed_log = tmp_path / "killed.log"
    with killed_log.open("w") as sink:
        killed = subprocess.Popen(command, stdout=sink, stderr=subprocess.STDOUT, env=dict(os.environ))
    assert wait_for_text(killed_log, "local backend: running pod"), killed_log.read_text()[-3000:]
    killed.kill()  # SIGKILL: no handler runs
    killed.wait(timeout=30)
    killed_id = re.search(r"--run-id (manual__\S+)", killed_log.read_text()).group(1)  # from the stage's command
    assert run_state(killed_id) == "running"  # what a killed command leaves behind
    deadline = time.monotonic() + 20
    while processes_of(f"runs/digits/{layout.run_key(killed_id)}") and time.monotonic() < deadline:
        time.sleep(0.5)  # its stage died with it (PDEATHSIG), not left running on its own
    assert processes_of(f"runs/digits/{layout.run_key(killed_id)}") == []

    bad = sorted((data_dir / layout.DATASETS / "digits").glob("date=*/part-0.csv"))[0]
    bad.write_text(bad.read_text().replace("\n0.0,", "\nzero,", 1))  # the next run fails fast, at validate
    after = trainyard("run", "digits")
    assert f"trainyard run: run {killed_id} was left running by a `trainyard run` that died" in after.stdout
    assert run_state(killed_id) == "failed"
