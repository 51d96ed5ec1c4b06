"""Raw features -> the model's inputs: the one transform training, evaluation and the SavedModel share.

Nullable numeric features: NaN becomes the train mean. Categorical features: a lookup table from the train
split's vocabulary to ids `oov_buckets + i`; a value outside it (or missing) hashes into one of the
`oov_buckets` ids below, so serving answers an unseen category instead of refusing it. The tables are
`tf.lookup.StaticHashTable`s held by this module, so `tf.saved_model.save` stores them inside the model: serving
needs no side file. Created under a `ParameterServerStrategy` scope, each worker gets its own copy of the tables.
"""

from __future__ import annotations

import tensorflow as tf

from trainyard_trainer.model_schema import NUMERIC_INPUT, ModelSchema

DTYPES = {"float": tf.float32, "int": tf.int64, "string": tf.string}


def label_dtype(schema: ModelSchema) -> tf.DType:
    return tf.int64 if schema.is_classification else tf.float32


def parse_spec(schema: ModelSchema) -> dict[str, tf.io.FixedLenFeature]:
    """How the prepared shards' Examples parse: every raw feature in its stored dtype, and the label."""
    spec = {f.name: tf.io.FixedLenFeature([], DTYPES[f.dtype]) for f in (*schema.numeric, *schema.categorical)}
    spec[schema.label.name] = tf.io.FixedLenFeature([], label_dtype(schema))
    return spec


def raw_signature(schema: ModelSchema) -> dict[str, tf.TensorSpec]:
    """The serving signature's inputs: one 1-D tensor per raw feature, by name, in its own dtype."""
    dtypes = {f.name: f.dtype for f in (*schema.numeric, *schema.categorical)}
    return {name: tf.TensorSpec([None], DTYPES[dtypes[name]], name=name) for name in schema.order}


class FeatureTransform(tf.Module):
    def __init__(self, schema: ModelSchema):
        super().__init__(name="feature_transform")
        self.numeric_names = [f.name for f in schema.numeric]
        self.impute = tf.constant([f.impute if f.impute is not None else 0.0 for f in schema.numeric], tf.float32)
        self.nullable = tf.constant([f.nullable for f in schema.numeric], tf.bool)
        self.categorical = [(f.name, f.dtype, f.oov_buckets) for f in schema.categorical]
        self.tables = {}
        for feature in schema.categorical:
            if feature.dtype == "string":
                keys = tf.constant([str(v) for v in feature.vocabulary], tf.string)
            else:
                keys = tf.constant([int(v) for v in feature.vocabulary], tf.int64)
            ids = tf.range(feature.oov_buckets, feature.size, dtype=tf.int64)
            self.tables[feature.name] = tf.lookup.StaticHashTable(
                tf.lookup.KeyValueTensorInitializer(keys, ids), default_value=-1)

    def __call__(self, raw: dict[str, tf.Tensor]) -> dict[str, tf.Tensor]:
        out: dict[str, tf.Tensor] = {}
        if self.numeric_names:
            matrix = tf.stack([tf.cast(raw[name], tf.float32) for name in self.numeric_names], axis=1)
            missing = tf.math.logical_and(tf.math.is_nan(matrix), self.nullable[tf.newaxis, :])
            out[NUMERIC_INPUT] = tf.where(missing, tf.broadcast_to(self.impute, tf.shape(matrix)), matrix)
        for name, dtype, buckets in self.categorical:
            value = raw[name]
            ids = self.tables[name].lookup(value)
            text = value if dtype == "string" else tf.strings.as_string(value)
            oov = tf.strings.to_hash_bucket_fast(text, buckets)
            out[name] = tf.where(ids < 0, oov, ids)
        return out


def dummy_raw_batch(schema: ModelSchema, rows: int = 2) -> dict[str, tf.Tensor]:
    """A batch of raw features (zeros, empty strings) to build and check a model on."""
    batch = {}
    for f in (*schema.numeric, *schema.categorical):
        batch[f.name] = tf.fill([rows], "") if f.dtype == "string" else tf.zeros([rows], DTYPES[f.dtype])
    return batch
