"""Micro-batches to TF Serving's gRPC Predict (the served model's latest version, so deploys and rollbacks are
followed without the scorer knowing), and the answer back as one output record per event.

The signature's input dtypes come from GetModelMetadata and are looked up again whenever an answer names a version
the scorer has not described yet (a deploy can change a nullable int to float)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import grpc
import numpy as np
from tensorflow.core.framework import types_pb2
from tensorflow.python.framework import tensor_util
from tensorflow_serving.apis import get_model_metadata_pb2, predict_pb2, prediction_service_pb2_grpc

# INVALID_ARGUMENT / FAILED_PRECONDITION: the model refuses this input (a dead letter once narrowed to one event);
# anything else (UNAVAILABLE, DEADLINE_EXCEEDED, NOT_FOUND while no version is served, INTERNAL, ...) is waited out.
REFUSALS = (grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.FAILED_PRECONDITION)

NUMPY_TYPES = {types_pb2.DT_FLOAT: np.float32, types_pb2.DT_DOUBLE: np.float64, types_pb2.DT_INT64: np.int64,
               types_pb2.DT_INT32: np.int32, types_pb2.DT_STRING: object}


class ModelRefused(ValueError):
    """The served model refused the batch's input (INVALID_ARGUMENT): the reason is the server's."""


class ServingUnavailable(ConnectionError):
    """The server (or the model) cannot answer now; retry later."""


@dataclass(frozen=True)
class Answer:
    version: int
    rows: list[dict[str, Any]]  # one per event: output name -> its value (lists for vectors, text for bytes)


class ServingClient:
    def __init__(self, endpoint: str, model: str, timeout: float = 30.0):
        self.endpoint, self.model, self.timeout = endpoint, model, timeout
        self.channel = grpc.insecure_channel(endpoint, options=[("grpc.max_receive_message_length", 64 << 20)])
        self.stub = prediction_service_pb2_grpc.PredictionServiceStub(self.channel)
        self.dtypes: dict[str, int] = {}
        self.described_version: int | None = None

    def close(self) -> None:
        self.channel.close()

    def describe(self) -> None:
        """The latest version's input dtypes (GetModelMetadata)."""
        request = get_model_metadata_pb2.GetModelMetadataRequest(metadata_field=["signature_def"])
        request.model_spec.name = self.model
        try:
            response = self.stub.GetModelMetadata(request, timeout=self.timeout)
        except grpc.RpcError as exc:
            raise ServingUnavailable(f"GetModelMetadata {self.model!r} at {self.endpoint}: {exc.code().name}: "
                                     f"{exc.details()}") from None
        signatures = get_model_metadata_pb2.SignatureDefMap()
        response.metadata["signature_def"].Unpack(signatures)
        inputs = signatures.signature_def["serving_default"].inputs
        self.dtypes = {name: info.dtype for name, info in inputs.items()}
        self.described_version = response.model_spec.version.value

    def submit(self, rows: Sequence[dict[str, Any]]) -> Pending:
        """Start scoring `rows` (feature values by name, None = missing) in one Predict; `collect` waits for it.
        The server works while the caller does other things (the scorer writes the batch before)."""
        if not self.dtypes:
            self.describe()
        request = predict_pb2.PredictRequest()
        request.model_spec.name = self.model
        for name, dtype in self.dtypes.items():
            request.inputs[name].CopyFrom(tensor_util.make_tensor_proto(column(rows, name, dtype)))
        return Pending(self.stub.Predict.future(request, timeout=self.timeout), len(rows))

    def collect(self, pending: Pending) -> Answer:
        try:
            response = pending.future.result()
        except grpc.RpcError as exc:
            if exc.code() in REFUSALS:
                self.dtypes = {}  # a new version may take other dtypes: describe it again before the next try
                raise ModelRefused(f"{exc.code().name}: {exc.details()}") from None
            raise ServingUnavailable(f"Predict {self.model!r} at {self.endpoint}: {exc.code().name}: "
                                     f"{exc.details()}") from None
        version = response.model_spec.version.value
        if version != self.described_version:
            self.dtypes = {}  # describe the new version before the next batch
        return Answer(version, output_rows(response, pending.rows))

    def predict(self, rows: Sequence[dict[str, Any]]) -> Answer:
        return self.collect(self.submit(rows))


@dataclass(frozen=True)
class Pending:
    future: Any  # grpc.Future of a PredictResponse
    rows: int


def column(rows: Sequence[dict[str, Any]], name: str, dtype: int) -> np.ndarray:
    """One input tensor: the rows' values of `name` in the signature's dtype (None -> NaN for floats)."""
    numpy_type = NUMPY_TYPES.get(dtype, object)
    values = [row.get(name) for row in rows]
    if numpy_type is object:
        return np.array([b"" if v is None else str(v).encode() for v in values], dtype=object)
    if numpy_type in (np.float32, np.float64):
        return np.array([np.nan if v is None else v for v in values], dtype=numpy_type)
    return np.array(values, dtype=numpy_type)


def output_rows(response: predict_pb2.PredictResponse, count: int) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = [{} for _ in range(count)]
    for name, proto in response.outputs.items():
        if name == "logits":
            continue  # probabilities carry the same information for a consumer
        values = tensor_util.MakeNdarray(proto).tolist()  # nested Python lists of floats, ints or bytes
        if values and isinstance(values[0], bytes):
            values = [value.decode(errors="replace") for value in values]
        for row, value in zip(rows, values, strict=False):
            row[name] = value
    return rows
