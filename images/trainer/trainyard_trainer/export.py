"""Export the SavedModel (chief only) with a `serving_default` signature over the raw features by name.

The signature applies the same `FeatureTransform` training used (imputation, vocabulary lookups: the tables are
saved inside the model), then the model: classification returns `probabilities`, `class_ids`, `classes` and
`logits`; regression returns `predictions`.

Before that it refuses what the model cannot use: a missing (NaN) or infinite value in a non-nullable float
feature, or an infinite one in a nullable feature (NaN there means missing and is imputed). The check is part of
the exported graph, so TF Serving itself answers INVALID_ARGUMENT naming the feature, not a silent constant answer.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import keras
import tensorflow as tf

from trainyard_contract import artifacts, layout
from trainyard_contract.artifacts import TrainingRecord
from trainyard_contract.atomic import staged_dir, write_json
from trainyard_trainer.features import FeatureTransform, dummy_raw_batch, raw_signature
from trainyard_trainer.model_schema import ModelSchema
from trainyard_trainer.train import model_outputs


class ServingModule(tf.Module):
    """Takes one tensor per raw feature (as clients and TF Serving send them) and returns the task's outputs."""

    def __init__(self, model: keras.Model, schema: ModelSchema):
        super().__init__()
        self.model = model
        self.schema = schema
        self.transform = FeatureTransform(schema)
        self.classes = tf.constant([str(c) for c in schema.label.classes] or [""])
        self.serve = tf.function(self._serve, input_signature=[raw_signature(schema)])

    def _serve(self, features: dict[str, tf.Tensor]) -> dict[str, tf.Tensor]:
        with tf.control_dependencies(refuse_unusable_values(features, self.schema)):
            features = {name: tf.identity(value) for name, value in features.items()}
        outputs = model_outputs(self.model, self.transform(features), self.schema, training=False)
        if not self.schema.is_classification:
            return {"predictions": tf.cast(outputs[:, 0], tf.float32)}
        probabilities = tf.nn.softmax(outputs)
        class_ids = tf.argmax(outputs, axis=1, output_type=tf.int64)
        return {"probabilities": probabilities, "class_ids": class_ids, "classes": tf.gather(self.classes, class_ids),
                "logits": outputs}


def refuse_unusable_values(features: dict[str, tf.Tensor], schema: ModelSchema) -> list[tf.Operation]:
    """One assertion per float feature: InvalidArgumentError naming the feature when a value is NaN (not
    nullable) or infinite. Integer and string inputs cannot hold such values."""
    checks = []
    for feature in schema.numeric:
        if feature.dtype != "float":
            continue
        value = features[feature.name]
        if feature.nullable:
            bad = tf.math.is_inf(value)
            words = "an infinite value (a nullable feature takes a number, or null/NaN for missing)"
        else:
            bad = tf.logical_not(tf.math.is_finite(value))
            words = "a missing (null/NaN) or infinite value, and the feature is not nullable: send a finite number"
        checks.append(tf.debugging.Assert(tf.logical_not(tf.reduce_any(bad)),
                                          [f"input `{feature.name}` (a float number) got {words}"],
                                          name=f"refuse_unusable_{len(checks)}"))
    return checks


def plain_copy(model: keras.Model, build_fn: Any, schema: ModelSchema) -> keras.Model:
    """A copy of the trained model outside any distribution strategy, so the SavedModel needs no cluster."""
    copy = build_fn()
    model_outputs(copy, FeatureTransform(schema)(dummy_raw_batch(schema)), schema, training=False)
    copy.set_weights(model.get_weights())
    return copy


def export(model: keras.Model, schema: ModelSchema, document: dict[str, Any], model_dir: Path,
           training: TrainingRecord) -> Path:
    """Write `model/` by temp-then-rename: `saved_model/` plus `schema.json` and `training.json` beside it."""
    with staged_dir(model_dir) as out:
        module = ServingModule(model, schema)
        tf.saved_model.save(module, str(out / layout.SAVED_MODEL.name),
                            signatures={"serving_default": module.serve})
        write_json(out / layout.MODEL_SCHEMA.name, document)  # vocabularies and train statistics included
        artifacts.write(out / layout.TRAINING_RECORD.name, training)
    return model_dir
