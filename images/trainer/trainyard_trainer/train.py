"""The training loop for the three strategies; the chief (or the single process) coordinates and exports.

parameter_server: `tf.distribute.ParameterServerStrategy` + `ClusterCoordinator` with a custom loop (Keras 3
`model.fit` does not run under this strategy in TF 2.21); steps are scheduled onto workers, which may die and come
back while training goes on. multi_worker_mirrored: synchronous all-reduce, the same loop body run by every worker.
single: one process, no cluster. Checkpoints every `checkpoint_every_steps` into `checkpoints/`, restored at start.
"""

from __future__ import annotations

import importlib
import logging
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import keras
import tensorflow as tf

from trainyard_contract import layout
from trainyard_contract.schema import PipelineConfig
from trainyard_contract.tf_config import TaskConfig
from trainyard_trainer.data import make_dataset

log = logging.getLogger("trainyard")


class ModelError(Exception):
    """The configured model module or its params cannot build a model; a user error."""


@dataclass(frozen=True)
class TrainResult:
    steps: int
    resumed_from_step: int
    seconds: float
    examples_per_second: float
    final_loss: float | None


def load_model_module(module_name: str) -> Any:
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ModelError(f"training.model.module {module_name!r} cannot be imported: {exc}") from None
    if not callable(getattr(module, "build_model", None)):
        raise ModelError(f"training.model.module {module_name!r} has no build_model(params, schema) function")
    return module


def build(config: PipelineConfig, schema: dict[str, Any]) -> tuple[keras.Model, Any]:
    """The model and its loss, with errors that name the config field."""
    module = load_model_module(config.training.model.module)
    params = dict(config.training.model.params)
    try:
        model = module.build_model(params, schema)
    except (ValueError, TypeError, KeyError) as exc:
        raise ModelError(f"training.model.params are not valid for {config.training.model.module}: {exc}") from None
    if not isinstance(model, keras.Model):
        raise ModelError(f"{config.training.model.module}.build_model returned {type(model).__name__}, not keras.Model")
    if callable(getattr(module, "loss", None)):
        loss = module.loss(params)
    else:
        loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction="none")
    return model, loss


def check_model(config: PipelineConfig, schema: dict[str, Any]) -> dict[str, Any]:
    """Build the model once on a dummy batch: a bad module or params fails here, before any replica starts."""
    model, _ = build(config, schema)
    n_features = len(schema["features"])
    try:
        logits = model(tf.zeros([2, n_features]), training=False)
    except Exception as exc:  # the user's model code: any failure is a config problem
        raise ModelError(f"{config.training.model.module} fails on a batch of {n_features} features: {exc}") from None
    classes = len(schema["label"]["classes"])
    if tuple(logits.shape) != (2, classes):
        raise ModelError(f"{config.training.model.module} returns shape {tuple(logits.shape)[1:]}, "
                         f"expected ({classes},) logits for the {classes} classes")
    return {"parameters": int(model.count_params()), "model": model.name}


def make_strategy(strategy: str, task: TaskConfig | None) -> tf.distribute.Strategy:
    if strategy == "parameter_server":
        if task is None:
            raise ModelError("parameter_server training needs TF_CONFIG (started by Trainyard's train task)")
        resolver = tf.distribute.cluster_resolver.TFConfigClusterResolver()
        return tf.distribute.ParameterServerStrategy(resolver)
    if strategy == "multi_worker_mirrored":
        return tf.distribute.MultiWorkerMirroredStrategy()
    return tf.distribute.get_strategy()


def train(config: PipelineConfig, run_dir: Path, task: TaskConfig | None, schema: dict[str, Any],
          checkpoint_dir: Path | None = None) -> tuple[TrainResult, keras.Model]:
    """Run the loop on the coordinating process; returns what training.json records and the trained model."""
    training = config.training
    strategy = make_strategy(training.strategy, task)
    prepared = run_dir / layout.PREPARED
    with strategy.scope():
        model, loss_object = build(config, schema)
        model.build((None, len(schema["features"])))
        optimizer = keras.optimizers.Adam(learning_rate=training.learning_rate)
        optimizer.build(model.trainable_variables)
        step = tf.Variable(0, dtype=tf.int64, trainable=False, name="global_step")
    checkpoint = tf.train.Checkpoint(model=model, optimizer=optimizer, step=step)
    manager = tf.train.CheckpointManager(checkpoint, str(checkpoint_dir or run_dir / layout.CHECKPOINTS), max_to_keep=3,
                                         step_counter=step)
    restored = manager.restore_or_initialize()
    start_step = int(step.numpy())
    if restored:
        log.info("restored checkpoint %s: resuming at step %d", restored, start_step)
    writer = tf.summary.create_file_writer(str(run_dir / layout.TENSORBOARD_TRAIN))
    batch = training.batch_size

    def replica_step(features: tf.Tensor, labels: tf.Tensor) -> tf.Tensor:
        with tf.GradientTape() as tape:
            logits = model(features, training=True)
            per_example = loss_object(labels, logits)
            loss = tf.nn.compute_average_loss(per_example, global_batch_size=batch)
        grads = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(grads, model.trainable_variables, strict=True))
        return loss

    started = time.monotonic()
    losses: list[float] = []
    current = start_step
    every = training.checkpoint_every_steps
    if training.strategy == "parameter_server":
        coordinator = tf.distribute.coordinator.ClusterCoordinator(strategy)

        def per_worker_dataset_fn() -> tf.data.Dataset:
            return make_dataset(prepared, "train", batch, repeat=True, shuffle_seed=None, schema=schema)

        iterator = iter(coordinator.create_per_worker_dataset(per_worker_dataset_fn))

        @tf.function
        def worker_fn(it: Any) -> tf.Tensor:
            features, labels = next(it)
            loss = strategy.run(replica_step, args=(features, labels))
            return strategy.reduce("SUM", loss, axis=None)

        def run_steps(count: int) -> list[float]:
            """Schedule `count` steps, wait for all of them, then read the last losses back.

            Results are fetched only once no step is in flight: in TF 2.21 a fetch from the main thread while
            the coordinator's threads dispatch steps once sent a worker a request with a corrupted device name
            ("Unable to parse request"), which failed the chief.
            """
            pending = [coordinator.schedule(worker_fn, args=(iterator,)) for _ in range(count)]
            coordinator.join()
            return [fetch_loss(r) for r in pending[-10:]]

        while current < training.steps:
            chunk = min(every, training.steps - current)
            interval_losses: list[float] = []
            if current == start_step:  # one step alone first: the log then says how long start-up took
                interval_losses = run_steps(1)
                log.info("first step done %.1f s after the coordinator started", time.monotonic() - started)
            interval_losses = (interval_losses + run_steps(chunk - len(interval_losses)))[-10:]
            current += chunk
            losses.extend(interval_losses)
            _after_interval(current, interval_losses, started, start_step, batch, step, manager, writer)
    else:
        dataset = strategy.experimental_distribute_dataset(
            make_dataset(prepared, "train", batch, repeat=True, shuffle_seed=None, schema=schema))
        iterator = iter(dataset)

        @tf.function
        def distributed_step(features: Any, labels: Any) -> tf.Tensor:
            loss = strategy.run(replica_step, args=(features, labels))
            return strategy.reduce("SUM", loss, axis=None)

        while current < training.steps:
            chunk = min(every, training.steps - current)
            interval_losses = []
            for _ in range(chunk):
                features, labels = next(iterator)
                interval_losses.append(float(distributed_step(features, labels)))
            current += chunk
            losses.extend(interval_losses[-10:])
            _after_interval(current, interval_losses[-10:], started, start_step, batch, step, manager, writer)
    seconds = time.monotonic() - started
    trained = current - start_step  # one batch per step, whichever worker ran it
    return TrainResult(steps=current, resumed_from_step=start_step, seconds=round(seconds, 3),
                       examples_per_second=round(trained * batch / max(seconds, 1e-9), 1),
                       final_loss=round(losses[-1], 6) if losses else None), model


def fetch_loss(result: Any, attempts: int = 3) -> float:
    """A finished step's loss, copied from its worker; a failed copy is tried again.

    The step itself has already run (the coordinator joined), so a failed copy is a transport error, not a
    training one, and copying again is safe: a RemoteValue keeps its remote result until a copy succeeds.
    """
    for attempt in range(1, attempts):
        try:
            return float(result.fetch())
        except tf.errors.InternalError as exc:
            log.warning("copying a step's loss from its worker failed (attempt %d of %d), trying again: %s",
                        attempt, attempts, str(exc).splitlines()[0])
    return float(result.fetch())


def _after_interval(current: int, interval_losses: list[float], started: float, start_step: int, batch: int,
                    step: tf.Variable, manager: tf.train.CheckpointManager, writer: Any) -> None:
    step.assign(current)
    path = manager.save(checkpoint_number=current)
    elapsed = max(time.monotonic() - started, 1e-9)
    loss = sum(interval_losses) / max(len(interval_losses), 1)
    rate = (current - start_step) * batch / elapsed
    with writer.as_default():
        tf.summary.scalar("loss", loss, step=current)
        tf.summary.scalar("examples_per_second", rate, step=current)
    writer.flush()
    log.info("step %d loss %.4f examples/s %.0f checkpoint %s", current, loss, rate, Path(path).name)


def training_record(result: TrainResult, config: PipelineConfig) -> dict[str, Any]:
    """What `model/training.json` records about the run that produced the model."""
    return {
        "steps": result.steps, "resumed_from_step": result.resumed_from_step, "seconds": result.seconds,
        "examples_per_second": result.examples_per_second, "final_loss": result.final_loss,
        "strategy": config.training.strategy, "workers": config.training.workers.replicas,
        "ps": config.training.ps.replicas, "batch_size": config.training.batch_size,
        "learning_rate": config.training.learning_rate, "model_module": config.training.model.module,
        "tensorflow": tf.__version__, "keras": keras.__version__,
    }
