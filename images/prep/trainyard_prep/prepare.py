"""prepare_data: pinned CSV inputs -> deterministic train/eval TFRecord shards + schema, stats and manifest.

Streaming: files are read in chunks of `prep.chunk_rows`, so memory does not grow with the number of rows.
Deterministic: each row's split and shard come from a seeded hash of its content, so the output does not depend
on chunk size, file order or how many times the stage runs. Everything is written under a temporary sibling of
`<run>/prepared/` and renamed into place at the end.
"""

from __future__ import annotations

import hashlib
import time
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from trainyard_contract import layout
from trainyard_contract.atomic import staged_dir, write_json
from trainyard_contract.runtime import Progress, StageError, log
from trainyard_contract.schema import PipelineConfig
from trainyard_prep.encoding import ExampleEncoder
from trainyard_prep.readers import read_chunks

HASH_BUCKETS = 10_000


def split_and_shard(frame: pd.DataFrame, seed: int, eval_fraction: float, train_shards: int,
                    eval_shards: int) -> tuple[np.ndarray, np.ndarray]:
    """(is_eval, shard) per row, from a seeded 64-bit hash of the row's values."""
    key = hashlib.sha256(str(seed).encode()).hexdigest()[:16]
    hashes = pd.util.hash_pandas_object(frame, index=False, hash_key=key).to_numpy(dtype=np.uint64)
    is_eval = (hashes % HASH_BUCKETS) < round(eval_fraction * HASH_BUCKETS)
    rest = hashes // HASH_BUCKETS
    shard = np.where(is_eval, rest % eval_shards, rest % train_shards).astype(np.int64)
    return is_eval, shard


class RunningStats:
    """Streaming count / mean / variance (Chan's parallel merge) / min / max per numeric column."""

    def __init__(self, columns: list[str]):
        self.columns = columns
        self.count = 0
        self.mean = np.zeros(len(columns))
        self.m2 = np.zeros(len(columns))
        self.min = np.full(len(columns), np.inf)
        self.max = np.full(len(columns), -np.inf)

    def update(self, values: np.ndarray) -> None:
        n = values.shape[0]
        if n == 0:
            return
        batch_mean = values.mean(axis=0)
        batch_m2 = ((values - batch_mean) ** 2).sum(axis=0)
        delta = batch_mean - self.mean
        total = self.count + n
        self.mean = self.mean + delta * n / total
        self.m2 = self.m2 + batch_m2 + delta**2 * self.count * n / total
        self.count = total
        self.min = np.minimum(self.min, values.min(axis=0))
        self.max = np.maximum(self.max, values.max(axis=0))

    def as_dict(self) -> dict[str, Any]:
        std = np.sqrt(self.m2 / self.count) if self.count else np.zeros(len(self.columns))
        return {
            name: {"count": self.count, "mean": float(self.mean[i]), "std": float(std[i]),
                   "min": float(self.min[i]) if self.count else None, "max": float(self.max[i]) if self.count else None}
            for i, name in enumerate(self.columns)
        }


def schema_document(config: PipelineConfig) -> dict[str, Any]:
    """What the trainer and evaluator need to parse the shards and build the serving signature."""
    data = config.data
    return {
        "format": "tfrecord/tf.train.Example",
        "features": [{"name": f.name, "dtype": f.dtype, "shape": []} for f in data.columns()],
        "label": {"name": data.label.name, "dtype": "int", "encoding": "class_index",
                  "classes": list(data.label.classes)},
    }


def _file_digest(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        while block := handle.read(1 << 20):
            digest.update(block)
    return digest.hexdigest()


def prepare(run_dir: Path, config: PipelineConfig, manifest: dict[str, Any]) -> dict[str, Any]:
    data = config.data
    features = data.columns()
    numeric = [f.name for f in features if f.dtype != "string"]
    label = data.label
    class_index = {value: i for i, value in enumerate(label.classes)}
    columns = [f.name for f in features] + [label.name]
    split = data.split
    stats = RunningStats(numeric)
    label_counts = {"train": np.zeros(len(label.classes), dtype=np.int64),
                    "eval": np.zeros(len(label.classes), dtype=np.int64)}
    started = time.monotonic()
    with staged_dir(run_dir / layout.PREPARED) as out:
        encoder = ExampleEncoder(features, label.name)
        writers = {
            split_name: [out / split_name / layout.shard_name(i, count) for i in range(count)]
            for split_name, count in (("train", data.shards.train), ("eval", data.shards.eval))
        }
        shard_rows = {name: [0] * len(paths) for name, paths in writers.items()}
        with encoder.open_writers([p for paths in writers.values() for p in paths]) as sinks:
            progress = Progress("prepare")  # started after TensorFlow is loaded: rows/s of the work itself
            sink_of = {"train": sinks[: data.shards.train], "eval": sinks[data.shards.train :]}
            for entry in manifest["files"]:
                path = run_dir / entry["snapshot"]
                for chunk, nbytes in read_chunks(path, config.prep.chunk_rows, columns):
                    missing = [c for c in columns if c not in chunk.columns]
                    if missing:
                        raise StageError(f"{entry['source']}: missing column(s) {missing} (did validate_data run?)")
                    chunk = chunk[columns]
                    labels = chunk[label.name].map(class_index)
                    if labels.isna().any():
                        bad = chunk[label.name][labels.isna()].iloc[0]
                        raise StageError(f"{entry['source']}: label {bad!r} is not in data.label.classes")
                    is_eval, shard = split_and_shard(chunk, split.seed, split.eval_fraction, data.shards.train,
                                                     data.shards.eval)
                    label_index = labels.to_numpy(dtype=np.int64)
                    stats.update(chunk[numeric].to_numpy(dtype=np.float64))
                    for name, mask in (("train", ~is_eval), ("eval", is_eval)):
                        if not mask.any():
                            continue
                        part = chunk[mask]
                        part_labels = label_index[mask]
                        part_shards = shard[mask]
                        label_counts[name] += np.bincount(part_labels, minlength=len(label.classes))
                        for index in np.unique(part_shards):
                            rows = part_shards == index
                            count = encoder.write(sink_of[name][index], part[rows], part_labels[rows])
                            shard_rows[name][index] += count
                    progress.add(len(chunk), nbytes)
        totals = {name: sum(counts) for name, counts in shard_rows.items()}
        if totals["train"] == 0 or totals["eval"] == 0:
            raise StageError(
                f"the split left {totals['train']} train and {totals['eval']} eval row(s); need both "
                f"(add rows or change data.split.eval_fraction={split.eval_fraction})"
            )
        outputs = [
            {"path": str(path.relative_to(out)), "split": name, "rows": shard_rows[name][i],
             "bytes": path.stat().st_size, "sha256": _file_digest(path)}
            for name, paths in writers.items() for i, path in enumerate(paths)
        ]
        schema = schema_document(config)
        write_json(out / layout.PREPARED_SCHEMA.name, schema)
        write_json(out / layout.PREPARED_STATS.name, {
            "rows": totals, "features": stats.as_dict(),
            "label_distribution": {name: dict(zip(map(str, label.classes), counts.tolist(), strict=True))
                                   for name, counts in label_counts.items()},
        })
        input_digest = hashlib.sha256(
            "".join(f["sha256"] for f in manifest["files"]).encode()
        ).hexdigest()
        result = {
            "rows": totals,
            "shards": outputs,
            "inputs": {"files": len(manifest["files"]), "bytes": manifest["total_bytes"], "sha256": input_digest},
            "split": {"eval_fraction": split.eval_fraction, "seed": split.seed, "method": "sha256-keyed row hash"},
            "config_sha256": hashlib.sha256(config.model_dump_json().encode()).hexdigest(),
            "seconds": round(time.monotonic() - started, 3),
            "throughput": progress.done(),
        }
        write_json(out / layout.PREPARED_MANIFEST.name, result)
    log.info("prepared %d train / %d eval rows into %d shard(s)", totals["train"], totals["eval"], len(outputs))
    return result
