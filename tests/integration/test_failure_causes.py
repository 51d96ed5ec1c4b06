"""Honest failures on real processes: a full volume in prepare and in training (a real tmpfs that runs out of
space), and a model bug that shows only on real vocabulary ids, each reported by its cause and never retried."""

from __future__ import annotations

import contextlib
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.integration.test_pipeline_run import trainyard
from tests.integration.test_tabular_tasks import END, validate_and_prepare
from trainyard.config.loader import load_pipeline_file
from trainyard.dag.stages import CONFIG_ENV
from trainyard_contract import layout
from trainyard_contract.runtime import ERROR_MARKER, EXIT_BAD_INPUT, EXIT_ENVIRONMENT, failure_cause
from trainyard_contract.schema import PipelineConfig
from trainyard_prep.example_data import write_churn, write_digits
from trainyard_prep.inputs import pin_inputs

pytestmark = pytest.mark.integration
needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="mounting a tmpfs that runs out of space needs root")


@contextlib.contextmanager
def small_tmpfs(path: Path, size: str) -> Iterator[Path]:
    """A real file system of `size` at `path`: writes past it fail with ENOSPC, as on a full volume."""
    path.mkdir(parents=True, exist_ok=True)
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)], check=True)
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], check=False)


def fill(folder: Path) -> None:
    """Take every free byte of the file system under `folder`."""
    with (folder / "filler").open("wb") as handle, contextlib.suppress(OSError):
        while True:
            handle.write(b"\0" * 65536)
            handle.flush()


def stage(module: str, command: str, volume: Path, run_dir: Path, config: PipelineConfig,
          env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", module, command, "--volume", str(volume), "--run-dir", str(run_dir),
                           "--run-id", "r1"], capture_output=True, text=True, timeout=600,
                          env={**os.environ, **(env or {}), CONFIG_ENV: config.model_dump_json()})


def user_model(tmp_path: Path, name: str, source: str, pipeline: Path) -> dict[str, str]:
    """Write model module `name` in a folder of the user's, point `pipeline`'s config at it; the env that finds it."""
    models = tmp_path / "user_models"
    models.mkdir(exist_ok=True)
    (models / f"{name}.py").write_text(source)
    pipeline.write_text(pipeline.read_text().replace("module: trainyard_trainer.models.mlp", f"module: {name}"))
    return {"PYTHONPATH": f"{models}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}


def output_of(done: subprocess.CompletedProcess[str]) -> list[str]:
    return (done.stdout + done.stderr).splitlines()


@needs_root
def test_a_full_volume_in_prepare_is_named_and_exits_for_good(pipelines_dir: Path, tmp_path: Path) -> None:
    config = load_pipeline_file(pipelines_dir / "digits.yaml")
    with small_tmpfs(tmp_path / "volume", "32m") as volume:
        write_digits(volume / layout.DATASETS / "digits", days=2, end=END)
        run_dir = volume / layout.RUNS / "digits" / "r1"
        pin_inputs(volume, run_dir, config.data, None)
        fill(volume)
        done = stage("trainyard_prep", "prepare", volume, run_dir, config)
        assert done.returncode == EXIT_ENVIRONMENT, done.stdout[-2000:] + done.stderr[-2000:]
        assert done.stdout.splitlines()[-1].startswith(ERROR_MARKER)
        cause = failure_cause(output_of(done))
        assert cause is not None and cause.startswith("out of space: OSError: ") and \
            "[Errno 28] No space left on device" in cause, cause
        assert not (run_dir / layout.PREPARED).exists()  # nothing half-written under the final name


@needs_root
def test_a_full_volume_in_training_is_named_and_exits_for_good(pipelines_dir: Path, data_dir: Path,
                                                             tmp_path: Path) -> None:
    config = load_pipeline_file(pipelines_dir / "digits.yaml")
    config = PipelineConfig.model_validate({**config.model_dump(), "training": {
        **config.training.model_dump(), "strategy": "single", "ps": {"replicas": 0},
        "workers": {"replicas": 0}, "steps": 20, "checkpoint_every_steps": 10}})
    write_digits(data_dir / layout.DATASETS / "digits", days=2, end=END)
    run_dir, _ = validate_and_prepare(config, data_dir)
    with small_tmpfs(run_dir / layout.CHECKPOINTS, "64k"):  # the first checkpoint does not fit
        done = stage("trainyard_trainer", "train", data_dir, run_dir, config)
    assert done.returncode == EXIT_ENVIRONMENT, done.stdout[-2000:] + done.stderr[-2000:]
    cause = failure_cause(output_of(done))
    assert cause is not None and "out of space" in cause and "No space left on device" in cause, cause
    assert not (run_dir / layout.MODEL).exists()


SMALL_EMBEDDING = '''
import keras


def build_model(params, schema):
    inputs = {"numeric": keras.Input(shape=(len(schema.numeric),), name="numeric"),
              "country": keras.Input(shape=(), dtype="int64", name="country")}
    embedded = keras.layers.Embedding(4, 2)(inputs["country"])  # 4 rows: the country vocabulary has more ids
    joined = keras.layers.Concatenate()([inputs["numeric"], embedded])
    return keras.Model(inputs, keras.layers.Dense(2)(joined))
'''
OUT_OF_RANGE = re.compile(r"InvalidArgumentError: indices\[\d+\] = \d+ is not in \[0, 4\)")


def test_a_model_bug_on_real_ids_is_bad_input_everywhere_it_can_show(pipelines_dir: Path, data_dir: Path,
                                                                      tmp_path: Path) -> None:
    path = pipelines_dir / "churn.yaml"
    env = user_model(tmp_path, "small_embedding", SMALL_EMBEDDING, path)
    # trainyard check: before any data exists, at the config line
    checked = subprocess.run([sys.executable, "-m", "trainyard.cli", "check", str(path)], capture_output=True,
                             text=True, timeout=300, env={**os.environ, **env})
    assert checked.returncode == 1, checked.stdout + checked.stderr
    module_line = next(i for i, text in enumerate(path.read_text().splitlines(), 1)
                       if "module: small_embedding" in text)
    line = next(line for line in checked.stderr.splitlines() if "training.model.module" in line)
    assert line.startswith(f"{path}:{module_line}:") and OUT_OF_RANGE.search(line), line
    # a chief that meets it while training (with no check before it) exits as bad input, its cause quoted
    config = load_pipeline_file(path)
    single = PipelineConfig.model_validate({**config.model_dump(), "training": {
        **config.training.model_dump(), "strategy": "single", "ps": {"replicas": 0},
        "workers": {"replicas": 0}, "steps": 20}})
    write_churn(data_dir / layout.DATASETS / "churn", rows=1500, days=1, end=END)
    run_dir, _ = validate_and_prepare(single, data_dir)
    trained = stage("trainyard_trainer", "train", data_dir, run_dir, single, env)
    assert trained.returncode == EXIT_BAD_INPUT, trained.stdout[-2000:] + trained.stderr[-2000:]
    cause = failure_cause(output_of(trained))
    assert cause is not None and "small_embedding failed on a training batch" in cause and OUT_OF_RANGE.search(cause)
    # through Airflow: the train task's model check stops it before any replica starts, once (attempt 1 is the
    # last), and the summary quotes it
    done = trainyard("run", "churn", env=env)
    assert done.returncode == 1, done.stdout[-3000:]
    summary = [line for line in done.stdout.splitlines() if line.startswith("trainyard run: ")]
    assert "trainyard run: failed task: train (attempt 1)" in summary, "\n".join(summary)
    error = next(line for line in summary if line.startswith("trainyard run: error: "))
    assert error.startswith("trainyard run: error: check failed: small_embedding fails on a batch") and \
        OUT_OF_RANGE.search(error), error
    assert "trainyard run: a retry would fail the same way: fix the data, the config or the model code, then run " \
           "again" in summary
    assert "--- chief" not in done.stdout  # no replica was started


PICKY = '''
import keras
import tensorflow as tf

from trainyard_trainer.models.mlp import build_model as mlp


class Picky(keras.Model):
    """Fine on the model check's small batches, broken on a training batch: a bug only training shows."""

    def __init__(self, inner):
        super().__init__()
        self.inner = inner

    def call(self, inputs, training=False):
        tf.debugging.assert_less(tf.shape(inputs["numeric"])[0], 10, message="batches over 9 rows break this model")
        return self.inner(inputs, training=training)


def build_model(params, schema):
    return Picky(mlp(params, schema))
'''


def test_a_chief_that_dies_on_the_models_own_error_is_not_retried_and_the_summary_quotes_it(
        pipelines_dir: Path, data_dir: Path, tmp_path: Path) -> None:
    env = user_model(tmp_path, "picky", PICKY, pipelines_dir / "digits.yaml")
    write_digits(data_dir / layout.DATASETS / "digits", days=2)
    done = trainyard("run", "digits", "--conf", '{"steps": 20, "workers": 1}', env=env)
    assert done.returncode == 1, done.stdout[-3000:]
    summary = [line for line in done.stdout.splitlines() if line.startswith("trainyard run: ")]
    assert "trainyard run: failed task: train (attempt 1)" in summary, "\n".join(summary)
    error = next(line for line in summary if line.startswith("trainyard run: error: "))
    assert error.startswith("trainyard run: error: training job failed: chief exited with code 3: train failed: "
                            "picky failed on a training batch: InvalidArgumentError: ") and \
        "batches over 9 rows break this model" in error, error
    assert "trainyard run: a retry would fail the same way: fix the data, the config or the model code, then run " \
           "again" in summary
