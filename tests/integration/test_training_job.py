"""The training job on the local backend with real TensorFlow processes on 127.0.0.1: faults included."""

from __future__ import annotations

import datetime as dt
import json
import logging
import signal
import threading
import time
from pathlib import Path

import pytest
import tensorflow as tf

from trainyard.config.loader import load_pipeline_file
from trainyard.dag.registry import stage_named
from trainyard.dag.stages import RunContext
from trainyard.launch.base import StageFailed
from trainyard.launch.local import LocalLauncher
from trainyard.launch.training_job import launch_training
from trainyard_contract import layout
from trainyard_contract.layout import RunLayout
from trainyard_contract.schema import PipelineConfig
from trainyard_prep.example_data import write_digits
from trainyard_prep.inputs import pin_inputs
from trainyard_prep.prepare import prepare
from trainyard_trainer.train import fetch_loss

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def prepared_volume(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A volume with the digits data prepared once for the module (the prep stages are tested elsewhere)."""
    volume = tmp_path_factory.mktemp("volume")
    write_digits(volume / layout.DATASETS / "digits", days=2, end=dt.date(2026, 11, 30))
    return volume


def config_with(pipelines: Path, **training: object) -> PipelineConfig:
    config = load_pipeline_file(pipelines / "digits.yaml")
    data = config.model_dump()
    data["training"].update(training)
    return PipelineConfig.model_validate(data)


def prepare_run(volume: Path, config: PipelineConfig, run_id: str) -> Path:
    run_dir = RunLayout.for_run(volume, config.name, run_id).run_dir
    manifest = pin_inputs(volume, run_dir, config.data, None)
    prepare(run_dir, config, manifest)
    return run_dir


class Watch(logging.Handler):
    """Calls `action` once when a log line contains `text` (e.g. a training step)."""

    def __init__(self, text: str, action):  # noqa: ANN001
        super().__init__()
        self.text, self.action, self.fired = text, action, threading.Event()

    def emit(self, record: logging.LogRecord) -> None:
        if not self.fired.is_set() and self.text in record.getMessage():
            self.fired.set()
            threading.Thread(target=self.action, daemon=True).start()


def kill_replica(launcher: LocalLauncher, role: str) -> None:
    with launcher._lock:
        proc = next(p for p in launcher._running if p.role == role)
    proc.process.send_signal(signal.SIGKILL)


def run_job(config: PipelineConfig, volume: Path, run_id: str, watch: Watch | None = None,
            launcher: LocalLauncher | None = None) -> dict:
    launcher = launcher or LocalLauncher(config, volume)
    log = logging.getLogger(f"test.{run_id}")
    log.setLevel(logging.INFO)
    if watch:
        log.addHandler(watch)
    run = RunContext(pipeline=config.name, run_id=run_id)
    try:
        return launch_training(config, run, stage_named("train"), launcher, log)
    finally:
        if watch:
            log.removeHandler(watch)


def optimizer_iterations(checkpoint: Path) -> int:
    """How many updates the optimizer applied, read from a checkpoint: the steps really run. Only where one
    replica updates at a time: Keras 3's `assign_add` is a read-modify-write, so with two asynchronous
    parameter-server workers the counter loses increments (168 of 200 seen here)."""
    reader = tf.train.load_checkpoint(str(checkpoint))
    (key,) = [k for k in reader.get_variable_to_shape_map() if k.startswith("optimizer/") and "iteration" in k]
    return int(reader.get_tensor(key))


def test_parameter_server_job_trains_and_exports(pipelines_dir: Path, prepared_volume: Path) -> None:
    # 30 steps per scheduled call: each interval of 100 ends with a shorter call (the first also starts with one)
    config = config_with(pipelines_dir, steps=200, checkpoint_every_steps=100, steps_per_execution=30)
    run_dir = prepare_run(prepared_volume, config, "ps-ok")
    first_step = Watch("first step done", lambda: None)
    result = run_job(config, prepared_volume, "ps-ok", first_step)
    assert first_step.fired.is_set()  # the first step runs alone, then the rest of the interval
    assert result["steps"] == 200 and result["resumed_from_step"] == 0 and result["worker_restarts"] == 0
    assert result["final_loss"] < 1.0
    training = json.loads((run_dir / layout.TRAINING_RECORD).read_text())
    assert training["strategy"] == "parameter_server" and training["tensorflow"] == tf.__version__
    assert sorted(p.name for p in (run_dir / layout.CHECKPOINTS).glob("ckpt-*.index")) == ["ckpt-100.index",
                                                                                   "ckpt-200.index"]
    # one log per PS/worker replica (the chief logs into the task), each showing its server came up
    logs = {"-".join(p.name.rsplit("-", 2)[-2:]): p.read_text() for p in (run_dir / layout.CLUSTER_LOGS).iterdir()}
    assert sorted(logs) == ["ps-0.log", "worker-0.log", "worker-1.log"]
    assert all("serving on" in text for text in logs.values()), logs
    assert list((run_dir / layout.TENSORBOARD_TRAIN).glob("events.out.tfevents.*"))
    # a fresh process-free load of the export predicts from raw features by name
    loaded = tf.saved_model.load(str(run_dir / layout.SAVED_MODEL))
    serve = loaded.signatures["serving_default"]
    assert sorted(serve.structured_input_signature[1])[:2] == ["pixel_0", "pixel_1"]
    out = serve(**{f"pixel_{i}": tf.constant([0.0, 16.0]) for i in range(64)})
    assert out["probabilities"].shape == (2, 10) and out["classes"].dtype == tf.string


def test_steps_per_execution_runs_exactly_the_configured_steps_on_parameter_servers(
        pipelines_dir: Path, prepared_volume: Path) -> None:
    # one worker, so the optimizer's counter is exact; calls: 1 + [20, 20, 9], then [20]
    config = config_with(pipelines_dir, steps=70, checkpoint_every_steps=50, steps_per_execution=20,
                         workers={"replicas": 1})
    run_dir = prepare_run(prepared_volume, config, "ps-calls")
    result = run_job(config, prepared_volume, "ps-calls")
    assert result["steps"] == 70
    assert [optimizer_iterations(run_dir / layout.CHECKPOINTS / f"ckpt-{n}") for n in (50, 70)] == [50, 70]


class CopyFailsFirst:
    """A finished step's result whose first `failures` copies to the chief fail the way TF reports it."""

    def __init__(self, failures: int) -> None:
        self.failures, self.calls = failures, 0

    def fetch(self) -> float:
        self.calls += 1
        if self.calls <= self.failures:
            raise tf.errors.InternalError(None, None, "Unable to parse request")
        return 0.25


def test_a_failed_loss_copy_is_tried_again_then_reported(caplog: pytest.LogCaptureFixture) -> None:
    flaky = CopyFailsFirst(failures=2)
    with caplog.at_level(logging.WARNING, logger="trainyard"):
        assert fetch_loss(flaky) == 0.25
    assert flaky.calls == 3
    assert [r.getMessage().split(":")[0] for r in caplog.records] == [
        "copying a step's loss from its worker failed (attempt 1 of 3), trying again",
        "copying a step's loss from its worker failed (attempt 2 of 3), trying again"]
    broken = CopyFailsFirst(failures=3)
    with pytest.raises(tf.errors.InternalError, match="Unable to parse request"):
        fetch_loss(broken)
    assert broken.calls == 3


def test_a_killed_worker_is_restarted_and_the_run_finishes(pipelines_dir: Path, prepared_volume: Path) -> None:
    config = config_with(pipelines_dir, steps=1500, checkpoint_every_steps=100, restart_budget=2)
    run_dir = prepare_run(prepared_volume, config, "worker-kill")
    launcher = LocalLauncher(config, prepared_volume)
    watch = Watch("step 200 ", lambda: kill_replica(launcher, "worker"))
    result = run_job(config, prepared_volume, "worker-kill", watch, launcher)
    assert watch.fired.is_set()
    assert result["steps"] == 1500 and result["worker_restarts"] == 1
    assert (run_dir / layout.SAVED_MODEL / layout.SAVED_MODEL_PB).is_file()


def test_a_killed_ps_fails_the_attempt_and_the_retry_resumes(pipelines_dir: Path, prepared_volume: Path) -> None:
    config = config_with(pipelines_dir, steps=1500, checkpoint_every_steps=100)
    run_dir = prepare_run(prepared_volume, config, "ps-kill")
    launcher = LocalLauncher(config, prepared_volume)
    watch = Watch("step 200 ", lambda: kill_replica(launcher, "ps"))
    started = time.monotonic()
    with pytest.raises(StageFailed, match="ps-0 was killed by signal 9 \\(a parameter server cannot be replaced\\)"):
        run_job(config, prepared_volume, "ps-kill", watch, launcher)
    assert time.monotonic() - started < 120
    assert not launcher._running  # every replica was stopped and reaped
    assert not (run_dir / layout.MODEL).exists()
    checkpoints = sorted(int(p.stem.split("-")[1]) for p in (run_dir / layout.CHECKPOINTS).glob("ckpt-*.index"))
    assert checkpoints and checkpoints[-1] >= 200
    retry = run_job(config, prepared_volume, "ps-kill")  # the Airflow retry: same run folder, new processes
    assert retry["resumed_from_step"] == checkpoints[-1] and retry["steps"] == 1500


def test_a_killed_chief_fails_the_attempt_and_the_retry_resumes(pipelines_dir: Path, prepared_volume: Path) -> None:
    config = config_with(pipelines_dir, steps=1500, checkpoint_every_steps=100)
    run_dir = prepare_run(prepared_volume, config, "chief-kill")
    launcher = LocalLauncher(config, prepared_volume)
    watch = Watch("step 200 ", lambda: kill_replica(launcher, "chief"))
    with pytest.raises(StageFailed, match="chief was killed by signal 9"):
        run_job(config, prepared_volume, "chief-kill", watch, launcher)
    assert not launcher._running
    retry = run_job(config, prepared_volume, "chief-kill")
    assert retry["resumed_from_step"] >= 200 and retry["steps"] == 1500
    assert (run_dir / layout.TRAINING_RECORD).is_file()


def test_a_bad_model_module_fails_before_any_replica_starts(pipelines_dir: Path, prepared_volume: Path) -> None:
    config = config_with(pipelines_dir, model={"module": "trainyard_trainer.models.nope", "params": {}})
    run_dir = prepare_run(prepared_volume, config, "bad-module")
    with pytest.raises(StageFailed) as info:
        run_job(config, prepared_volume, "bad-module")
    assert info.value.exit_code == 3 and not info.value.retryable
    assert "training.model.module 'trainyard_trainer.models.nope' cannot be imported" in str(info.value)
    assert not (run_dir / layout.CLUSTER).exists()  # no replica was launched
    bad_params = config_with(pipelines_dir, model={"module": "trainyard_trainer.models.mlp",
                                                   "params": {"hidden_units": "wide"}})
    with pytest.raises(StageFailed, match="hidden_units must be a list of positive integers"):
        run_job(bad_params, prepared_volume, "bad-module")


@pytest.mark.parametrize(("strategy", "workers"), [("single", 0), ("multi_worker_mirrored", 1)])
def test_other_strategies_from_the_same_config_field(pipelines_dir: Path, prepared_volume: Path, strategy: str,
                                                     workers: int) -> None:
    config = config_with(pipelines_dir, strategy=strategy, steps=100, checkpoint_every_steps=50,
                         steps_per_execution=20, ps={"replicas": 0}, workers={"replicas": workers})
    run_dir = prepare_run(prepared_volume, config, f"strategy-{strategy}")
    result = run_job(config, prepared_volume, f"strategy-{strategy}")
    assert result["steps"] == 100 and result["strategy"] == strategy
    # calls of 20, 20, 10 per interval: exactly the configured steps were applied
    assert optimizer_iterations(run_dir / layout.CHECKPOINTS / "ckpt-100") == 100
    assert (run_dir / layout.SAVED_MODEL / layout.SAVED_MODEL_PB).is_file()
