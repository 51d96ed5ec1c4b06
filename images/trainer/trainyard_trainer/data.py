"""Input pipelines over the prepared TFRecord shards (read in place on the volume, never copied)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import tensorflow as tf

from trainyard_contract import layout

DTYPES = {"float": tf.float32, "int": tf.int64, "string": tf.string}


def load_schema(run_dir: Path) -> dict[str, Any]:
    """The prepared schema, with the per-feature statistics of the prepared stats under "stats" (models
    normalise with them)."""
    path = run_dir / layout.PREPARED_SCHEMA
    if not path.is_file():
        raise FileNotFoundError(f"{path} is missing: prepare_data must run before training")
    schema = json.loads(path.read_text())
    stats = run_dir / layout.PREPARED_STATS
    schema["stats"] = json.loads(stats.read_text())["features"] if stats.is_file() else {}
    return schema


def feature_spec(schema: dict[str, Any]) -> dict[str, tf.io.FixedLenFeature]:
    spec = {f["name"]: tf.io.FixedLenFeature([], DTYPES[f["dtype"]]) for f in schema["features"]}
    spec[schema["label"]["name"]] = tf.io.FixedLenFeature([], tf.int64)
    return spec


def shard_files(prepared: Path, split: str) -> list[str]:
    files = sorted(str(p) for p in (prepared / split).glob(layout.SHARD_GLOB))
    if not files:
        raise FileNotFoundError(f"no {split} shards under {prepared / split}")
    return files


def to_model_inputs(schema: dict[str, Any]):
    """parsed Example batch -> (dense float matrix in schema order, int label)."""
    names = [f["name"] for f in schema["features"]]
    label = schema["label"]["name"]

    def convert(parsed: dict[str, tf.Tensor]) -> tuple[tf.Tensor, tf.Tensor]:
        columns = [tf.cast(parsed[name], tf.float32) for name in names]
        return tf.stack(columns, axis=1), parsed[label]

    return convert


def make_dataset(prepared: Path, split: str, batch_size: int, *, repeat: bool, shuffle_seed: int | None,
                 schema: dict[str, Any]) -> tf.data.Dataset:
    """Parallel reads, batched parsing, batching and prefetch; repeated and shuffled for training."""
    files = tf.data.Dataset.from_tensor_slices(shard_files(prepared, split))
    if shuffle_seed is not None:
        files = files.shuffle(len(shard_files(prepared, split)), seed=shuffle_seed)
    records = files.interleave(tf.data.TFRecordDataset, cycle_length=4, num_parallel_calls=tf.data.AUTOTUNE,
                               deterministic=shuffle_seed is None)
    if repeat:
        records = records.repeat()
    if shuffle_seed is not None:
        records = records.shuffle(10_000, seed=shuffle_seed)
    spec = feature_spec(schema)
    convert = to_model_inputs(schema)

    def parse_batch(serialized: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
        # one vectorised parse per batch, fused with the stacking into the model's input matrix
        return convert(tf.io.parse_example(serialized, spec))

    return (records.batch(batch_size, drop_remainder=repeat)
            .map(parse_batch, num_parallel_calls=tf.data.AUTOTUNE, deterministic=not repeat)
            .prefetch(tf.data.AUTOTUNE))
