"""deploy: publish the run's SavedModel as version N+1 of `models/<model_name>/`, verify it through the serving API,
and roll back on any failure. The same code deploys to the local server and to TF Serving on Kubernetes: it only
needs the shared volume and the gRPC endpoint.

1. publish: under an exclusive lock per model, assemble `.tmp-<N+1>-*` beside the versions with hardlinks (no
   bytes copied), write `trainyard.json` (lineage and metrics), rename it to `<N+1>`. Versions are monotonic even
   when runs race; a reader (TF Serving polls the folder) never sees a half-written version.
2. wait until `ModelService.GetModelStatus` reports the version AVAILABLE (a load error fails at once).
3. smoke test: `PredictionService.Predict` on examples of the eval split, compared with the evaluator's outputs.
4. on failure: remove the version (TF Serving falls back to the previous one) and say why.

Before publishing, and while waiting, the deploy checks that the server it talks to serves this volume: one that
serves versions the volume does not hold is another volume's server, and nothing is published to it.
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

from trainyard_contract import layout
from trainyard_contract.atomic import fsync_dir, fsync_tree, write_json
from trainyard_contract.layout import published_versions
from trainyard_contract.runtime import StageError, log
from trainyard_contract.schema import PipelineConfig

AVAILABLE_TIMEOUT_SECONDS = 120.0
SAME_VOLUME_CHECK_SECONDS = 5.0  # TF Serving sees a new version within a poll (1 s here); then compare volumes
NEVER_SEEN_SECONDS = 30.0  # a shared volume's listing can lag (NFS attribute caching): give it this long
SMOKE_TOLERANCE = 1e-4  # absolute, per probability


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


STAGING_PREFIXES = (".tmp-", ".removed-")


def remove_stale_staging(model_dir: Path) -> list[str]:
    """Delete what dead publishers left (`.tmp-*` being assembled, `.removed-*` being deleted). Called with the
    model lock held: a live publisher only has such a folder while it holds the lock, so these are all dead."""
    stale = sorted(p.name for p in model_dir.iterdir() if p.is_dir() and p.name.startswith(STAGING_PREFIXES))
    for name in stale:
        shutil.rmtree(model_dir / name, ignore_errors=True)
    if stale:
        log.warning("removed %d folder(s) a killed publish left in %s: %s", len(stale), model_dir, ", ".join(stale))
    return stale


def publish(model_dir: Path, saved_model: Path, metadata: dict[str, Any]) -> int:
    """Publish `saved_model` as the next version; returns its number.

    Durable across a crash or power loss: every file and folder of the staged version is fsynced before the
    rename, and the model folder after it, so a version that is visible is also complete on disk."""
    if not (saved_model / layout.SAVED_MODEL_PB).is_file():
        raise StageError(f"{saved_model} holds no {layout.SAVED_MODEL_PB}: did the train task export the model?")
    with model_lock(model_dir):
        remove_stale_staging(model_dir)
        version = (published_versions(model_dir) or [0])[-1] + 1
        staging = model_dir / f".tmp-{version}-{uuid.uuid4().hex[:8]}"
        try:
            how = link_tree(saved_model, staging)
            write_json(staging / layout.VERSION_METADATA, {**metadata, "version": version, "published_by": how,
                                                           "published_at": dt.datetime.now(dt.UTC).isoformat()})
            fsync_tree(staging)
            os.rename(staging, model_dir / str(version))
            fsync_dir(model_dir)
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


def served_versions(stub: Any, name: str) -> dict[int, str] | None:
    """Version -> state of every version of `name` the server knows; {} when it knows none; None on no answer."""
    request = get_model_status_pb2.GetModelStatusRequest()
    request.model_spec.name = name
    try:
        response = stub.GetModelStatus(request, timeout=5)
    except grpc.RpcError as exc:
        return {} if exc.code() == grpc.StatusCode.NOT_FOUND else None
    return {s.version: get_model_status_pb2.ModelVersionStatus.State.Name(s.state)
            for s in response.model_version_status}


def check_same_volume(stub: Any, name: str, version: int | None, model_dir: Path, endpoint: str,
                      waited: float) -> None:
    """Fail with a clear message when the server at `endpoint` is evidently not serving `model_dir`: it serves
    versions this volume does not hold (checked before publishing, too: `version` None), or it still has not seen
    the new `version` after `NEVER_SEEN_SECONDS`."""
    known = served_versions(stub, name)
    if known is None:
        return
    on_disk = published_versions(model_dir)
    foreign = sorted(v for v, state in known.items() if v not in on_disk and state != "END")
    hint = ("point deploy at the server of this volume (deploy.grpc_port; TRAINYARD_SERVING_GRPC on the local "
            "backend)")
    if foreign:
        raise DeployFailed(f"the server at {endpoint} serves version(s) {foreign} of {name}, which {model_dir} does "
                           f"not hold (it has {on_disk}): it is serving another volume; {hint}")
    if version is not None and version not in known and waited >= NEVER_SEEN_SECONDS:
        raise DeployFailed(f"the server at {endpoint} has not seen version {version} of {name} after "
                           f"{waited:.0f} s although {model_dir / str(version)} exists (it knows "
                           f"{sorted(known) or 'no version'}): is it serving this volume? {hint}")


def wait_available(channel: grpc.Channel, name: str, version: int, timeout: float, model_dir: Path,
                   endpoint: str) -> float:
    """Seconds until `version` is AVAILABLE; DeployFailed when it fails to load, when the server is not the one
    serving `model_dir`, or after `timeout`."""
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
            if exc.code() == grpc.StatusCode.UNAVAILABLE and time.monotonic() - started > NEVER_SEEN_SECONDS:
                raise DeployFailed(f"no serving answers at {endpoint} ({last}): is the server running? start it "
                                   "with `trainyard serve --background` (local) or check the Deployment") from None
        waited = time.monotonic() - started
        if waited >= SAME_VOLUME_CHECK_SECONDS:
            check_same_volume(stub, name, version, model_dir, endpoint, waited)
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
    if "predictions" in smoke:  # regression
        if "predictions" not in response.outputs:
            raise DeployFailed(f"smoke test: the served version {version} has no 'predictions' output")
        predictions = tf.make_ndarray(response.outputs["predictions"])
        difference = first_prediction_difference(predictions, smoke)
        answered = len(predictions)
    else:
        class_ids = tf.make_ndarray(response.outputs["class_ids"]).tolist()
        probabilities = tf.make_ndarray(response.outputs["probabilities"])
        difference = first_difference(class_ids, probabilities, smoke)
        answered = len(class_ids)
    if difference is not None:
        raise DeployFailed(f"smoke test: the served version {version} answers differently from the evaluator: "
                           f"{difference}")
    return answered


def first_prediction_difference(predictions: np.ndarray, smoke: dict[str, Any]) -> str | None:
    """Where served regression predictions first leave the evaluator's by more than the tolerance (relative to
    the value's size, absolute near zero)."""
    expected = np.asarray(smoke["predictions"], dtype=np.float64)
    if len(predictions) != len(expected):
        return f"{len(predictions)} predictions for {len(expected)} examples"
    allowed = SMOKE_TOLERANCE * np.maximum(1.0, np.abs(expected))
    far = np.flatnonzero(~(np.abs(predictions.astype(np.float64) - expected) <= allowed))  # NaN counts as far
    if far.size:
        row = int(far[0])
        return (f"example {row}: prediction {float(predictions[row]):.6g}, the evaluator's {expected[row]:.6g} "
                f"(tolerance {SMOKE_TOLERANCE} x max(1, |value|))")
    return None


def first_difference(class_ids: list[int], probabilities: np.ndarray, smoke: dict[str, Any]) -> str | None:
    """Where the served predictions first differ from the evaluator's (row, both values, the tolerance)."""
    expected_ids, expected = smoke["class_ids"], np.asarray(smoke["probabilities"])
    if len(class_ids) != len(expected_ids):
        return f"{len(class_ids)} predictions for {len(expected_ids)} examples"
    for row, (got, want) in enumerate(zip(class_ids, expected_ids, strict=True)):
        if got != want:
            return f"example {row}: class id {got}, the evaluator's {want}"
    far = np.abs(probabilities - expected) > SMOKE_TOLERANCE
    if far.any():
        row, column = (int(i) for i in np.argwhere(far)[0])
        return (f"example {row}: probability of class {column} is {probabilities[row, column]:.6f}, the "
                f"evaluator's {expected[row, column]:.6f} (tolerance {SMOKE_TOLERANCE})")
    return None


def lineage(config: PipelineConfig, run_dir: Path, run_id: str) -> dict[str, Any]:
    def read(path: Path) -> dict[str, Any]:
        return json.loads(path.read_text()) if path.is_file() else {}

    prepared = read(run_dir / layout.PREPARED_MANIFEST)
    metrics = read(run_dir / layout.METRICS)
    inputs = read(run_dir / layout.INPUTS_MANIFEST)
    label = read(run_dir / layout.MODEL_SCHEMA).get("label") or {}
    return {
        "pipeline": config.name, "run_id": run_id, "run_dir": run_dir.name,
        "config_sha256": prepared.get("config_sha256"), "data_sha256": prepared.get("inputs", {}).get("sha256"),
        "data_window_end": inputs.get("window_end"), "trigger": inputs.get("trigger"),
        "training": read(run_dir / layout.TRAINING_RECORD),
        "metrics": metrics.get("challenger", {}), "eval_rows": metrics.get("eval_rows"),
        "classes": [str(c) for c in label.get("classes") or []] or None,  # the probabilities' column order
        "tensorflow": tf.__version__,
        "images": {"prep": config.prep.image, "trainer": config.training.image},
    }


def refusal(run_dir: Path) -> str | None:
    """None when this run's decision blesses its model for deploy (thresholds met, or forced); else why not.

    The deploy stage's blessing check, as TFX's Pusher checks the Evaluator's: clearing and re-running `deploy`
    after decide said skip publishes nothing."""
    path = run_dir / layout.DECISION
    if not path.is_file():
        raise StageError(f"{path} is missing: decide must run before deploy (deploy publishes only a model that "
                         "this run's decision blessed)")
    try:
        decision = json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise StageError(f"{path} is not valid JSON ({exc}): re-run decide") from None
    if isinstance(decision, dict) and decision.get("deploy") is True:
        return None
    reasons = "; ".join(map(str, decision.get("reasons", []))) if isinstance(decision, dict) else ""
    return (f"this run's decision ({layout.DECISION}) says SKIP ({reasons or 'no reason recorded'}), so nothing "
            "was published; trigger a new run with force_deploy to publish regardless")


def deploy(config: PipelineConfig, volume: Path, run_dir: Path, run_id: str, endpoint: str) -> dict[str, Any]:
    """Publish the run's model as the next version if decide blessed it, wait until served, smoke-test it, and
    roll back on failure. Without the blessing: nothing is published, and the result says why (`skipped`)."""
    name = config.model_name
    why_not = refusal(run_dir)
    if why_not is not None:
        log.warning("not deploying: %s", why_not)
        return {"deployed": False, "model": name, "skipped": why_not}
    model_dir = layout.models_dir(volume, name)
    smoke_path = run_dir / layout.SMOKE_SET
    if not smoke_path.is_file():
        raise StageError(f"{smoke_path} is missing: evaluate must run before deploy")
    smoke = json.loads(smoke_path.read_text())
    channel = grpc.insecure_channel(endpoint)
    try:
        check_same_volume(model_service_pb2_grpc.ModelServiceStub(channel), name, None, model_dir, endpoint, 0.0)
    except DeployFailed as exc:
        channel.close()
        write_json(run_dir / layout.DEPLOY_RESULT, {"deployed": False, "published": False, "reason": str(exc)})
        raise
    version = publish(model_dir, run_dir / layout.SAVED_MODEL, lineage(config, run_dir, run_id))
    try:
        waited = wait_available(channel, name, version, AVAILABLE_TIMEOUT_SECONDS, model_dir, endpoint)
        log.info("%s version %d is AVAILABLE after %.1f s", name, version, waited)
        checked = smoke_test(channel, name, version, smoke)
        log.info("smoke test passed on %d examples", checked)
    except DeployFailed as exc:
        unpublish(model_dir, version)
        write_json(run_dir / layout.DEPLOY_RESULT, {"deployed": False, "version": version, "rolled_back": True,
                                                    "reason": str(exc)})
        raise
    finally:
        channel.close()
    result = {"deployed": True, "model": name, "version": version, "endpoint": endpoint,
              "available_after_seconds": round(waited, 2), "smoke_examples": checked}
    write_json(run_dir / layout.DEPLOY_RESULT, result)
    return result
