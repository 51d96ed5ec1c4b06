"""A small convolutional network for images stored as flat pixel columns (e.g. 8x8 digits: image_shape [8, 8, 1])."""

from __future__ import annotations

from typing import Any

import keras

from trainyard_trainer.model_schema import NUMERIC_INPUT, ModelSchema
from trainyard_trainer.models.layers import model_inputs, output_head


def build_model(params: dict[str, Any], schema: ModelSchema) -> keras.Model:
    shape = tuple(params.get("image_shape", (8, 8, 1)))
    pixels = len(schema.numeric)
    if schema.categorical:
        raise ValueError(f"the CNN reads numeric pixel columns only; {len(schema.categorical)} categorical "
                         "feature(s) are configured (use trainyard_trainer.models.mlp)")
    if len(shape) != 3 or shape[0] * shape[1] * shape[2] != pixels:
        raise ValueError(f"image_shape {list(shape)} does not hold the {pixels} feature columns")
    filters = int(params.get("filters", 16))
    inputs = model_inputs(schema)
    x = keras.layers.Reshape(shape)(inputs[NUMERIC_INPUT])
    x = keras.layers.Rescaling(1.0 / float(params.get("pixel_max", 16.0)))(x)
    x = keras.layers.Conv2D(filters, 3, padding="same", activation="relu")(x)
    x = keras.layers.Conv2D(filters * 2, 3, padding="same", activation="relu")(x)
    x = keras.layers.GlobalAveragePooling2D()(x)
    return keras.Model(inputs, output_head(x, schema), name="cnn")
