"""TF Serving's gRPC API subset with tensorflow-serving-api's own stubs: Predict, GetModelMetadata, GetModelStatus."""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
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
from trainyard_serving.limits import Limits
from trainyard_serving.registry import ModelRegistry, NotFound, unknown_label

log = logging.getLogger("trainyard.serving")

STATES = get_model_status_pb2.ModelVersionStatus.State


def _version(spec: Any) -> int | None:
    """The requested version; a version label is refused as TF Serving refuses one its config lacks."""
    if spec.WhichOneof("version_choice") == "version_label":
        raise predict.BadRequest(unknown_label(spec.version_label))
    return spec.version.value if spec.HasField("version") else None


def answer_errors(method: Callable[..., Any]) -> Callable[..., Any]:
    """Every failure becomes a status a client can act on: NOT_FOUND, INVALID_ARGUMENT, or INTERNAL (logged) for a
    bug of ours; never gRPC's UNKNOWN "Exception calling application"."""
    @functools.wraps(method)
    def wrapper(self: Any, request: Any, context: grpc.ServicerContext) -> Any:
        try:
            return method(self, request, context)
        except NotFound as exc:
            context.abort(grpc.StatusCode.NOT_FOUND, str(exc))
        except predict.BadRequest as exc:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        except Exception as exc:  # the methods raise; none calls context.abort inside this try
            log.exception("%s failed", method.__name__)
            context.abort(grpc.StatusCode.INTERNAL, f"internal error: {type(exc).__name__}: {exc}")
    return wrapper


class PredictionService(prediction_service_pb2_grpc.PredictionServiceServicer):
    def __init__(self, registry: ModelRegistry, limits: Limits):
        self.registry, self.limits = registry, limits

    @answer_errors
    def Predict(self, request: predict_pb2.PredictRequest, context: grpc.ServicerContext) -> Any:  # noqa: N802
        if request.model_spec.signature_name not in ("", "serving_default"):
            raise predict.BadRequest(f"serving signature name {request.model_spec.signature_name!r} not found")
        loaded = self.registry.get(request.model_spec.name, _version(request.model_spec))
        unknown = sorted(set(request.output_filter) - set(loaded.outputs))
        if unknown:
            raise predict.BadRequest(f"output tensor alias not found in signature: {unknown[0]} Outputs expected "
                                     f"to be in the set {{{','.join(sorted(loaded.outputs))}}}.")
        columns = predict.decode_tensor_protos(loaded, request.inputs, self.limits)
        outputs = predict.run(loaded, columns, self.limits)
        response = predict_pb2.PredictResponse()
        response.model_spec.name = request.model_spec.name
        response.model_spec.version.value = loaded.version
        response.model_spec.signature_name = "serving_default"
        filter_ = set(request.output_filter)
        for name, value in outputs.items():
            if not filter_ or name in filter_:
                response.outputs[name].CopyFrom(tf.make_tensor_proto(value))
        return response

    @answer_errors
    def GetModelMetadata(self, request: Any, context: grpc.ServicerContext) -> Any:  # noqa: N802
        if list(request.metadata_field) != ["signature_def"]:
            raise predict.BadRequest("metadata_field must be ['signature_def']")
        loaded = self.registry.get(request.model_spec.name, _version(request.model_spec))
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

    @answer_errors
    def GetModelStatus(self, request: Any, context: grpc.ServicerContext) -> Any:  # noqa: N802
        items = self.registry.status(request.model_spec.name, _version(request.model_spec))
        response = get_model_status_pb2.GetModelStatusResponse()
        for version, status in items:
            entry = response.model_version_status.add()
            entry.version = version
            entry.state = STATES.Value(status.state)
            if status.error:
                entry.status.error_code = 2  # tensorflow.error.UNKNOWN
                entry.status.error_message = status.error
        return response


def make_server(registry: ModelRegistry, host: str, port: int, limits: Limits, workers: int = 8) -> grpc.Server:
    """The gRPC server on `host:port`, alone on it: gRPC's default SO_REUSEPORT would let a second (or stale)
    server bind the same port and take part of the traffic, so it is off, and a taken port is an error."""
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=workers),
                         maximum_concurrent_rpcs=limits.max_connections,
                         options=[("grpc.so_reuseport", 0),
                                  ("grpc.max_receive_message_length", limits.max_body_bytes)])
    prediction_service_pb2_grpc.add_PredictionServiceServicer_to_server(PredictionService(registry, limits), server)
    model_service_pb2_grpc.add_ModelServiceServicer_to_server(ModelService(registry), server)
    try:
        bound = server.add_insecure_port(f"{host}:{port}")
    except RuntimeError as exc:  # newer grpcio raises where older ones return 0
        raise PortTaken(f"cannot listen for gRPC on {host}:{port}: {exc}") from None
    if bound == 0:
        raise PortTaken(f"cannot listen for gRPC on {host}:{port}: the port is in use (another server?)")
    return server


class PortTaken(OSError):
    """The port is already bound by another process: the server refuses to start rather than share it."""
