"""The one predict path both front ends use: validate named inputs against the signature, call it, return numpy."""

from __future__ import annotations

from typing import Any

import numpy as np
import tensorflow as tf

from trainyard_serving.registry import LoadedVersion


class BadRequest(ValueError):
    """Input that does not fit the signature (HTTP 400, gRPC INVALID_ARGUMENT)."""


MAX_BATCH = 100_000


def check_inputs(model: LoadedVersion, columns: dict[str, Any]) -> dict[str, tf.Tensor]:
    expected = set(model.inputs)
    given = set(columns)
    if given != expected:
        missing, unknown = sorted(expected - given), sorted(given - expected)
        parts = []
        if missing:
            parts.append(f"missing input(s) {missing[:5]}{'...' if len(missing) > 5 else ''}")
        if unknown:
            parts.append(f"unknown input(s) {unknown[:5]}")
        raise BadRequest(f"{'; '.join(parts)}; the signature takes {len(expected)} named inputs")
    tensors: dict[str, tf.Tensor] = {}
    batch = None
    for name, value in columns.items():
        spec = model.inputs[name]
        try:
            array = value if isinstance(value, np.ndarray) else np.asarray(value)
            if spec.dtype == tf.string:
                tensor = tf.constant(array.astype(object) if array.dtype.kind != "S" else array, dtype=tf.string)
            else:
                if array.dtype.kind not in "biuf":
                    raise BadRequest(f"input {name!r}: expected {spec.dtype.name} numbers, "
                                     f"got values of kind {array.dtype.kind!r}")
                tensor = tf.constant(array, dtype=spec.dtype)
        except (ValueError, TypeError) as exc:
            raise BadRequest(f"input {name!r}: cannot convert to {spec.dtype.name}: {exc}") from None
        if not spec.shape.is_compatible_with(tensor.shape):
            raise BadRequest(f"input {name!r}: shape {list(tensor.shape)} does not match the signature's "
                             f"{spec.shape.as_list()}")
        rows = int(tensor.shape[0]) if tensor.shape.rank else 1
        if batch is not None and rows != batch:
            raise BadRequest(f"input {name!r} has {rows} rows, other inputs have {batch}")
        if rows > MAX_BATCH:
            raise BadRequest(f"batch of {rows} rows is larger than {MAX_BATCH}")
        batch = rows
        tensors[name] = tensor
    return tensors


def run(model: LoadedVersion, columns: dict[str, Any]) -> dict[str, np.ndarray]:
    tensors = check_inputs(model, columns)
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
