"""A multi-layer perceptron for tabular features."""

from __future__ import annotations

from typing import Any

import keras


def build_model(params: dict[str, Any], schema: dict[str, Any]) -> keras.Model:
    units = params.get("hidden_units", [64, 32])
    if not isinstance(units, list) or not all(isinstance(u, int) and u > 0 for u in units):
        raise ValueError(f"hidden_units must be a list of positive integers (got {units!r})")
    dropout = float(params.get("dropout", 0.0))
    inputs = keras.Input(shape=(len(schema["features"]),), name="features")
    x = standardize(inputs, schema)
    for width in units:
        x = keras.layers.Dense(width, activation="relu")(x)
        if dropout:
            x = keras.layers.Dropout(dropout)(x)
    logits = keras.layers.Dense(len(schema["label"]["classes"]), name="logits")(x)
    return keras.Model(inputs, logits, name="mlp")


def standardize(x: keras.KerasTensor, schema: dict[str, Any]) -> keras.KerasTensor:
    """(x - mean) / std per feature from prepare_data's stats, baked into the model (and so into serving)."""
    stats = schema.get("stats") or {}
    names = [f["name"] for f in schema["features"]]
    if not all(name in stats for name in names):
        return x
    mean = [stats[n]["mean"] for n in names]
    variance = [max(stats[n]["std"], 1e-3) ** 2 for n in names]
    return keras.layers.Normalization(mean=mean, variance=variance, name="standardize")(x)
