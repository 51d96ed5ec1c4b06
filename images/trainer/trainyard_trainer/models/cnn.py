"""A small convolutional network for images stored as flat pixel columns (e.g. 8x8 digits: image_shape [8, 8, 1])."""

from __future__ import annotations

from typing import Any

import keras


def build_model(params: dict[str, Any], schema: dict[str, Any]) -> keras.Model:
    shape = tuple(params.get("image_shape", (8, 8, 1)))
    features = len(schema["features"])
    if len(shape) != 3 or shape[0] * shape[1] * shape[2] != features:
        raise ValueError(f"image_shape {list(shape)} does not hold the {features} feature columns")
    filters = int(params.get("filters", 16))
    inputs = keras.Input(shape=(features,), name="features")
    x = keras.layers.Reshape(shape)(inputs)
    x = keras.layers.Rescaling(1.0 / float(params.get("pixel_max", 16.0)))(x)
    x = keras.layers.Conv2D(filters, 3, padding="same", activation="relu")(x)
    x = keras.layers.Conv2D(filters * 2, 3, padding="same", activation="relu")(x)
    x = keras.layers.GlobalAveragePooling2D()(x)
    logits = keras.layers.Dense(len(schema["label"]["classes"]), name="logits")(x)
    return keras.Model(inputs, logits, name="cnn")
