"""A multi-layer perceptron for tabular data: numeric and categorical features, classification or regression."""

from __future__ import annotations

from typing import Any

import keras

from trainyard_trainer.model_schema import ModelSchema
from trainyard_trainer.models.layers import feature_vector, model_inputs, output_head


def build_model(params: dict[str, Any], schema: ModelSchema) -> keras.Model:
    units = params.get("hidden_units", [64, 32])
    if not isinstance(units, list) or not all(isinstance(u, int) and u > 0 for u in units):
        raise ValueError(f"hidden_units must be a list of positive integers (got {units!r})")
    dropout = float(params.get("dropout", 0.0))
    one_hot_max = int(params.get("one_hot_max", 8))
    embedding_dim = params.get("embedding_dim")
    inputs = model_inputs(schema)
    x = feature_vector(inputs, schema, one_hot_max=one_hot_max,
                       embedding_dim=int(embedding_dim) if embedding_dim else None)
    for width in units:
        x = keras.layers.Dense(width, activation="relu")(x)
        if dropout:
            x = keras.layers.Dropout(dropout)(x)
    return keras.Model(inputs, output_head(x, schema), name="mlp")
