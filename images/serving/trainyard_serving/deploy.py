"""deploy: publish the run's SavedModel as version N+1 of `models/<model_name>/`, verify it through the serving API,
and roll back on any failure. The same code deploys to the local server and to TF Serving on Kubernetes: it only
needs the shared volume and the gRPC endpoint.

1. publish (publishing.py): under an exclusive lock per model, copy the export read-only into `.tmp-<N>-*`
   beside the versions, write `trainyard.json` (lineage and metrics), rename it to `<N>`. N is one more than any
   number ever published (never reused); a reader (TF Serving polls the folder) never sees a half-written version.
2. wait until `ModelService.GetModelStatus` reports the version AVAILABLE (a load error fails at once).
3. smoke test: `PredictionService.Predict` on examples of the eval split, compared with the evaluator's outputs.
4. on failure, or when the deploy is interrupted (Ctrl-C, SIGTERM) before the version is verified: remove the
   version (TF Serving falls back to the previous one) and say why.

`deploy/result.json` is the deploy's journal, rewritten at each step (`state`: publishing, published, verified,
rolled_back, interrupted), so a deploy killed at any point leaves a true account. A version whose deploy was
SIGKILLed before verifying it keeps an `.unverified-N` marker: a retry of the same run verifies it instead of
publishing again; another run's deploy (or the local server's start) removes it.

Before publishing, and while waiting, the deploy checks that the server it talks to serves this volume: one that
serves versions the volume does not hold is another volume's server, and nothing is published to it.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import tensorflow as tf
from pydantic import ValidationError
from tensorflow_serving.apis import (
    get_model_status_pb2,
    model_service_pb2_grpc,
    predict_pb2,
    prediction_service_pb2_grpc,
)

from trainyard_contract import artifacts, layout
from trainyard_contract.artifacts import (
    Decision,
    DeployJournal,
    EvalMetrics,
    InputsManifest,
    M,
    PreparedManifest,
    SmokeSet,
    TrainingRecord,
    VersionRecord,
)
from trainyard_contract.layout import published_versions
from trainyard_contract.runtime import StageFailure, log
from trainyard_contract.schema import PipelineConfig
from trainyard_serving.publishing import UNVERIFIED_PREFIX, Publication, publish_unverified, settle_unverified

AVAILABLE_TIMEOUT_SECONDS = 120.0
SAME_VOLUME_CHECK_SECONDS = 5.0  # TF Serving sees a new version within a poll (1 s here); then compare volumes
NEVER_SEEN_SECONDS = 30.0  # a shared volume's listing can lag (NFS attribute caching): give it this long
SMOKE_TOLERANCE = 1e-4  # absolute, per probability


class DeployFailed(StageFailure):
    """The new version did not become AVAILABLE or failed its smoke test; it was removed again. Retryable: the
    server may load it on the next attempt."""

    outcome = "failed and was rolled back"


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


def smoke_test(channel: grpc.Channel, name: str, version: int, smoke: SmokeSet) -> int:
    """Predict the evaluator's sample through the API; outputs must match what the evaluator computed."""
    stub = prediction_service_pb2_grpc.PredictionServiceStub(channel)
    request = predict_pb2.PredictRequest()
    request.model_spec.name = name
    request.model_spec.version.value = version
    request.model_spec.signature_name = "serving_default"
    dtypes = {"float": np.float32, "int": np.int64, "string": object}
    for feature, values in smoke.inputs.items():
        array = np.asarray(values, dtype=dtypes[smoke.dtypes[feature]])
        request.inputs[feature].CopyFrom(tf.make_tensor_proto(array))
    try:
        response = stub.Predict(request, timeout=30)
    except grpc.RpcError as exc:
        raise DeployFailed(f"smoke test Predict failed: {exc.code().name}: {exc.details()}") from None
    if smoke.predictions is not None:  # regression
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


def first_prediction_difference(predictions: np.ndarray, smoke: SmokeSet) -> str | None:
    """Where served regression predictions first leave the evaluator's by more than the tolerance (relative to
    the value's size, absolute near zero)."""
    expected = np.asarray(smoke.predictions, dtype=np.float64)
    if len(predictions) != len(expected):
        return f"{len(predictions)} predictions for {len(expected)} examples"
    allowed = SMOKE_TOLERANCE * np.maximum(1.0, np.abs(expected))
    far = np.flatnonzero(~(np.abs(predictions.astype(np.float64) - expected) <= allowed))  # NaN counts as far
    if far.size:
        row = int(far[0])
        return (f"example {row}: prediction {float(predictions[row]):.6g}, the evaluator's {expected[row]:.6g} "
                f"(tolerance {SMOKE_TOLERANCE} x max(1, |value|))")
    return None


def first_difference(class_ids: list[int], probabilities: np.ndarray, smoke: SmokeSet) -> str | None:
    """Where the served predictions first differ from the evaluator's (row, both values, the tolerance)."""
    expected_ids, expected = smoke.class_ids or [], np.asarray(smoke.probabilities)
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


def lineage(config: PipelineConfig, run_dir: Path, run_id: str) -> VersionRecord:
    """The published version's `trainyard.json`, from the run files (each may be missing for a model exported by
    hand; one that is there and not what its stage writes is bad input)."""
    def present(artifact: layout.Artifact, model: type[M], writer: str) -> M | None:
        return artifacts.read_if_present(run_dir, artifact, model, writer, "deploy")

    prepared = present(layout.PREPARED_MANIFEST, PreparedManifest, "prepare_data")
    metrics = present(layout.METRICS, EvalMetrics, "evaluate")
    inputs = present(layout.INPUTS_MANIFEST, InputsManifest, "validate_data")
    training = present(layout.TRAINING_RECORD, TrainingRecord, "train")
    schema_path = run_dir / layout.MODEL_SCHEMA
    label = (json.loads(schema_path.read_text()).get("label") or {}) if schema_path.is_file() else {}
    return VersionRecord(
        pipeline=config.name, run_id=run_id, run_dir=run_dir.name,
        config_sha256=prepared.config_sha256 if prepared else None,
        data_sha256=prepared.inputs.sha256 if prepared else None,
        data_window_end=inputs.window_end if inputs else None, trigger=inputs.trigger if inputs else None,
        training=training.model_dump() if training is not None else {},
        metrics=metrics.challenger if metrics else {}, eval_rows=metrics.eval_rows if metrics else None,
        classes=[str(c) for c in label.get("classes") or []] or None,  # the probabilities' column order
        tensorflow=tf.__version__,
        images={"prep": config.prep.runtime.image, "trainer": config.training.runtime.image},
    )


def refusal(run_dir: Path) -> str | None:
    """None when this run's decision blesses its model for deploy (thresholds met, or forced); else why not.

    The deploy stage's blessing check, as TFX's Pusher checks the Evaluator's: clearing and re-running `deploy`
    after decide said skip publishes nothing."""
    decision = artifacts.read(run_dir, layout.DECISION, Decision, "decide", "deploy (deploy publishes only a "
                              "model that this run's decision blessed)")
    if decision.deploy:
        return None
    reasons = "; ".join(decision.reasons)
    return (f"this run's decision ({layout.DECISION}) says SKIP ({reasons or 'no reason recorded'}), so nothing "
            "was published; trigger a new run with force_deploy to publish regardless")


def already_deployed(journal: DeployJournal | None, model_dir: Path) -> bool:
    """An earlier attempt of this run published a version that is still there and was verified (the marker is
    gone once it is): a retry must not publish the model again."""
    if journal is None or journal.state not in ("published", "verified") or journal.version is None:
        return False
    version = journal.version
    return (model_dir / str(version)).is_dir() and not (model_dir / f"{UNVERIFIED_PREFIX}{version}").exists()


def read_journal(path: Path) -> DeployJournal | None:
    """An earlier attempt's journal; None when there is none or it is unreadable (a retry then publishes afresh:
    `settle_unverified` adopts a version the earlier attempt left unverified)."""
    try:
        return DeployJournal.model_validate_json(path.read_bytes())
    except (OSError, ValidationError):
        return None


def record(path: Path, **fields: Any) -> dict[str, Any]:
    """Write the journal (temp, then rename) and return what it says."""
    journal = DeployJournal(**fields)
    artifacts.write(path, journal)
    return journal.model_dump(exclude_unset=True)


def deploy(config: PipelineConfig, volume: Path, run_dir: Path, run_id: str, endpoint: str) -> dict[str, Any]:
    """Publish the run's model as the next version if decide blessed it, wait until served, smoke-test it, and
    roll back on failure. Without the blessing: nothing is published, and the result says why (`skipped`)."""
    name = config.model_name
    why_not = refusal(run_dir)
    if why_not is not None:
        log.warning("not deploying: %s", why_not)
        return {"deployed": False, "model": name, "skipped": why_not}
    model_dir = layout.models_dir(volume, name)
    journal_path = run_dir / layout.DEPLOY_RESULT
    earlier = read_journal(journal_path)
    if already_deployed(earlier, model_dir):
        log.info("an earlier attempt of this run already deployed %s version %d: nothing to do", name,
                 earlier.version)
        return {**earlier.model_dump(exclude_unset=True), "state": "verified", "deployed": True,
                "by_earlier_attempt": True}
    smoke = artifacts.read(run_dir, layout.SMOKE_SET, SmokeSet, "evaluate", "deploy")
    channel = grpc.insecure_channel(endpoint)
    try:
        check_same_volume(model_service_pb2_grpc.ModelServiceStub(channel), name, None, model_dir, endpoint, 0.0)
    except DeployFailed as exc:
        channel.close()
        record(journal_path, state="refused", deployed=False, published=False, reason=str(exc))
        raise
    publication, _ = settle_unverified(model_dir, adopt_run_dir=str(run_dir))
    if publication is None:
        record(journal_path, state="publishing", deployed=False, published=False, model=name)
        publication = publish_unverified(model_dir, run_dir / layout.SAVED_MODEL, lineage(config, run_dir, run_id),
                                         owner={"run_dir": str(run_dir), "run_id": run_id})
    version = publication.version
    record(journal_path, state="published", deployed=False, published=True, verified=False, model=name,
           version=version)
    try:
        waited = wait_available(channel, name, version, AVAILABLE_TIMEOUT_SECONDS, model_dir, endpoint)
        log.info("%s version %d is AVAILABLE after %.1f s", name, version, waited)
        checked = smoke_test(channel, name, version, smoke)
        log.info("smoke test passed on %d examples", checked)
    except DeployFailed as exc:
        publication.withdraw()
        record(journal_path, state="rolled_back", deployed=False, published=True, model=name, version=version,
               rolled_back=True, reason=str(exc))
        raise
    except BaseException as exc:  # Ctrl-C, SIGTERM, or a bug: an unverified version must not stay served
        withdraw_interrupted(publication, journal_path, name, exc)
        raise
    finally:
        channel.close()
    publication.verified()
    return record(journal_path, state="verified", deployed=True, published=True, verified=True, model=name,
                  version=version, endpoint=endpoint, available_after_seconds=round(waited, 2),
                  smoke_examples=checked)


def withdraw_interrupted(publication: Publication, journal_path: Path, name: str, exc: BaseException) -> None:
    """Record, then undo, a publish whose verification was interrupted. Each step is written before the next, so
    a second Ctrl-C leaves a journal that still says what is on disk (and the marker lets the next deploy finish
    the removal)."""
    how = "Ctrl-C" if isinstance(exc, KeyboardInterrupt) else ("a stop signal" if isinstance(exc, SystemExit)
                                                                else f"{type(exc).__name__}: {exc}")
    reason = f"interrupted by {how} after version {publication.version} was published, before it was verified"
    state = {"state": "interrupted", "deployed": False, "published": True, "verified": False, "model": name,
             "version": publication.version}
    record(journal_path, **state, rolled_back=False, reason=reason)
    removed = publication.withdraw()
    record(journal_path, **state, rolled_back=removed,
           reason=reason + ("; the version was removed again" if removed else ""))
    log.warning("deploy %s; %s", reason, "version removed" if removed else "version already gone")
