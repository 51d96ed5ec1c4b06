"""Export the SavedModel (chief only) with a `serving_default` signature over the raw features by name."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import keras
import tensorflow as tf

from trainyard_contract import layout
from trainyard_contract.atomic import staged_dir, write_json
from trainyard_trainer.data import DTYPES


class ServingModule(tf.Module):
    """Takes one tensor per raw feature (as clients and TF Serving send them) and returns class probabilities."""

    def __init__(self, model: keras.Model, schema: dict[str, Any]):
        super().__init__()
        self.model = model
        self.names = [f["name"] for f in schema["features"]]
        self.classes = tf.constant([str(c) for c in schema["label"]["classes"]])
        spec = {f["name"]: tf.TensorSpec([None], DTYPES[f["dtype"]], name=f["name"]) for f in schema["features"]}
        self.serve = tf.function(self._serve, input_signature=[spec])

    def _serve(self, features: dict[str, tf.Tensor]) -> dict[str, tf.Tensor]:
        matrix = tf.stack([tf.cast(features[name], tf.float32) for name in self.names], axis=1)
        logits = self.model(matrix, training=False)
        probabilities = tf.nn.softmax(logits)
        class_ids = tf.argmax(logits, axis=1, output_type=tf.int64)
        return {"probabilities": probabilities, "class_ids": class_ids, "classes": tf.gather(self.classes, class_ids),
                "logits": logits}


def plain_copy(model: keras.Model, build_fn: Any) -> keras.Model:
    """A copy of the trained model outside any distribution strategy, so the SavedModel needs no cluster."""
    copy = build_fn()
    copy.build((None, model.input_shape[-1]))
    copy.set_weights(model.get_weights())
    return copy


def export(model: keras.Model, schema: dict[str, Any], model_dir: Path, training: dict[str, Any]) -> Path:
    """Write `model/` by temp-then-rename: `saved_model/` plus `schema.json` and `training.json` beside it."""
    with staged_dir(model_dir) as out:
        module = ServingModule(model, schema)
        tf.saved_model.save(module, str(out / layout.SAVED_MODEL.name),
                            signatures={"serving_default": module.serve})
        write_json(out / layout.MODEL_SCHEMA.name, {k: v for k, v in schema.items() if k != "stats"})
        write_json(out / layout.TRAINING_RECORD.name, training)
    return model_dir
