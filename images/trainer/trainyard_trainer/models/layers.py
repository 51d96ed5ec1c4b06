"""Building blocks for model modules: the model's inputs, numeric standardisation, categorical encodings, and
the output head of each task. The built-in MLP is made of these; a model of your own may be too."""

from __future__ import annotations

import keras

from trainyard_trainer.model_schema import NUMERIC_INPUT, ModelSchema


def model_inputs(schema: ModelSchema) -> dict[str, keras.KerasTensor]:
    """The inputs a model is called with: `"numeric"` [batch, n] float32 and one int64 [batch] per categorical."""
    inputs: dict[str, keras.KerasTensor] = {}
    if schema.numeric:
        inputs[NUMERIC_INPUT] = keras.Input(shape=(len(schema.numeric),), name=NUMERIC_INPUT)
    for feature in schema.categorical:
        inputs[feature.name] = keras.Input(shape=(), dtype="int64", name=feature.name)
    return inputs


def standardized_numeric(inputs: dict[str, keras.KerasTensor], schema: ModelSchema) -> keras.KerasTensor | None:
    """(x - mean) / std per numeric feature, from the train split's statistics, baked into the model."""
    if not schema.numeric:
        return None
    mean = [f.mean for f in schema.numeric]
    variance = [max(f.std, 1e-3) ** 2 for f in schema.numeric]
    return keras.layers.Normalization(mean=mean, variance=variance, name="standardize")(inputs[NUMERIC_INPUT])


def embedding_width(size: int) -> int:
    """A common rule of thumb: about 1.6 * size^0.56, at most 32."""
    return max(2, min(32, round(1.6 * size**0.56)))


def encoded_categoricals(inputs: dict[str, keras.KerasTensor], schema: ModelSchema, *, one_hot_max: int = 8,
                         embedding_dim: int | None = None) -> list[keras.KerasTensor]:
    """One tensor per categorical feature: one-hot when it has at most `one_hot_max` ids, else an embedding."""
    out = []
    for feature in schema.categorical:
        ids = inputs[feature.name]
        if feature.size <= one_hot_max:
            out.append(keras.layers.CategoryEncoding(num_tokens=feature.size, output_mode="one_hot",
                                                     name=f"{feature.name}_one_hot")(ids))
        else:
            width = embedding_dim or embedding_width(feature.size)
            out.append(keras.layers.Embedding(feature.size, width, name=f"{feature.name}_embedding")(ids))
    return out


def feature_vector(inputs: dict[str, keras.KerasTensor], schema: ModelSchema, **categorical) -> keras.KerasTensor:
    """Every feature as one float vector: standardised numerics next to the encoded categoricals."""
    parts = [p for p in [standardized_numeric(inputs, schema)] if p is not None]
    parts += encoded_categoricals(inputs, schema, **categorical)
    return parts[0] if len(parts) == 1 else keras.layers.Concatenate(name="features")(parts)


def output_head(x: keras.KerasTensor, schema: ModelSchema) -> keras.KerasTensor:
    """Logits per class; for regression one prediction in label units (the layer predicts a standardised
    value, rescaled by the train split's label mean and std, so training starts near the label's scale)."""
    if schema.is_classification:
        return keras.layers.Dense(schema.num_classes, name="logits")(x)
    standardized = keras.layers.Dense(1, name="standardized_prediction")(x)
    std = max(schema.label.std, 1e-6)
    return keras.layers.Rescaling(scale=std, offset=schema.label.mean, name="prediction")(standardized)
