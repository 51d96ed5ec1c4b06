"""deploy: publish the run's SavedModel as version N+1 of `models/<model_name>/`, verify it through the serving API,
and roll back on any failure. The same code deploys to the local server and to TF Serving on Kubernetes: it only
needs the shared volume and the gRPC endpoint.

1. publish: under an exclusive lock per model, assemble `.tmp-<N+1>-*` beside the versions with hardlinks (no
   bytes copied), write `trainyard.json` (lineage and metrics), rename it to `<N+1>`. Versions are monotonic even
   when runs race; a reader (TF Serving polls the folder) never sees a half-written version.
2. wait until `ModelService.GetModelStatus` reports the version AVAILABLE (a load error fails at once).
3. smoke test: `PredictionService.Predict` on examples of the eval split, compared with the evaluator's outputs.
4. on failure: remove the version (TF Serving falls back to the previous one) and say why.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import fcntl
import json
import os
import shutil
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import tensorflow as tf
from tensorflow_serving.apis import (
    get_model_status_pb2,
    model_service_pb2_grpc,
    predict_pb2,
    prediction_service_pb2_grpc,
)

from trainyard.atomic import write_json
from trainyard.layout import published_versions
from trainyard.schema import PipelineConfig
from trainyard.stage_runtime import StageError, log

METADATA = "trainyard.json"
AVAILABLE_TIMEOUT_SECONDS = 120.0


class DeployFailed(Exception):
    """The new version did not become AVAILABLE or failed its smoke test; it was removed again."""


@contextlib.contextmanager
def model_lock(model_dir: Path) -> Iterator[None]:
    """An exclusive lock per model name on the shared volume, held while a version number is taken."""
    model_dir.mkdir(parents=True, exist_ok=True)
    with (model_dir / ".publish.lock").open("a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def link_tree(source: Path, target: Path) -> str:
    """Recreate `source` under `target` with hardlinks (copies only across filesystems)."""
    how = "hardlink"
    for root, _, files in os.walk(source):
        rel = Path(root).relative_to(source)
        (target / rel).mkdir(parents=True, exist_ok=True)
        for name in files:
            try:
                os.link(Path(root) / name, target / rel / name)
            except OSError:
                shutil.copy2(Path(root) / name, target / rel / name)
                how = "copy"
    return how


def publish(model_dir: Path, saved_model: Path, metadata: dict[str, Any]) -> int:
    """Publish `saved_model` as the next version; returns its number."""
    if not (saved_model / "saved_model.pb").is_file():
        raise StageError(f"{saved_model} holds no saved_model.pb: did the train task export the model?")
    with model_lock(model_dir):
        version = (published_versions(model_dir) or [0])[-1] + 1
        staging = model_dir / f".tmp-{version}-{uuid.uuid4().hex[:8]}"
        try:
            how = link_tree(saved_model, staging)
            write_json(staging / METADATA, {**metadata, "version": version, "published_by": how,
                                            "published_at": dt.datetime.now(dt.UTC).isoformat()})
            os.rename(staging, model_dir / str(version))
        except BaseException:
            shutil.rmtree(staging, ignore_errors=True)
            raise
    log.info("published %s version %d", model_dir.name, version)
    return version


def unpublish(model_dir: Path, version: int) -> None:
    """Remove a version in one rename (serving falls back to the previous one), then delete its files."""
    path = model_dir / str(version)
    if path.exists():
        trash = model_dir / f".removed-{version}-{uuid.uuid4().hex[:8]}"
        os.rename(path, trash)
        shutil.rmtree(trash, ignore_errors=True)


def wait_available(channel: grpc.Channel, name: str, version: int, timeout: float) -> float:
    stub = model_service_pb2_grpc.ModelServiceStub(channel)
    request = get_model_status_pb2.GetModelStatusRequest()
    request.model_spec.name = name
    request.model_spec.version.value = version
    started = time.monotonic()
    last = "no answer"
    while time.monotonic() - started < timeout:
        try:
            response = stub.GetModelStatus(request, timeout=5)
            status = response.model_version_status[0]
            state = get_model_status_pb2.ModelVersionStatus.State.Name(status.state)
            if state == "AVAILABLE":
                return time.monotonic() - started
            if state == "END" and status.status.error_message:
                raise DeployFailed(f"serving could not load version {version}: {status.status.error_message}")
            last = state
        except grpc.RpcError as exc:
            last = f"{exc.code().name}: {exc.details()}"
        time.sleep(0.5)
    raise DeployFailed(f"version {version} was not AVAILABLE after {timeout:.0f} s (last status: {last})")


def smoke_test(channel: grpc.Channel, name: str, version: int, smoke: dict[str, Any]) -> int:
    """Predict the evaluator's sample through the API; outputs must match what the evaluator computed."""
    stub = prediction_service_pb2_grpc.PredictionServiceStub(channel)
    request = predict_pb2.PredictRequest()
    request.model_spec.name = name
    request.model_spec.version.value = version
    request.model_spec.signature_name = "serving_default"
    dtypes = {"float": np.float32, "int": np.int64, "string": object}
    for feature, values in smoke["inputs"].items():
        array = np.asarray(values, dtype=dtypes[smoke["dtypes"][feature]])
        request.inputs[feature].CopyFrom(tf.make_tensor_proto(array))
    try:
        response = stub.Predict(request, timeout=30)
    except grpc.RpcError as exc:
        raise DeployFailed(f"smoke test Predict failed: {exc.code().name}: {exc.details()}") from None
    class_ids = tf.make_ndarray(response.outputs["class_ids"]).tolist()
    probabilities = tf.make_ndarray(response.outputs["probabilities"])
    if class_ids != smoke["class_ids"] or not np.allclose(probabilities, smoke["probabilities"], atol=1e-4):
        raise DeployFailed(f"smoke test: served predictions {class_ids[:8]} differ from the evaluator's "
                           f"{smoke['class_ids'][:8]}")
    return len(class_ids)


def lineage(config: PipelineConfig, run_dir: Path, run_id: str) -> dict[str, Any]:
    def read(path: Path) -> dict[str, Any]:
        return json.loads(path.read_text()) if path.is_file() else {}

    prepared = read(run_dir / "prepared" / "manifest.json")
    metrics = read(run_dir / "eval" / "metrics.json")
    inputs = read(run_dir / "inputs" / "manifest.json")
    return {
        "pipeline": config.name, "run_id": run_id, "run_dir": run_dir.name,
        "config_sha256": prepared.get("config_sha256"), "data_sha256": prepared.get("inputs", {}).get("sha256"),
        "data_window_end": inputs.get("window_end"), "trigger": inputs.get("trigger"),
        "training": read(run_dir / "model" / "training.json"),
        "metrics": metrics.get("challenger", {}), "tensorflow": tf.__version__,
        "images": {"prep": config.prep.image, "trainer": config.training.image},
    }


def deploy(config: PipelineConfig, volume: Path, run_dir: Path, run_id: str, endpoint: str) -> dict[str, Any]:
    name = config.model_name
    model_dir = volume / "models" / name
    smoke_path = run_dir / "eval" / "smoke.json"
    if not smoke_path.is_file():
        raise StageError(f"{smoke_path} is missing: evaluate must run before deploy")
    smoke = json.loads(smoke_path.read_text())
    version = publish(model_dir, run_dir / "model" / "saved_model", lineage(config, run_dir, run_id))
    channel = grpc.insecure_channel(endpoint)
    try:
        waited = wait_available(channel, name, version, AVAILABLE_TIMEOUT_SECONDS)
        log.info("%s version %d is AVAILABLE after %.1f s", name, version, waited)
        checked = smoke_test(channel, name, version, smoke)
        log.info("smoke test passed on %d examples", checked)
    except DeployFailed as exc:
        unpublish(model_dir, version)
        write_json(run_dir / "deploy" / "result.json", {"deployed": False, "version": version, "rolled_back": True,
                                                        "reason": str(exc)})
        raise
    finally:
        channel.close()
    result = {"deployed": True, "model": name, "version": version, "endpoint": endpoint,
              "available_after_seconds": round(waited, 2), "smoke_examples": checked}
    write_json(run_dir / "deploy" / "result.json", result)
    return result
