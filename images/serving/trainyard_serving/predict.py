"""The one predict path both front ends use: validate named inputs against the signature, call it, return numpy.

Input is checked the way TF Serving checks it, and before anything large is allocated: the named inputs must be
exactly the signature's, a gRPC TensorProto must carry the signature's dtype (no silent conversion) and a shape
whose element count fits `Limits.max_elements`, every input has the same number of rows (at least one, at most
`Limits.max_batch`, which also bounds the answer's size), JSON booleans are not numbers and a JSON number with a
fraction is not an integer (TF Serving's gRPC refuses a float for an int64 input; REST refuses `94007.5` rather than
truncating it). Errors name the input and the expected type in words. Missing or infinite values of a feature the
model cannot take are refused by the exported signature itself (see the trainer's export), so real TF Serving
refuses them too.
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


TYPE_WORDS = {"float32": "a number (float)", "float64": "a number (double)", "int64": "an integer (int64)",
              "int32": "an integer (int32)", "string": "text (string)", "bool": "a boolean"}
KIND_WORDS = {"U": "text", "S": "bytes", "b": "booleans", "f": "numbers with a fraction", "c": "complex numbers",
              "O": "values that are not all numbers of one kind (nested lists, or an integer too large)"}


def in_words(dtype: tf.DType) -> str:
    """How an error names the type an input expects: `an integer (int64)`."""
    return TYPE_WORDS.get(dtype.name, dtype.name)


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
        dims = proto.tensor_shape.dim
        elements = 1
        for dim in dims:
            if dim.size < 0:
                raise BadRequest(f"input {name!r}: dimension {dim.size} is not a size")
            elements *= dim.size
            if elements > limits.max_elements:
                break
        total += elements
        if total > limits.max_elements:
            raise BadRequest(f"the request holds more than {limits.max_elements} values (input {name!r} alone "
                             f"declares {elements if elements <= limits.max_elements else 'more'})")
        if dims and dims[0].size > limits.max_batch:  # checked before a one-value proto is filled out to it
            raise BadRequest(f"input {name!r} declares {dims[0].size} rows, more than the limit of "
                             f"{limits.max_batch} rows per request (--max-batch)")
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
            raise BadRequest(f"input {name!r}: expects {in_words(spec.dtype)}, got a JSON boolean")
        try:
            array = value if isinstance(value, np.ndarray) else np.asarray(value)
            if spec.dtype == tf.string:
                tensor = tf.constant(array.astype(object) if array.dtype.kind != "S" else array, dtype=tf.string)
            else:
                if array.dtype.kind == "O" and contains_null(value):
                    if not spec.dtype.is_floating:
                        raise BadRequest(f"input {name!r}: expects {in_words(spec.dtype)}, got null (an integer "
                                         "input has no missing value)")
                    array = np.asarray(nulls_as_nan(value))  # null: a missing value (a nullable feature's NaN)
                if array.dtype.kind not in "biuf":
                    raise BadRequest(f"input {name!r}: expects {in_words(spec.dtype)}, got "
                                     f"{KIND_WORDS.get(array.dtype.kind, 'values it cannot use')}")
                if spec.dtype.is_integer and array.dtype.kind == "f":
                    check_integral(name, spec.dtype, array)
                tensor = tf.constant(array, dtype=spec.dtype)
        except BadRequest:
            raise
        except (ValueError, TypeError) as exc:
            raise BadRequest(f"input {name!r}: expects {in_words(spec.dtype)}, cannot convert: "
                             f"{str(exc).splitlines()[0]}") from None
        if not spec.shape.is_compatible_with(tensor.shape):
            raise BadRequest(f"input {name!r}: shape {list(tensor.shape)} does not match the signature's "
                             f"{spec.shape.as_list()}")
        rows = int(tensor.shape[0]) if tensor.shape.rank else 1
        if batch is not None and rows != batch:
            raise BadRequest(f"input {name!r} has {rows} rows, other inputs have {batch}")
        if rows == 0:
            raise BadRequest(f"input {name!r} has no rows: a batch needs at least one")
        if rows > limits.max_batch:
            raise BadRequest(f"batch of {rows} rows is larger than the limit of {limits.max_batch} rows per "
                             "request (--max-batch)")
        total += int(tensor.shape.num_elements() or 0)
        if total > limits.max_elements:
            raise BadRequest(f"the request holds more than {limits.max_elements} values")
        batch = rows
        tensors[name] = tensor
    return tensors


def check_integral(name: str, dtype: tf.DType, array: np.ndarray) -> None:
    """JSON numbers for an integer input: whole and in range, never truncated (`94007.5` is refused)."""
    info = np.iinfo(dtype.as_numpy_dtype)
    bad = ~np.isfinite(array) | (array != np.trunc(array)) | (array < info.min) | (array > info.max)
    if bad.any():
        value = float(array.flat[int(np.flatnonzero(bad.ravel())[0])])
        raise BadRequest(f"input {name!r}: expects {in_words(dtype)}, got {value!r} (a whole number in "
                         f"{info.min}..{info.max} is required)")


def model_error(text: str) -> str:
    """The line of a model's error a client can act on: an assertion's own message (the exported signature's
    refusal of a NaN names the input), else the first line."""
    if "assertion failed: [" in text:
        return text.split("assertion failed: [", 1)[1].split("]\n", 1)[0].rstrip("]")
    return text.strip().splitlines()[0] if text.strip() else "no message"


def run(model: LoadedVersion, columns: dict[str, Any], limits: Limits,
        json_booleans: bool = False) -> dict[str, np.ndarray]:
    tensors = check_inputs(model, columns, limits, json_booleans)
    try:
        outputs = model.signature(**tensors)
    except (tf.errors.InvalidArgumentError, ValueError, TypeError) as exc:
        raise BadRequest(f"the model rejected the input: {model_error(str(exc))}") from None
    return {name: value.numpy() for name, value in outputs.items()}


def to_json_value(value: np.ndarray) -> Any:
    if value.dtype.kind in "SO":
        return np.vectorize(lambda b: b.decode("utf-8", "replace") if isinstance(b, bytes) else b,
                            otypes=[object])(value).tolist()
    return value.tolist()
