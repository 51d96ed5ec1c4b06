"""A serving signature as plain data, and what changing it would do to the clients of the served model.

evaluate describes both models' `serving_default` signatures (input names, dtypes, shapes; output keys) into
metrics.json; decide compares them with `breaking_changes` (pure: no TensorFlow). What a current client would feel
blocks an automatic deploy (`deploy.allow_signature_change` or `force_deploy` lets it through):
- an input removed (TF Serving refuses a request that names an input the signature does not have),
- an input added (TF Serving refuses a request that lacks one: every input of a Trainyard signature is required,
  a nullable feature included, whose clients send null or NaN rather than leaving it out),
- an input whose dtype or shape changed (int64 -> float is refused with "expects float but int64 is provided"),
- an output removed or changed (a client reading `probabilities` finds nothing, or another shape).
An output added is not breaking: clients that do not ask for it never see it.
"""

from __future__ import annotations

from typing import Any

Signature = dict[str, dict[str, dict[str, Any]]]  # {"inputs"|"outputs": {name: {"dtype": str, "shape": [..]}}}


def describe(signature: Any) -> Signature:
    """Plain data for a loaded SavedModel's concrete signature function (TensorSpecs become dtype and shape; an
    unknown dimension is null)."""
    def spec(value: Any) -> dict[str, Any]:
        return {"dtype": value.dtype.name, "shape": value.shape.as_list() if value.shape.rank is not None else None}

    inputs = signature.structured_input_signature[1]
    return {"inputs": {name: spec(value) for name, value in sorted(inputs.items())},
            "outputs": {key: spec(value) for key, value in sorted(signature.structured_outputs.items())}}


def _shape(shape: list[int | None] | None) -> str:
    return "unknown" if shape is None else "[" + ", ".join("batch" if d is None else str(d) for d in shape) + "]"


def breaking_changes(champion: Signature, challenger: Signature) -> list[str]:
    """What a client of the champion would see fail against the challenger, one line each (empty: compatible)."""
    changes: list[str] = []
    old_in, new_in = champion["inputs"], challenger["inputs"]
    for name in sorted(old_in.keys() - new_in.keys()):
        changes.append(f"input {name!r} removed (clients that send it are refused)")
    for name in sorted(new_in.keys() - old_in.keys()):
        changes.append(f"input {name!r} ({new_in[name]['dtype']}) added (every input is required: clients that "
                       "do not send it are refused)")
    for name in sorted(old_in.keys() & new_in.keys()):
        before, after = old_in[name], new_in[name]
        if before["dtype"] != after["dtype"]:
            changes.append(f"input {name!r} dtype {before['dtype']} -> {after['dtype']} (clients sending "
                           f"{before['dtype']} are refused)")
        elif before["shape"] != after["shape"]:
            changes.append(f"input {name!r} shape {_shape(before['shape'])} -> {_shape(after['shape'])}")
    old_out, new_out = champion["outputs"], challenger["outputs"]
    for key in sorted(old_out.keys() - new_out.keys()):
        changes.append(f"output {key!r} removed (clients reading it find nothing)")
    for key in sorted(old_out.keys() & new_out.keys()):
        before, after = old_out[key], new_out[key]
        if before != after:
            changes.append(f"output {key!r} {before['dtype']} {_shape(before['shape'])} -> "
                           f"{after['dtype']} {_shape(after['shape'])}")
    return changes


def additions(champion: Signature, challenger: Signature) -> list[str]:
    """Outputs the challenger adds: not breaking, reported for the record."""
    return [f"output {key!r} added" for key in sorted(challenger["outputs"].keys() - champion["outputs"].keys())]
