"""TF Serving's gRPC API subset with tensorflow-serving-api's own stubs: Predict, GetModelMetadata, GetModelStatus."""

from __future__ import annotations

from concurrent import futures
from typing import Any

import grpc
import tensorflow as tf
from tensorflow_serving.apis import (
    get_model_metadata_pb2,
    get_model_status_pb2,
    model_service_pb2_grpc,
    predict_pb2,
    prediction_service_pb2_grpc,
)

from trainyard_serving import predict
from trainyard_serving.registry import ModelRegistry, NotFound

STATES = get_model_status_pb2.ModelVersionStatus.State


def _version(spec: Any) -> int | None:
    return spec.version.value if spec.HasField("version") else None


class PredictionService(prediction_service_pb2_grpc.PredictionServiceServicer):
    def __init__(self, registry: ModelRegistry):
        self.registry = registry

    def Predict(self, request: predict_pb2.PredictRequest, context: grpc.ServicerContext) -> Any:  # noqa: N802
        try:
            if request.model_spec.signature_name not in ("", "serving_default"):
                raise predict.BadRequest(f"serving signature name {request.model_spec.signature_name!r} not found")
            loaded = self.registry.get(request.model_spec.name, _version(request.model_spec))
            columns = {name: tf.make_ndarray(proto) for name, proto in request.inputs.items()}
            outputs = predict.run(loaded, columns)
        except NotFound as exc:
            context.abort(grpc.StatusCode.NOT_FOUND, str(exc))
        except predict.BadRequest as exc:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        except ValueError as exc:  # a TensorProto that does not decode
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"cannot decode an input tensor: {exc}")
        response = predict_pb2.PredictResponse()
        response.model_spec.name = request.model_spec.name
        response.model_spec.version.value = loaded.version
        response.model_spec.signature_name = "serving_default"
        filter_ = set(request.output_filter)
        for name, value in outputs.items():
            if not filter_ or name in filter_:
                response.outputs[name].CopyFrom(tf.make_tensor_proto(value))
        return response

    def GetModelMetadata(self, request: Any, context: grpc.ServicerContext) -> Any:  # noqa: N802
        if list(request.metadata_field) != ["signature_def"]:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, "metadata_field must be ['signature_def']")
        try:
            loaded = self.registry.get(request.model_spec.name, _version(request.model_spec))
        except NotFound as exc:
            context.abort(grpc.StatusCode.NOT_FOUND, str(exc))
        response = get_model_metadata_pb2.GetModelMetadataResponse()
        response.model_spec.name = request.model_spec.name
        response.model_spec.version.value = loaded.version
        signatures = get_model_metadata_pb2.SignatureDefMap()
        for key, value in loaded.signature_defs.items():
            signatures.signature_def[key].CopyFrom(value)
        response.metadata["signature_def"].Pack(signatures)
        return response


class ModelService(model_service_pb2_grpc.ModelServiceServicer):
    def __init__(self, registry: ModelRegistry):
        self.registry = registry

    def GetModelStatus(self, request: Any, context: grpc.ServicerContext) -> Any:  # noqa: N802
        try:
            items = self.registry.status(request.model_spec.name, _version(request.model_spec))
        except NotFound as exc:
            context.abort(grpc.StatusCode.NOT_FOUND, str(exc))
        response = get_model_status_pb2.GetModelStatusResponse()
        for version, status in items:
            entry = response.model_version_status.add()
            entry.version = version
            entry.state = STATES.Value(status.state)
            if status.error:
                entry.status.error_code = 2  # tensorflow.error.UNKNOWN
                entry.status.error_message = status.error
        return response


def make_server(registry: ModelRegistry, host: str, port: int, workers: int = 8) -> grpc.Server:
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=workers),
                         options=[("grpc.max_receive_message_length", 64 << 20)])
    prediction_service_pb2_grpc.add_PredictionServiceServicer_to_server(PredictionService(registry), server)
    model_service_pb2_grpc.add_ModelServiceServicer_to_server(ModelService(registry), server)
    if server.add_insecure_port(f"{host}:{port}") == 0:
        raise OSError(f"cannot listen for gRPC on {host}:{port}")
    return server
