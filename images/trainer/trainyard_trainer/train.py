"""The training loop for the three strategies; the chief (or the single process) coordinates and exports.

parameter_server: `tf.distribute.ParameterServerStrategy` + `ClusterCoordinator` with a custom loop (Keras 3
`model.fit` does not run under this strategy in TF 2.21); steps are scheduled onto workers, which may die and come
back while training goes on. multi_worker_mirrored: synchronous all-reduce, the same loop body run by every worker.
single: one process, no cluster. Checkpoints every `checkpoint_every_steps` into `checkpoints/`, restored at start.
Each compiled call runs up to `steps_per_execution` steps in a `tf.range` loop (on one worker, for
parameter_server), so the per-step cost of dispatching a function is paid once per call; the logged losses are
the mean loss of each call.
"""

from __future__ import annotations

import importlib
import logging
import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import keras
import tensorflow as tf

from trainyard_contract import layout
from trainyard_contract.artifacts import TrainingRecord
from trainyard_contract.runtime import StageError
from trainyard_contract.schema import PipelineConfig
from trainyard_contract.tf_config import TaskConfig
from trainyard_trainer.data import make_dataset
from trainyard_trainer.features import FeatureTransform, dummy_raw_batch
from trainyard_trainer.model_schema import NUMERIC_INPUT, ModelSchema

log = logging.getLogger("trainyard")


class ModelError(StageError):
    """The configured model module or its params cannot build a model, or the model refuses a training batch:
    bad input (exit 3, not retried), quoted as the stage's cause."""


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
        raise ModelError(f"training.model.module {module_name!r} cannot be imported: {exc} (a module of your "
                         "own goes in images/trainer/trainyard_trainer/models/: see the README, 'Your own "
                         "model')") from None
    except Exception as exc:  # the user's module fails while importing: a config problem, said as such
        raise ModelError(f"training.model.module {module_name!r} fails on import: "
                         f"{type(exc).__name__}: {exc}") from None
    if not callable(getattr(module, "build_model", None)):
        raise ModelError(f"training.model.module {module_name!r} has no build_model(params, schema) function")
    return module


@dataclass(frozen=True)
class ModelParts:
    model: keras.Model
    loss: Any  # per-example loss: (labels, outputs) -> [batch]
    optimizer: Any
    extra_metrics: list[Any]  # built here too, so check_model finds a failing metrics() before training


def default_loss(schema: ModelSchema) -> Any:
    if schema.is_classification:
        return keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction="none")
    return keras.losses.MeanSquaredError(reduction="none")


def build(config: PipelineConfig, schema: ModelSchema) -> ModelParts:
    """The model, its loss, optimizer and extra metrics, with the module's own where it defines them; errors
    name the config field. Called under the strategy's scope when training."""
    name = config.training.model.module
    module = load_model_module(name)
    params = dict(config.training.model.params)
    rate = config.training.learning_rate
    try:
        model = module.build_model(params, schema)
        loss = module.loss(params, schema) if callable(getattr(module, "loss", None)) else default_loss(schema)
        optimizer = (module.optimizer(params, rate) if callable(getattr(module, "optimizer", None))
                     else keras.optimizers.Adam(learning_rate=rate))
        extra = list(module.metrics(params, schema)) if callable(getattr(module, "metrics", None)) else []
    except ModelError:
        raise
    except Exception as exc:  # the user's model code: any failure is a config problem
        raise ModelError(f"{name} fails on this pipeline's schema ({_schema_summary(schema)}) with params "
                         f"{params}: {error_text(exc)}") from None
    if not isinstance(model, keras.Model):
        raise ModelError(f"{name}.build_model returned {type(model).__name__}, not keras.Model")
    return ModelParts(model, loss, optimizer, extra)


def _schema_summary(schema: ModelSchema) -> str:
    target = f"{schema.num_classes} classes" if schema.is_classification else "regression"
    return f"{len(schema.numeric)} numeric, {len(schema.categorical)} categorical feature(s), {target}"


def model_outputs(model: keras.Model, inputs: dict[str, tf.Tensor], schema: ModelSchema,
                  training: bool) -> tf.Tensor:
    """Logits [batch, classes], or predictions [batch, 1] (a [batch] output is given its axis). A functional
    model that declares only some of the inputs (numeric only, say) is given just those."""
    declared = declared_inputs(model)
    if declared is not None and set(declared) <= set(inputs):
        inputs = {name: inputs[name] for name in declared}
    outputs = model(inputs, training=training)
    if not schema.is_classification and outputs.shape.rank == 1:
        outputs = outputs[:, tf.newaxis]
    return outputs


def declared_inputs(model: keras.Model) -> list[str] | None:
    """The input names of a functional model built on a dict of inputs; None for any other model."""
    try:
        structure = model.input
    except (AttributeError, ValueError):
        return None
    return list(structure) if isinstance(structure, dict) else None


NOISE_PREFIXES = ("Exception encountered", "Arguments received", "•", "Graph execution error", "Detected at node",
                  "defined at", "File ", "[[", "Stack trace", "Error in user-defined function", "Traceback")


def error_text(exc: Exception) -> str:
    """An exception in a few words: Keras puts the useful part after an 'Exception encountered' line; a
    TensorFlow op error after 'Graph execution error' and the frames of where the op was defined."""
    raw = exc.message if isinstance(exc, tf.errors.OpError) else str(exc)
    raw = re.sub(r"\x1b\[[0-9;]*m|\{\{function_node [^}]*\}\}\s*", "", raw)  # Keras' bold, TF's op prefix
    lines = [line.strip() for line in raw.splitlines() if line.strip()]
    useful = [line for line in lines if not line.startswith(NOISE_PREFIXES) and not line.startswith("(")]
    useful = [line.split(" [[", 1)[0].split(" [Op:", 1)[0].strip() for line in useful]
    return f"{type(exc).__name__}: {' '.join(u for u in useful[:3] if u) or ' '.join(lines[:1])}"


def ensure_built(model: keras.Model, transform: FeatureTransform, schema: ModelSchema) -> None:
    """A subclassed model has no variables until it is called once; a functional one is built already."""
    if not model.built or not model.trainable_variables:
        model_outputs(model, transform(dummy_raw_batch(schema)), schema, training=False)


def probe_batch(schema: ModelSchema) -> tuple[dict[str, tf.Tensor], tf.Tensor]:
    """Model inputs (after the feature transform) and labels for one batch of 3 rows that reaches every edge:
    each numeric feature at its train minimum, mean and maximum; each categorical feature at id 0 (the first
    out-of-vocabulary bucket), its last id (`size - 1`, the last vocabulary entry) and its middle; the first and
    last class, or the label's minimum and maximum. A model that only breaks on real ids (an Embedding smaller
    than the vocabulary) breaks here, before any replica starts."""
    inputs: dict[str, tf.Tensor] = {}
    if schema.numeric:
        columns = [[f.min if f.min is not None else f.mean - f.std, f.mean,
                    f.max if f.max is not None else f.mean + f.std] for f in schema.numeric]
        inputs[NUMERIC_INPUT] = tf.constant(list(zip(*columns, strict=True)), tf.float32)
    for f in schema.categorical:
        inputs[f.name] = tf.constant([0, f.size - 1, (f.size - 1) // 2], tf.int64)
    if schema.is_classification:
        labels = tf.constant([0, schema.num_classes - 1, (schema.num_classes - 1) // 2], tf.int64)
    else:
        low = schema.label.min if schema.label.min is not None else schema.label.mean - schema.label.std
        high = schema.label.max if schema.label.max is not None else schema.label.mean + schema.label.std
        labels = tf.constant([low, schema.label.mean, high], tf.float32)
    return inputs, labels


def check_model(config: PipelineConfig, schema: ModelSchema) -> dict[str, Any]:
    """Build the model and run one batch that reaches every vocabulary edge forward and backward (loss and
    gradients, as a training step does, without applying them): a bad module, bad params or a model that only
    fails on real ids fails here, before any replica starts (and in `trainyard check`, before any data exists)."""
    parts = build(config, schema)
    name = config.training.model.module
    inputs, labels = probe_batch(schema)
    try:
        with tf.GradientTape() as tape:
            outputs = model_outputs(parts.model, inputs, schema, training=True)
            if tuple(outputs.shape) == (3, schema.output_units):
                targets = labels if schema.is_classification else labels[:, tf.newaxis]
                loss = tf.reduce_mean(parts.loss(targets, outputs))
        if tuple(outputs.shape) == (3, schema.output_units):
            tape.gradient(loss, parts.model.trainable_variables)
    except Exception as exc:  # the user's model code: any failure is a config problem
        raise ModelError(f"{name} fails on a batch of this pipeline's features ({_schema_summary(schema)}; "
                         f"every vocabulary id at its edge, forward and backward): {error_text(exc)}") from None
    expected = (3, schema.output_units)
    if tuple(outputs.shape) != expected:
        what = f"{schema.num_classes} logits, one per class" if schema.is_classification else "1 prediction"
        raise ModelError(f"{name} returns shape {tuple(outputs.shape)[1:]} per example, expected "
                         f"({expected[1]},): {what}")
    return {"parameters": int(parts.model.count_params()), "model": parts.model.name, "task": schema.task,
            "probe_loss": round(float(loss), 6)}


def make_strategy(strategy: str, task: TaskConfig | None) -> tf.distribute.Strategy:
    if strategy == "parameter_server":
        if task is None:
            raise ModelError("parameter_server training needs TF_CONFIG (started by Trainyard's train task)")
        resolver = tf.distribute.cluster_resolver.TFConfigClusterResolver()
        return tf.distribute.ParameterServerStrategy(resolver)
    if strategy == "multi_worker_mirrored":
        return tf.distribute.MultiWorkerMirroredStrategy()
    return tf.distribute.get_strategy()


def train(config: PipelineConfig, run_dir: Path, task: TaskConfig | None, schema: ModelSchema,
          checkpoint_dir: Path | None = None) -> tuple[TrainResult, keras.Model]:
    """Run the loop on the coordinating process; returns what training.json records and the trained model.

    An op that refuses its arguments while training (InvalidArgumentError: an id outside an Embedding, shapes
    that do not fit) is the model code's doing on these examples, not the cluster's: it becomes a ModelError,
    which the entrypoint reports as bad input (not retried, the cause quoted). Lost replicas, timeouts and
    transport errors are other error types and stay retryable."""
    try:
        return _train(config, run_dir, task, schema, checkpoint_dir)
    except tf.errors.InvalidArgumentError as exc:
        raise ModelError(f"{config.training.model.module} failed on a training batch: {error_text(exc)}") from None


def _train(config: PipelineConfig, run_dir: Path, task: TaskConfig | None, schema: ModelSchema,
           checkpoint_dir: Path | None = None) -> tuple[TrainResult, keras.Model]:
    training = config.training
    strategy = make_strategy(training.strategy, task)
    with strategy.scope():
        parts = build(config, schema)
        model, optimizer = parts.model, parts.optimizer
        # lookup tables created under the scope: parameter-server training gives each worker its own copy
        transform = FeatureTransform(schema)
        ensure_built(model, transform, schema)
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
    run_calls = compiled_steps(strategy, parts, schema, batch)
    started = time.monotonic()

    def dataset() -> tf.data.Dataset:
        return make_dataset(run_dir / layout.PREPARED, "train", batch, repeat=True, shuffle_seed=None, schema=schema,
                            transform=transform)

    def interval_done(current: int, interval_losses: list[float]) -> None:
        _after_interval(current, interval_losses, started, start_step, batch, step, manager, writer)

    loop = run_on_parameter_servers if training.strategy == "parameter_server" else run_in_process
    current, losses = loop(strategy, run_calls, dataset, config, start_step, interval_done)
    seconds = time.monotonic() - started
    trained = current - start_step  # one batch per step, whichever worker ran it
    return TrainResult(steps=current, resumed_from_step=start_step, seconds=round(seconds, 3),
                       examples_per_second=round(trained * batch / max(seconds, 1e-9), 1),
                       final_loss=round(losses[-1], 6) if losses else None), model


def compiled_steps(strategy: tf.distribute.Strategy, parts: ModelParts, schema: ModelSchema, batch: int) -> Any:
    """`run_calls(iterator, count)`: `count` training steps in one compiled call (on one worker, for
    parameter_server), returning their mean loss."""
    model, loss_object, optimizer = parts.model, parts.loss, parts.optimizer

    def replica_step(features: dict[str, tf.Tensor], labels: tf.Tensor) -> tf.Tensor:
        with tf.GradientTape() as tape:
            outputs = model_outputs(model, features, schema, training=True)
            targets = labels if schema.is_classification else labels[:, tf.newaxis]
            per_example = loss_object(targets, outputs)
            loss = tf.nn.compute_average_loss(per_example, global_batch_size=batch)
        grads = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(grads, model.trainable_variables, strict=True))
        return loss

    @tf.function
    def run_calls(iterator: Any, count: tf.Tensor) -> tf.Tensor:
        total = tf.constant(0.0)
        for _ in tf.range(count):
            features, labels = next(iterator)
            total += strategy.reduce("SUM", strategy.run(replica_step, args=(features, labels)), axis=None)
        return total / tf.cast(count, tf.float32)

    return run_calls


def intervals(start_step: int, steps: int, every: int) -> list[tuple[int, int]]:
    """The checkpoint intervals left: (steps in it, step reached at its end). From 150 to 500 by 200 ->
    [(200, 350), (150, 500)]."""
    out, current = [], start_step
    while current < steps:
        chunk = min(every, steps - current)
        current += chunk
        out.append((chunk, current))
    return out


def run_on_parameter_servers(strategy: tf.distribute.Strategy, run_calls: Any, dataset: Callable[[], Any],
                             config: PipelineConfig, start_step: int,
                             interval_done: Callable[[int, list[float]], None]) -> tuple[int, list[float]]:
    """The chief's loop under ParameterServerStrategy: steps scheduled on the workers through a
    ClusterCoordinator, a checkpoint after each interval. Returns the step reached and the losses read back."""
    training = config.training
    started = time.monotonic()
    coordinator = tf.distribute.coordinator.ClusterCoordinator(strategy)
    iterator = iter(coordinator.create_per_worker_dataset(dataset))

    def run_steps(count: int) -> list[float]:
        """Schedule `count` steps in calls of up to `steps_per_execution`, wait for all of them, then read the
        last losses back.

        Results are fetched only once no step is in flight: in TF 2.21 a fetch from the main thread while
        the coordinator's threads dispatch steps once sent a worker a request with a corrupted device name
        ("Unable to parse request"), which failed the chief.
        """
        pending = [coordinator.schedule(run_calls, args=(iterator, tf.constant(n, tf.int32)))
                   for n in calls_of(count, training.steps_per_execution)]
        coordinator.join()
        return [fetch_loss(r) for r in pending[-10:]]

    current, losses = start_step, []
    for chunk, current in intervals(start_step, training.steps, training.checkpoint_every_steps):
        first: list[float] = []
        if current - chunk == start_step:  # one step alone first: the log then says how long start-up took
            first = run_steps(1)
            log.info("first step done %.1f s after the coordinator started", time.monotonic() - started)
        interval_losses = (first + run_steps(chunk - len(first)))[-10:]
        losses.extend(interval_losses)
        interval_done(current, interval_losses)
    return current, losses


def run_in_process(strategy: tf.distribute.Strategy, run_calls: Any, dataset: Callable[[], Any],
                   config: PipelineConfig, start_step: int,
                   interval_done: Callable[[int, list[float]], None]) -> tuple[int, list[float]]:
    """The loop of every other strategy: each process runs its steps on a distributed dataset."""
    training = config.training
    iterator = iter(strategy.experimental_distribute_dataset(dataset()))
    current, losses = start_step, []
    for chunk, current in intervals(start_step, training.steps, training.checkpoint_every_steps):
        interval_losses = [float(run_calls(iterator, tf.constant(n, tf.int32)))
                           for n in calls_of(chunk, training.steps_per_execution)][-10:]
        losses.extend(interval_losses)
        interval_done(current, interval_losses)
    return current, losses


def calls_of(steps: int, per_call: int) -> list[int]:
    """`steps` cut into calls of `per_call` steps, the remainder last: 45 steps by 20 -> [20, 20, 5]."""
    full, rest = divmod(steps, per_call)
    return [per_call] * full + ([rest] if rest else [])


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


def training_record(result: TrainResult, config: PipelineConfig) -> TrainingRecord:
    """What `model/training.json` records about the run that produced the model."""
    return TrainingRecord(
        steps=result.steps, resumed_from_step=result.resumed_from_step, seconds=result.seconds,
        examples_per_second=result.examples_per_second, final_loss=result.final_loss,
        strategy=config.training.strategy, workers=config.training.workers.replicas,
        ps=config.training.ps.replicas, batch_size=config.training.batch_size,
        learning_rate=config.training.learning_rate, model_module=config.training.model.module,
        task=config.data.label.task, tensorflow=tf.__version__, keras=keras.__version__,
    )
