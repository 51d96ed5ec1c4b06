"""Training job figures on the local backend, with real TensorFlow processes on 127.0.0.1.

1. Input-bound check: parameter-server steps/s with the TFRecord input pipeline vs the same batches from memory
   (target >= 0.9x). In-process cluster (one PS, one worker server) so only the input differs.
2. Startup: seconds from task start to the first training step, and each replica's ready time.
3. Worker loss cost: extra wall time of a run whose worker is SIGKILLed mid-training vs an undisturbed run
   (target <= one checkpoint interval + one restart).
4. Scaling: examples/s with 1 and 2 workers on a compute-bound model (2 cores here: reported, not tuned).
5. The loop vs tf-keras: on one prepared dataset and one cluster shape (1 PS + 1 worker + the chief, each its own
   process, MLP 512x3, batch 256), Trainyard's loop vs tf-keras 2.21 `model.fit` under ParameterServerStrategy
   with steps_per_execution 1 and 20 (target: Trainyard >= 1.0x the faster). Each is measured in the steady state:
   examples between its first and last interval of 100 steps (a checkpoint for Trainyard, an epoch for Keras, each
   ending in a join), over the seconds between them, in alternating rounds. tf-keras is a bench dependency
   (bench/requirements.txt), never the project's.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import logging
import os
import re
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from trainyard_contract import layout

REPO = Path(__file__).resolve().parents[1]
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

INPUT_BOUND = r'''
import json, socket, sys, time
from pathlib import Path
import keras, tensorflow as tf
from trainyard_contract import layout
from trainyard_trainer.data import load_schema, make_dataset
from trainyard_trainer.features import FeatureTransform
from trainyard_trainer.models import mlp

def port():
    s = socket.socket(); s.bind(("127.0.0.1", 0)); p = s.getsockname()[1]; s.close(); return p

run_dir, steps, batch = Path(sys.argv[1]), int(sys.argv[2]), 64
prepared = run_dir / layout.PREPARED
spec = tf.train.ClusterSpec({"worker": [f"127.0.0.1:{port()}"], "ps": [f"127.0.0.1:{port()}"]})
for job in ("worker", "ps"):
    tf.distribute.Server(spec, job_name=job, task_index=0, protocol="grpc", start=True)
resolver = tf.distribute.cluster_resolver.SimpleClusterResolver(spec, rpc_layer="grpc")
strategy = tf.distribute.ParameterServerStrategy(resolver)
coordinator = tf.distribute.coordinator.ClusterCoordinator(strategy)
schema = load_schema(run_dir)
with strategy.scope():
    model = mlp.build_model({"hidden_units": [64, 32]}, schema)
    transform = FeatureTransform(schema)
    optimizer = keras.optimizers.Adam(0.01)
    optimizer.build(model.trainable_variables)
loss_object = keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction="none")
# the same batches, materialised in memory once
cached = [b for b in make_dataset(prepared, "train", batch, repeat=True, shuffle_seed=None, schema=schema,
                                  transform=transform).take(50)]
features = {k: tf.concat([b[0][k] for b in cached], 0) for k in cached[0][0]}
labels = tf.concat([b[1] for b in cached], 0)

def tfrecord_fn():
    return make_dataset(prepared, "train", batch, repeat=True, shuffle_seed=None, schema=schema,
                        transform=transform)

def memory_fn():
    return tf.data.Dataset.from_tensor_slices((features, labels)).batch(batch, drop_remainder=True).repeat()

def step(x, y):
    with tf.GradientTape() as tape:
        loss = tf.nn.compute_average_loss(loss_object(y, model(x, training=True)), global_batch_size=batch)
    optimizer.apply_gradients(zip(tape.gradient(loss, model.trainable_variables), model.trainable_variables))
    return loss

result = {"memory": [], "tfrecord": []}
for name, fn in [("memory", memory_fn), ("tfrecord", tfrecord_fn)] * 3:  # alternating rounds against drift
    iterator = iter(coordinator.create_per_worker_dataset(fn))
    @tf.function
    def worker_fn(it):
        x, y = next(it)
        return strategy.run(step, args=(x, y))
    for _ in range(50):
        coordinator.schedule(worker_fn, args=(iterator,))
    coordinator.join()
    t = time.perf_counter()
    for _ in range(steps):
        coordinator.schedule(worker_fn, args=(iterator,))
    coordinator.join()
    result[name].append(steps / (time.perf_counter() - t))
print(json.dumps(result))
'''


SERVER = r'''
import json, os, tensorflow as tf
spec = json.loads(os.environ["TF_CONFIG"])
tf.distribute.Server(tf.train.ClusterSpec(spec["cluster"]), job_name=spec["task"]["type"],
                     task_index=spec["task"]["index"], protocol="grpc", start=True).join()
'''

TRAINYARD_CHIEF = r'''
import json, logging, sys, time
from pathlib import Path
from trainyard_contract.schema import PipelineConfig
from trainyard_contract.tf_config import read_tf_config
from trainyard_trainer.data import load_schema
from trainyard_trainer.train import train

times = []
class Intervals(logging.Handler):
    def emit(self, record):
        message = record.getMessage()
        if message.startswith("step "):
            times.append((int(message.split()[1]), time.perf_counter()))
logging.getLogger("trainyard").addHandler(Intervals())
logging.getLogger("trainyard").setLevel(logging.INFO)
run_dir, config = Path(sys.argv[1]), PipelineConfig.model_validate_json(sys.argv[2])
train(config, run_dir, read_tf_config(), load_schema(run_dir), checkpoint_dir=Path(sys.argv[3]))
(first, t0), (last, t1) = times[0], times[-1]
print(json.dumps({"examples_per_second": (last - first) * config.training.batch_size / (t1 - t0)}))
'''

KERAS_CHIEF = r'''
import json, sys, time
from pathlib import Path
import tensorflow as tf
import tf_keras
from trainyard_trainer.data import load_schema, make_dataset
from trainyard_trainer.features import FeatureTransform

run_dir, batch, steps, per_execution = Path(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
schema = load_schema(run_dir)
strategy = tf.distribute.ParameterServerStrategy(tf.distribute.cluster_resolver.TFConfigClusterResolver())
with strategy.scope():
    transform = FeatureTransform(schema)
    inputs = tf_keras.Input(shape=(len(schema.numeric),), name="numeric")
    x = tf_keras.layers.Normalization(mean=[f.mean for f in schema.numeric],
                                      variance=[max(f.std, 1e-3) ** 2 for f in schema.numeric])(inputs)
    for _ in range(3):
        x = tf_keras.layers.Dense(512, activation="relu")(x)
    model = tf_keras.Model(inputs, tf_keras.layers.Dense(schema.num_classes)(x))
    model.compile(tf_keras.optimizers.Adam(0.01),
                  tf_keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  steps_per_execution=per_execution)

def dataset_fn(context):
    return make_dataset(run_dir / "prepared", "train", batch, repeat=True, shuffle_seed=None, schema=schema,
                        transform=transform)

times = []
class Epochs(tf_keras.callbacks.Callback):
    def on_epoch_end(self, epoch, logs=None):
        times.append(time.perf_counter())
model.fit(tf_keras.utils.experimental.DatasetCreator(dataset_fn), epochs=steps // 100, steps_per_epoch=100,
          callbacks=[Epochs()], verbose=0)
print(json.dumps({"examples_per_second": (len(times) - 1) * 100 * batch / (times[-1] - times[0])}))
'''


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def on_cluster(chief: list[str]) -> float:
    """Run `chief` (a python command line) as the chief of a fresh 1 PS + 1 worker cluster on 127.0.0.1; its
    examples/s."""
    cluster = {"chief": [f"127.0.0.1:{free_port()}"], "ps": [f"127.0.0.1:{free_port()}"],
               "worker": [f"127.0.0.1:{free_port()}"]}

    def env(role: str) -> dict[str, str]:
        return {**os.environ, "TF_CONFIG": json.dumps({"cluster": cluster, "task": {"type": role, "index": 0}})}

    servers = [subprocess.Popen([sys.executable, "-c", SERVER], env=env(role), stderr=subprocess.DEVNULL)
               for role in ("ps", "worker")]
    try:
        out = subprocess.run(chief, env=env("chief"), capture_output=True, text=True, timeout=900)
        if out.returncode != 0:
            raise SystemExit(f"chief failed: {out.stderr[-3000:]}")
        return json.loads(out.stdout.strip().splitlines()[-1])["examples_per_second"]
    finally:
        for server in servers:
            server.kill()
            server.wait()


def loop_vs_keras(volume: Path, base, steps: int, rounds: int) -> dict[str, list[float]]:  # noqa: ANN001
    """Examples/s of Trainyard's loop and of tf-keras fit (steps_per_execution 1 and 20), alternating rounds."""
    heavy = {"module": "trainyard_trainer.models.mlp", "params": {"hidden_units": [512, 512, 512]}}
    config = with_training(base, steps=steps, checkpoint_every_steps=100, workers={"replicas": 1},
                           model=heavy, batch_size=256, learning_rate=0.01)
    run_dir = prepared_run(volume, config, "versus")
    one_step = with_training(config, steps_per_execution=1)  # the loop before steps_per_execution, for scale
    rates: dict[str, list[float]] = {"trainyard": [], "trainyard_spe1": [], "keras_spe1": [], "keras_spe20": []}
    for i in range(rounds):
        for name, cfg in (("trainyard", config), ("trainyard_spe1", one_step)):
            rates[name].append(on_cluster([sys.executable, "-c", TRAINYARD_CHIEF, str(run_dir),
                                           cfg.model_dump_json(), str(volume / f"ckpt-{name}-{i}")]))
        for per_execution in (1, 20):
            rates[f"keras_spe{per_execution}"].append(on_cluster(
                [sys.executable, "-c", KERAS_CHIEF, str(run_dir), "256", str(steps), str(per_execution)]))
    return rates


class Recorder(logging.Handler):
    """Keeps (time, message) of every log line; fires `action` once when `trigger` appears."""

    def __init__(self, trigger: str | None = None, action=None):  # noqa: ANN001
        super().__init__()
        self.lines: list[tuple[float, str]] = []
        self.trigger, self.action, self.fired = trigger, action, False

    def emit(self, record: logging.LogRecord) -> None:
        message = record.getMessage()
        self.lines.append((record.created, message))
        if self.trigger and not self.fired and self.trigger in message:
            self.fired = True
            threading.Thread(target=self.action, daemon=True).start()

    def first(self, text: str) -> float | None:
        return next((t for t, m in self.lines if text in m), None)


def setup_volume(root: Path):  # noqa: ANN201
    from trainyard.config.loader import load_pipeline_file
    from trainyard_prep.example_data import write_digits

    volume = root / "volume"
    write_digits(volume / layout.DATASETS / "digits", days=5, end=dt.date(2026, 11, 30))
    return volume, load_pipeline_file(REPO / "pipelines_config" / "digits.yaml")


def with_training(config, **training):  # noqa: ANN001, ANN201
    from trainyard_contract.schema import PipelineConfig

    data = config.model_dump()
    data["training"].update(training)
    return PipelineConfig.model_validate(data)


def prepared_run(volume: Path, config, run_id: str) -> Path:  # noqa: ANN001
    from trainyard_contract.layout import RunLayout
    from trainyard_prep.inputs import pin_inputs
    from trainyard_prep.prepare import prepare

    run_dir = RunLayout.for_run(volume, config.name, run_id).run_dir
    prepare(run_dir, config, pin_inputs(volume, run_dir, config.data, None))
    return run_dir


def job(volume: Path, config, run_id: str, kill_worker_at: str | None = None) -> tuple[dict, float, Recorder]:  # noqa: ANN001
    from trainyard.dag.registry import stage_named
    from trainyard.dag.stages import RunContext
    from trainyard.launch.local import LocalLauncher
    from trainyard.launch.training_job import launch_training

    prepared_run(volume, config, run_id)
    launcher = LocalLauncher(config, volume)

    def kill() -> None:
        with launcher._lock:
            proc = next(p for p in launcher._running if p.role == "worker")
        proc.process.send_signal(signal.SIGKILL)

    recorder = Recorder(kill_worker_at, kill if kill_worker_at else None)
    log = logging.getLogger(f"bench.{run_id}")
    log.setLevel(logging.INFO)
    log.propagate = False
    log.addHandler(recorder)
    started = time.time()
    run = RunContext(pipeline=config.name, run_id=run_id)
    result = launch_training(config, run, stage_named("train"), launcher, log)
    return result, time.time() - started, recorder


def replica_ready_seconds(run_dir: Path, recorder: Recorder) -> dict[str, float]:
    """Per replica: from its launch (our log) to its 'serving on' line (its own log, local time, ms)."""
    out = {}
    for path in sorted((run_dir / layout.CLUSTER_LOGS).glob("*.log")):
        launched = recorder.first(f"started {path.stem} ")
        match = re.search(r"^(\S+ \S+) INFO .* serving on", path.read_text(), re.M)
        if launched and match:
            ready = dt.datetime.strptime(match.group(1), "%Y-%m-%d %H:%M:%S,%f").timestamp()
            out[path.stem.rsplit("-", 2)[-2] + "-" + path.stem.rsplit("-", 1)[-1]] = round(ready - launched, 1)
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--steps", type=int, default=1500)
    parser.add_argument("--only", choices=["input", "jobs", "keras"],
                        help="run only the input-bound check, only the jobs, or only the loop vs tf-keras")
    parser.add_argument("--versus-steps", type=int, default=1000, help="steps per run of the loop vs tf-keras")
    parser.add_argument("--rounds", type=int, default=2, help="alternating rounds of the loop vs tf-keras")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        volume, base = setup_volume(Path(tmp))

        print("train bench (local backend, 2 cores, CPU only; no GPU machine was lent)")
        if args.only in (None, "input"):  # 1. input-bound check
            run_dir = prepared_run(volume, base, "input")
            out = subprocess.run([sys.executable, "-c", INPUT_BOUND, str(run_dir), "800"],
                                 capture_output=True, text=True, check=True)
            rates = json.loads(out.stdout.strip().splitlines()[-1])
            memory, tfrecord = statistics.median(rates["memory"]), statistics.median(rates["tfrecord"])
            print(f"  1. input-bound: TFRecord {tfrecord:.0f} steps/s vs memory {memory:.0f} steps/s "
                  f"(medians of 3 alternating rounds of 800 steps) -> {tfrecord / memory:.2f}x (target >= 0.9x)")
        if args.only == "input":
            return 0
        if args.only in (None, "keras"):  # 5. the loop vs tf-keras fit, on one cluster shape
            rates = loop_vs_keras(volume, base, args.versus_steps, args.rounds)
            best = {name: statistics.median(values) for name, values in rates.items()}
            faster = max(best["keras_spe1"], best["keras_spe20"])
            print(f"  5. loop vs tf-keras (1 PS + 1 worker, MLP 512x3, batch 256, medians of {args.rounds} rounds): "
                  f"Trainyard {best['trainyard']:.0f} examples/s (steps_per_execution "
                  f"{base.training.steps_per_execution}; {best['trainyard_spe1']:.0f} with 1); tf-keras fit "
                  f"{best['keras_spe1']:.0f} "
                  f"(steps_per_execution 1), {best['keras_spe20']:.0f} (20) -> {best['trainyard'] / faster:.2f}x "
                  f"the faster (target >= 1.0x); all rounds {json.dumps(rates)}")
        if args.only == "keras":
            return 0

        # 2. startup and 3. worker loss cost
        config = with_training(base, steps=args.steps, checkpoint_every_steps=100, workers={"replicas": 2})
        result, wall, recorder = job(volume, config, "steady")
        first = recorder.first("first step done")
        task_start = recorder.lines[0][0]
        ready = replica_ready_seconds(volume / layout.RUNS / "digits" / "steady", recorder)
        print(f"  2. startup: {first - task_start:.1f} s from task start to the first step "
              f"(model check {recorder.first('training job ') - task_start:.1f} s of it); replica ready: {ready}")
        killed, killed_wall, _ = job(volume, config, "killed", kill_worker_at="step 300 ")
        restart = killed["worker_restarts"]
        print(f"  3. worker loss: undisturbed {wall:.1f} s, worker SIGKILLed at step 300: {killed_wall:.1f} s "
              f"(+{killed_wall - wall:.1f} s, {restart} restart); budget: one checkpoint interval "
              f"({100 / max(result['steps'] / result['seconds'], 1e-9):.1f} s here) + one restart "
              f"(~{max(ready.values() or [0]):.1f} s)")

        # 4. scaling on a compute-bound model
        heavy = {"module": "trainyard_trainer.models.mlp", "params": {"hidden_units": [512, 512, 512]}}
        rates = {}
        for workers in (1, 2):
            cfg = with_training(base, steps=400, checkpoint_every_steps=200, workers={"replicas": workers},
                                model=heavy, batch_size=256)
            res, _, _ = job(volume, cfg, f"scale{workers}")
            rates[workers] = res["examples_per_second"]
        print(f"  4. scaling (MLP 512x3, batch 256): 1 worker {rates[1]:.0f} examples/s, 2 workers {rates[2]:.0f} "
              f"examples/s -> {rates[2] / rates[1]:.2f}x (2 cores shared by chief, PS and workers)")
    return 0


if __name__ == "__main__":
    socket.setdefaulttimeout(None)
    sys.exit(main())
