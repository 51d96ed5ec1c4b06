"""The one predict path both front ends use: validate named inputs against the signature, call it, return numpy.

Input is checked the way TF Serving checks it, and before anything large is allocated: the named inputs must be
exactly the signature's, a gRPC TensorProto must carry the signature's dtype (no silent conversion) and a shape
whose element count fits `Limits.max_elements`, every input has the same number of rows (at least one, at most
`Limits.max_batch`), and JSON booleans are not numbers.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import tensorflow as tf
from tensorflow.core.framework import tensor_pb2, types_pb2

from trainyard_serving.limits import Limits
from trainyard_serving.registry import LoadedVersion


class BadRequest(ValueError):
    """Input that does not fit the signature (HTTP 400, gRPC INVALID_ARGUMENT)."""


def dtype_name(enum: int) -> str:
    """TensorFlow's own spelling (`DT_FLOAT` -> `float`, as in "expects float but int64 is provided"); an enum
    value TensorFlow does not know is named by its number."""
    if enum in types_pb2.DataType.values():
        return types_pb2.DataType.Name(enum).removeprefix("DT_").lower()
    return f"dtype {enum}"


def check_names(model: LoadedVersion, given: set[str]) -> None:
    expected = set(model.inputs)
    if given != expected:
        missing, unknown = sorted(expected - given), sorted(given - expected)
        parts = []
        if missing:
            parts.append(f"missing input(s) {missing[:5]}{'...' if len(missing) > 5 else ''}")
        if unknown:
            parts.append(f"unknown input(s) {unknown[:5]}")
        raise BadRequest(f"{'; '.join(parts)}; the signature takes {len(expected)} named inputs")


def decode_tensor_protos(model: LoadedVersion, protos: Mapping[str, tensor_pb2.TensorProto],
                         limits: Limits) -> dict[str, np.ndarray]:
    """gRPC inputs -> arrays, refusing a wrong dtype or an oversized shape before `make_ndarray` allocates."""
    check_names(model, set(protos))
    total = 0
    for name, proto in protos.items():
        spec = model.inputs[name]
        if proto.dtype != spec.dtype.as_datatype_enum:
            raise BadRequest(f"input {name!r}: expects {dtype_name(spec.dtype.as_datatype_enum)} but "
                             f"{dtype_name(proto.dtype)} is provided")
        elements = 1
        for dim in proto.tensor_shape.dim:
            if dim.size < 0:
                raise BadRequest(f"input {name!r}: dimension {dim.size} is not a size")
            elements *= dim.size
            if elements > limits.max_elements:
                break
        total += elements
        if total > limits.max_elements:
            raise BadRequest(f"the request holds more than {limits.max_elements} values (input {name!r} alone "
                             f"declares {elements if elements <= limits.max_elements else 'more'})")
    arrays = {}
    for name, proto in protos.items():
        try:
            arrays[name] = tf.make_ndarray(proto)
        except (ValueError, TypeError) as exc:
            raise BadRequest(f"input {name!r}: cannot decode the tensor: {str(exc).splitlines()[0]}") from None
    return arrays


def contains_bool(value: Any) -> bool:
    """Whether a JSON value (nested lists, depth already bounded) holds a boolean."""
    if isinstance(value, bool):
        return True
    return isinstance(value, list) and any(contains_bool(v) for v in value)


def contains_null(value: Any) -> bool:
    if value is None:
        return True
    return isinstance(value, list) and any(contains_null(v) for v in value)


def nulls_as_nan(value: Any) -> Any:
    """JSON null -> NaN in a float input (nested lists, depth already bounded); other values unchanged, so a
    string stays a string and is refused as one."""
    if value is None:
        return float("nan")
    if isinstance(value, list):
        return [nulls_as_nan(v) for v in value]
    return value


def check_inputs(model: LoadedVersion, columns: dict[str, Any], limits: Limits,
                 json_booleans: bool = False) -> dict[str, tf.Tensor]:
    """Named columns (arrays, or JSON lists) -> tensors of the signature's dtypes, or BadRequest saying why.

    `json_booleans`: the request's JSON holds a `true`/`false` somewhere, so numeric inputs are searched for them."""
    check_names(model, set(columns))
    tensors: dict[str, tf.Tensor] = {}
    batch = None
    total = 0
    for name, value in columns.items():
        spec = model.inputs[name]
        if json_booleans and spec.dtype != tf.bool and contains_bool(value):
            raise BadRequest(f"input {name!r}: expects {spec.dtype.name}, got a JSON boolean")
        try:
            array = value if isinstance(value, np.ndarray) else np.asarray(value)
            if spec.dtype == tf.string:
                tensor = tf.constant(array.astype(object) if array.dtype.kind != "S" else array, dtype=tf.string)
            else:
                if array.dtype.kind == "O" and spec.dtype.is_floating and contains_null(value):
                    array = np.asarray(nulls_as_nan(value))  # null: a missing value (a nullable feature's NaN)
                if array.dtype.kind not in "biuf":
                    raise BadRequest(f"input {name!r}: expected {spec.dtype.name} numbers, "
                                     f"got values of kind {array.dtype.kind!r}")
                tensor = tf.constant(array, dtype=spec.dtype)
        except BadRequest:
            raise
        except (ValueError, TypeError) as exc:
            raise BadRequest(f"input {name!r}: cannot convert to {spec.dtype.name}: {exc}") from None
        if not spec.shape.is_compatible_with(tensor.shape):
            raise BadRequest(f"input {name!r}: shape {list(tensor.shape)} does not match the signature's "
                             f"{spec.shape.as_list()}")
        rows = int(tensor.shape[0]) if tensor.shape.rank else 1
        if batch is not None and rows != batch:
            raise BadRequest(f"input {name!r} has {rows} rows, other inputs have {batch}")
        if rows == 0:
            raise BadRequest(f"input {name!r} has no rows: a batch needs at least one")
        if rows > limits.max_batch:
            raise BadRequest(f"batch of {rows} rows is larger than the limit of {limits.max_batch}")
        total += int(tensor.shape.num_elements() or 0)
        if total > limits.max_elements:
            raise BadRequest(f"the request holds more than {limits.max_elements} values")
        batch = rows
        tensors[name] = tensor
    return tensors


def run(model: LoadedVersion, columns: dict[str, Any], limits: Limits,
        json_booleans: bool = False) -> dict[str, np.ndarray]:
    tensors = check_inputs(model, columns, limits, json_booleans)
    try:
        outputs = model.signature(**tensors)
    except (tf.errors.InvalidArgumentError, ValueError, TypeError) as exc:
        raise BadRequest(f"the model rejected the input: {str(exc).splitlines()[0]}") from None
    return {name: value.numpy() for name, value in outputs.items()}


def to_json_value(value: np.ndarray) -> Any:
    if value.dtype.kind in "SO":
        return np.vectorize(lambda b: b.decode("utf-8", "replace") if isinstance(b, bytes) else b,
                            otypes=[object])(value).tolist()
    return value.tolist()
