"""Input pipelines over the prepared TFRecord shards (read in place on the volume, never copied)."""

from __future__ import annotations

import json
from pathlib import Path

import tensorflow as tf

from trainyard_contract import layout
from trainyard_contract.runtime import StageError
from trainyard_trainer.features import FeatureTransform, parse_spec
from trainyard_trainer.model_schema import ModelSchema, schema_with_stats


def load_schema_document(run_dir: Path) -> dict:
    """The prepared schema, with each numeric feature's train statistics (models normalise with them)."""
    path = run_dir / layout.PREPARED_SCHEMA
    if not path.is_file():
        raise StageError(f"{path} is missing: prepare_data must run before training")
    return schema_with_stats(json.loads(path.read_text()), load_stats(run_dir))


def load_schema(run_dir: Path) -> ModelSchema:
    return ModelSchema.from_document(load_schema_document(run_dir))


def load_stats(run_dir: Path) -> dict:
    stats = run_dir / layout.PREPARED_STATS
    return json.loads(stats.read_text())["features"] if stats.is_file() else {}


def shard_files(prepared: Path, split: str) -> list[str]:
    files = sorted(str(p) for p in (prepared / split).glob(layout.SHARD_GLOB))
    if not files:
        raise StageError(f"no {split} shards under {prepared / split}")
    return files


def make_dataset(prepared: Path, split: str, batch_size: int, *, repeat: bool, shuffle_seed: int | None,
                 schema: ModelSchema, transform: FeatureTransform) -> tf.data.Dataset:
    """Parallel reads, batched parsing and transform, batching and prefetch; repeated and shuffled for training.

    Yields (model inputs, label): the inputs are what `transform` makes of the raw features (see model_schema)."""
    files = tf.data.Dataset.from_tensor_slices(shard_files(prepared, split))
    if shuffle_seed is not None:
        files = files.shuffle(len(shard_files(prepared, split)), seed=shuffle_seed)
    records = files.interleave(tf.data.TFRecordDataset, cycle_length=4, num_parallel_calls=tf.data.AUTOTUNE,
                               deterministic=shuffle_seed is None)
    if repeat:
        records = records.repeat()
    if shuffle_seed is not None:
        records = records.shuffle(10_000, seed=shuffle_seed)
    spec = parse_spec(schema)
    label = schema.label.name

    def parse_batch(serialized: tf.Tensor) -> tuple[dict[str, tf.Tensor], tf.Tensor]:
        # one vectorised parse per batch, fused with the transform into the model's inputs
        parsed = tf.io.parse_example(serialized, spec)
        return transform(parsed), parsed[label]

    return (records.batch(batch_size, drop_remainder=repeat)
            .map(parse_batch, num_parallel_calls=tf.data.AUTOTUNE, deterministic=not repeat)
            .prefetch(tf.data.AUTOTUNE))
