"""Export the SavedModel (chief only) with a `serving_default` signature over the raw features by name.

The signature applies the same `FeatureTransform` training used (imputation, vocabulary lookups: the tables are
saved inside the model), then the model: classification returns `probabilities`, `class_ids`, `classes` and
`logits`; regression returns `predictions`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import keras
import tensorflow as tf

from trainyard_contract import layout
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
        outputs = model_outputs(self.model, self.transform(features), self.schema, training=False)
        if not self.schema.is_classification:
            return {"predictions": tf.cast(outputs[:, 0], tf.float32)}
        probabilities = tf.nn.softmax(outputs)
        class_ids = tf.argmax(outputs, axis=1, output_type=tf.int64)
        return {"probabilities": probabilities, "class_ids": class_ids, "classes": tf.gather(self.classes, class_ids),
                "logits": outputs}


def plain_copy(model: keras.Model, build_fn: Any, schema: ModelSchema) -> keras.Model:
    """A copy of the trained model outside any distribution strategy, so the SavedModel needs no cluster."""
    copy = build_fn()
    model_outputs(copy, FeatureTransform(schema)(dummy_raw_batch(schema)), schema, training=False)
    copy.set_weights(model.get_weights())
    return copy


def export(model: keras.Model, schema: ModelSchema, document: dict[str, Any], model_dir: Path,
           training: dict[str, Any]) -> Path:
    """Write `model/` by temp-then-rename: `saved_model/` plus `schema.json` and `training.json` beside it."""
    with staged_dir(model_dir) as out:
        module = ServingModule(model, schema)
        tf.saved_model.save(module, str(out / layout.SAVED_MODEL.name),
                            signatures={"serving_default": module.serve})
        write_json(out / layout.MODEL_SCHEMA.name, document)  # vocabularies and train statistics included
        write_json(out / layout.TRAINING_RECORD.name, training)
    return model_dir
