"""The local server speaks the TF Serving API subset: REST and gRPC, errors, version switches and rollbacks."""

from __future__ import annotations

import shutil

import grpc
import numpy as np
import pytest
import tensorflow as tf
from tensorflow_serving.apis import (
    get_model_metadata_pb2,
    get_model_status_pb2,
    model_service_pb2_grpc,
    predict_pb2,
    prediction_service_pb2_grpc,
)

from tests.integration.serving_helpers import Server, export_tiny_model, http, wait_for
from trainyard_contract import layout

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory):  # noqa: ANN201
    root = tmp_path_factory.mktemp("serving")
    export_tiny_model(root / layout.MODELS / "tiny" / "1")
    running = Server(root / layout.MODELS).start(root / "server.log")
    yield running
    running.stop()


def test_rest_status_metadata_and_predict(server: Server) -> None:
    status, body = http("GET", server.url("/v1/models/tiny"))
    assert status == 200
    assert body["model_version_status"][0]["state"] == "AVAILABLE"
    status, meta = http("GET", server.url("/v1/models/tiny/metadata"))
    inputs = meta["metadata"]["signature_def"]["signature_def"]["serving_default"]["inputs"]
    assert status == 200 and set(inputs) == {"a", "b"}
    status, rows = http("POST", server.url("/v1/models/tiny:predict"),
                        {"instances": [{"a": 2.0, "b": 0.0}, {"a": 0.0, "b": 2.0}]})
    assert status == 200 and [p["class_ids"] for p in rows["predictions"]] == [0, 1]
    assert rows["predictions"][1]["classes"] == "1"
    status, cols = http("POST", server.url("/v1/models/tiny/versions/1:predict"),
                        {"inputs": {"a": [2.0, 0.0], "b": [0.0, 2.0]}})
    assert status == 200 and cols["outputs"]["class_ids"] == [0, 1]


@pytest.mark.parametrize(
    ("method", "path", "body", "code", "message"),
    [
        ("GET", "/v1/models/nope", None, 404, "Could not find any versions of model nope"),
        ("POST", "/v1/models/nope:predict", {"instances": [{"a": 1, "b": 1}]}, 404, "Servable not found"),
        ("POST", "/v1/models/tiny/versions/7:predict", {"instances": [{"a": 1, "b": 1}]}, 404, "Specific(tiny, 7)"),
        ("POST", "/v1/models/tiny:predict", {"instances": [{"a": 1, "c": 1}]}, 400, "missing input(s) ['b']"),
        ("POST", "/v1/models/tiny:predict", {"instances": [{"a": "x", "b": 1}]}, 400, "input 'a'"),
        ("POST", "/v1/models/tiny:predict", {"inputs": {"a": [[1, 2]], "b": [1]}}, 400, "shape [1, 2]"),
        ("POST", "/v1/models/tiny:predict", {"inputs": {"a": [1, 2], "b": [1]}}, 400, "rows"),
        ("POST", "/v1/models/tiny:predict", {"instances": []}, 400, "non-empty list"),
        ("POST", "/v1/models/tiny:predict", {"nothing": 1}, 400, "exactly one of 'instances' or 'inputs'"),
        ("GET", "/v2/whatever", None, 404, "Malformed request"),
        ("GET", "/v1/models/tiny:predict", None, 405, "predict needs POST"),
    ],
)
def test_bad_requests_get_tf_serving_style_errors(server: Server, method: str, path: str, body: object, code: int,
                                                  message: str) -> None:
    status, answer = http(method, server.url(path), body)
    assert status == code and message in answer["error"]


def test_malformed_json_and_oversized_bodies(server: Server) -> None:
    status, answer = http("POST", server.url("/v1/models/tiny:predict"), raw=b"{not json")
    assert status == 400 and "JSON Parse error" in answer["error"]
    status, answer = http("POST", server.url("/v1/models/tiny:predict"), raw=b" " * (2 << 20))
    assert status == 413 and "larger than the limit" in answer["error"]
    assert http("GET", server.url("/v1/models/tiny"))[0] == 200  # still serving


def grpc_predict(server: Server, version: int | None = None) -> predict_pb2.PredictResponse:
    with grpc.insecure_channel(server.grpc) as channel:
        request = predict_pb2.PredictRequest()
        request.model_spec.name = "tiny"
        if version is not None:
            request.model_spec.version.value = version
        request.inputs["a"].CopyFrom(tf.make_tensor_proto(np.array([2.0, 0.0], dtype=np.float32)))
        request.inputs["b"].CopyFrom(tf.make_tensor_proto(np.array([0.0, 2.0], dtype=np.float32)))
        return prediction_service_pb2_grpc.PredictionServiceStub(channel).Predict(request, timeout=10)


def test_grpc_predict_metadata_and_status(server: Server) -> None:
    response = grpc_predict(server)
    assert tf.make_ndarray(response.outputs["class_ids"]).tolist() == [0, 1]
    assert response.model_spec.version.value == 1
    with grpc.insecure_channel(server.grpc) as channel:
        status_request = get_model_status_pb2.GetModelStatusRequest()
        status_request.model_spec.name = "tiny"
        status = model_service_pb2_grpc.ModelServiceStub(channel).GetModelStatus(status_request, timeout=10)
        assert [(s.version, s.state) for s in status.model_version_status] == [
            (1, get_model_status_pb2.ModelVersionStatus.AVAILABLE)]
        meta_request = get_model_metadata_pb2.GetModelMetadataRequest(metadata_field=["signature_def"])
        meta_request.model_spec.name = "tiny"
        meta = prediction_service_pb2_grpc.PredictionServiceStub(channel).GetModelMetadata(meta_request, timeout=10)
        signatures = get_model_metadata_pb2.SignatureDefMap()
        meta.metadata["signature_def"].Unpack(signatures)
        assert set(signatures.signature_def["serving_default"].inputs) == {"a", "b"}


def test_grpc_errors(server: Server) -> None:
    with pytest.raises(grpc.RpcError) as info:
        grpc_predict(server, version=9)
    assert info.value.code() == grpc.StatusCode.NOT_FOUND
    with grpc.insecure_channel(server.grpc) as channel:
        request = predict_pb2.PredictRequest()
        request.model_spec.name = "tiny"
        request.inputs["a"].CopyFrom(tf.make_tensor_proto(np.array([1.0], dtype=np.float32)))
        with pytest.raises(grpc.RpcError) as info:
            prediction_service_pb2_grpc.PredictionServiceStub(channel).Predict(request, timeout=10)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "missing input(s) ['b']" in info.value.details()


def test_new_versions_are_served_and_a_removed_latest_falls_back(server: Server) -> None:
    models = server.models / "tiny"
    staging = models / ".tmp-2"
    export_tiny_model(staging, bias=100.0)  # version 2 always answers class 0
    staging.rename(models / "2")
    assert wait_for(lambda: grpc_predict(server).model_spec.version.value == 2)
    assert tf.make_ndarray(grpc_predict(server).outputs["class_ids"]).tolist() == [0, 0]
    shutil.rmtree(models / "2")  # a rollback
    assert wait_for(lambda: grpc_predict(server).model_spec.version.value == 1)
    assert tf.make_ndarray(grpc_predict(server).outputs["class_ids"]).tolist() == [0, 1]


def test_a_version_that_fails_to_load_is_reported_and_not_served(server: Server) -> None:
    broken = server.models / "tiny" / "5"
    broken.mkdir()
    (broken / layout.SAVED_MODEL_PB).write_bytes(b"not a saved model")
    try:
        def reported() -> bool:
            _, body = http("GET", server.url("/v1/models/tiny/versions/5"))
            return bool(body.get("model_version_status")) and body["model_version_status"][0]["state"] == "END"

        assert wait_for(reported)
        _, body = http("GET", server.url("/v1/models/tiny/versions/5"))
        assert "failed to load version 5" in body["model_version_status"][0]["status"]["error_message"]
        assert grpc_predict(server).model_spec.version.value == 1
    finally:
        shutil.rmtree(broken)
