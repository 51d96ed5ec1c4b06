"""prepare_data: pinned CSV / Parquet inputs -> deterministic train/eval TFRecord shards + schema, stats and manifest.

Streaming: files are read in chunks of `prep.rows_per_chunk` rows, so memory does not grow with the number of rows.
Deterministic: each row's split and shard come from a seeded hash of its content, so the output does not depend
on chunk size, file order or how many times the stage runs. Everything is written under a temporary sibling of
`<run>/prepared/` and renamed into place at the end.
"""

from __future__ import annotations

import hashlib
import time
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from trainyard_contract import layout
from trainyard_contract.atomic import staged_dir, write_json
from trainyard_contract.runtime import Progress, StageError, log
from trainyard_contract.schema import DataConfig, Feature, PipelineConfig
from trainyard_prep.encoding import ExampleEncoder
from trainyard_prep.readers import prefetched, read_chunks, text_columns

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
    """Streaming count / mean / variance (Chan's parallel merge) / min / max per numeric column; missing values
    (NaN, in nullable columns) are counted apart and left out of the moments."""

    def __init__(self, columns: list[str]):
        self.columns = columns
        k = len(columns)
        self.count = np.zeros(k)
        self.missing = np.zeros(k, dtype=np.int64)
        self.mean = np.zeros(k)
        self.m2 = np.zeros(k)
        self.min = np.full(k, np.inf)
        self.max = np.full(k, -np.inf)

    def update(self, values: np.ndarray) -> None:
        if values.shape[0] == 0 or values.shape[1] == 0:
            return
        if not np.isnan(values.sum(axis=0)).any():  # no missing value (the common case): fewer passes
            self._merge(values.shape[0], values.mean(axis=0), values.var(axis=0) * values.shape[0],
                        values.min(axis=0), values.max(axis=0))
            return
        present = ~np.isnan(values)
        n = present.sum(axis=0).astype(np.float64)
        self.missing += (~present).sum(axis=0)
        filled = np.where(present, values, 0.0)
        with np.errstate(invalid="ignore", divide="ignore"):
            batch_mean = np.where(n > 0, filled.sum(axis=0) / np.maximum(n, 1), 0.0)
            batch_m2 = (np.where(present, values - batch_mean, 0.0) ** 2).sum(axis=0)
        self._merge(n, batch_mean, batch_m2, np.where(present, values, np.inf).min(axis=0),
                    np.where(present, values, -np.inf).max(axis=0))

    def _merge(self, n: np.ndarray | int, batch_mean: np.ndarray, batch_m2: np.ndarray, low: np.ndarray,
               high: np.ndarray) -> None:
        """Chan's parallel merge of a batch's count, mean, sum of squared deviations, min and max."""
        total = self.count + n
        delta = batch_mean - self.mean
        safe = np.maximum(total, 1)
        self.mean = np.where(total > 0, self.mean + delta * n / safe, 0.0)
        self.m2 = self.m2 + batch_m2 + delta**2 * self.count * n / safe
        self.count = total
        self.min = np.minimum(self.min, low)
        self.max = np.maximum(self.max, high)

    def as_dict(self) -> dict[str, Any]:
        out = {}
        for i, name in enumerate(self.columns):
            seen = int(self.count[i])
            out[name] = {"count": seen, "missing": int(self.missing[i]),
                         "mean": float(self.mean[i]) if seen else None,
                         "std": float(np.sqrt(self.m2[i] / seen)) if seen else None,
                         "min": float(self.min[i]) if seen else None, "max": float(self.max[i]) if seen else None}
        return out


class VocabularyCounter:
    """Value counts of the categorical features on the train split; the vocabularies are built from them."""

    def __init__(self, features: list[Feature]):
        self.features = features
        self.counts: dict[str, Counter[Any]] = {f.name: Counter() for f in features}

    def update(self, frame: pd.DataFrame) -> None:
        for feature in self.features:
            column = frame[feature.name]
            if feature.dtype == "string":
                column = column[column != ""]  # a missing value is out of vocabulary, never a category
            self.counts[feature.name].update(column.value_counts(sort=False).to_dict())

    def vocabularies(self) -> dict[str, dict[str, Any]]:
        """Per feature: its vocabulary (most frequent first, ties by value), what was left out, and the OOV
        buckets. A feature with fewer than two values in the train split carries no information: an error."""
        out = {}
        for feature in self.features:
            counts = self.counts[feature.name]
            rules = feature.vocab
            if len(counts) < 2:
                only = f"only the value {next(iter(counts))!r}" if counts else "no values"
                raise StageError(
                    f"categorical feature {feature.name!r} has {only} in the train split: it carries no "
                    f"information. Check the data, or remove the feature from data.features")
            kept = sorted((item for item in counts.items() if item[1] >= rules.min_count),
                          key=lambda item: (-item[1], str(item[0])))[: rules.max_size]
            vocabulary = [_plain(value) for value, _ in kept]
            out[feature.name] = {"vocabulary": vocabulary, "oov_buckets": rules.oov_buckets,
                                 "distinct_in_train": len(counts),
                                 "out_of_vocabulary_rows": int(sum(counts.values()) - sum(c for _, c in kept))}
        return out


def _plain(value: Any) -> Any:
    return value.item() if hasattr(value, "item") else value


def class_indices(values: pd.Series, class_index: dict[str, int]) -> pd.Series:
    """Each label's class index (NaN where it is not a class). Classes are named as text in `class_index`; an
    int-typed column is looked up by its distinct values, so there is no str() per row."""
    if values.dtype.kind in "iu":
        distinct = pd.unique(values)
        by_value = {value: class_index.get(str(value)) for value in distinct.tolist()}
        return values.map({k: v for k, v in by_value.items() if v is not None})
    return values.astype(str).map(class_index)


def typed_frame(chunk: pd.DataFrame, data: DataConfig, class_index: dict[str, int], source: str) -> pd.DataFrame:
    """The chunk in the stored dtypes, label last: float64 / int64 / str (missing text is ""), the label as its
    class index (classification) or float64 value. Split hashes, statistics and shards all read this frame, so
    a CSV and a Parquet file of the same table give the same bytes."""
    out: dict[str, Any] = {}
    for feature in data.columns():
        column = chunk[feature.name]
        try:
            if feature.stored_dtype == "string":
                text = column.astype(object)
                out[feature.name] = text.where(text.notna(), "").map(str)
            elif feature.stored_dtype == "int":
                out[feature.name] = pd.to_numeric(column).astype(np.int64)
            else:
                out[feature.name] = pd.to_numeric(column).astype(np.float64)
        except (ValueError, TypeError) as exc:
            raise StageError(f"{source}: column {feature.name!r} is not {feature.stored_dtype}: {exc} "
                             "(did validate_data run?)") from None
    label = data.label
    values = chunk[label.name]
    if label.task == "classification":
        index = class_indices(values, class_index)
        if index.isna().any():
            bad = values[index.isna()].iloc[0]
            raise StageError(f"{source}: label {_plain(bad)!r} is not in data.label.classes")
        out[label.name] = index.astype(np.int64)
    else:
        out[label.name] = pd.to_numeric(values).astype(np.float64)
    return pd.DataFrame(out, index=chunk.index)


def schema_document(config: PipelineConfig, stats: dict[str, Any], vocabularies: dict[str, Any],
                    label_stats: dict[str, Any] | None) -> dict[str, Any]:
    """What the trainer and evaluator need: each feature's stored dtype, kind, its imputation value (nullable
    numeric: the train mean) or vocabulary (categorical), and the label's task and classes or train statistics."""
    data = config.data
    features = []
    for f in data.columns():
        entry: dict[str, Any] = {"name": f.name, "dtype": f.stored_dtype, "source_dtype": f.dtype, "shape": [],
                                 "kind": "categorical" if f.is_categorical else "numeric", "nullable": f.nullable}
        if f.is_categorical:
            entry.update(vocabularies[f.name])
        else:
            entry["impute"] = stats[f.name]["mean"] if f.nullable else None
        features.append(entry)
    label = data.label
    document = {"format": "tfrecord/tf.train.Example", "task": label.task, "features": features}
    if label.task == "classification":
        document["label"] = {"name": label.name, "dtype": "int", "encoding": "class_index",
                             "classes": list(label.classes or [])}
    else:
        document["label"] = {"name": label.name, "dtype": "float", "encoding": "value", "min": label.min,
                             "max": label.max, "stats": label_stats}
    return document


def _file_digest(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        while block := handle.read(1 << 20):
            digest.update(block)
    return digest.hexdigest()


def prepare(run_dir: Path, config: PipelineConfig, manifest: dict[str, Any]) -> dict[str, Any]:
    data = config.data
    features = data.columns()
    label = data.label
    numeric = [f.name for f in features if not f.is_categorical]
    categorical = [f for f in features if f.is_categorical]
    classes = [str(c) for c in label.classes or []]
    class_index = {value: i for i, value in enumerate(classes)}
    read_columns = [f.name for f in features] + [label.name]
    stored = [(f.name, f.stored_dtype) for f in features] + [
        (label.name, "int" if label.task == "classification" else "float")]
    split = data.split
    stats = RunningStats(numeric)
    label_stats = RunningStats([label.name])
    vocab = VocabularyCounter(categorical)
    label_counts = {"train": np.zeros(len(classes), dtype=np.int64), "eval": np.zeros(len(classes), dtype=np.int64)}
    text = text_columns(data)
    started = time.monotonic()
    with staged_dir(run_dir / layout.PREPARED) as out:
        encoder = ExampleEncoder(stored)
        writers = {
            split_name: [out / split_name / layout.shard_name(i, count) for i in range(count)]
            for split_name, count in (("train", data.shards.train), ("eval", data.shards.eval))
        }
        shard_rows = {name: [0] * len(paths) for name, paths in writers.items()}
        with encoder.open_writers([p for paths in writers.values() for p in paths]) as sinks:
            progress = Progress("prepare")  # started once the shard files are open: rows/s of the work itself
            sink_of = {"train": sinks[: data.shards.train], "eval": sinks[data.shards.train :]}
            for entry in manifest["files"]:
                path = run_dir / entry["snapshot"]
                chunks = read_chunks(path, config.prep.rows_per_chunk(len(read_columns)), read_columns, text)
                for chunk, nbytes in progress.timed("read", prefetched(chunks)):
                    missing = [c for c in read_columns if c not in chunk.columns]
                    if missing:
                        raise StageError(f"{entry['source']}: missing column(s) {missing} (did validate_data run?)")
                    with progress.phase("cast"):
                        frame = typed_frame(chunk, data, class_index, entry["source"])
                    rows = len(chunk)
                    del chunk  # the typed frame is all that is needed: one chunk less in memory
                    with progress.phase("hash_split"):
                        is_eval, shard = split_and_shard(frame, split.seed, split.eval_fraction, data.shards.train,
                                                         data.shards.eval)
                    with progress.phase("statistics"):
                        train_rows = frame[~is_eval]
                        stats.update(train_rows[numeric].to_numpy(dtype=np.float64))
                        vocab.update(train_rows)
                        if label.task == "regression":
                            label_stats.update(train_rows[[label.name]].to_numpy(dtype=np.float64))
                    for name, mask in (("train", ~is_eval), ("eval", is_eval)):
                        if not mask.any():
                            continue
                        part = frame[mask]
                        part_shards = shard[mask]
                        if classes:
                            label_counts[name] += np.bincount(part[label.name].to_numpy(), minlength=len(classes))
                        for index in np.unique(part_shards):
                            with progress.phase("encode"):
                                records = encoder.encode(part[part_shards == index])
                            with progress.phase("write"):
                                shard_rows[name][index] += sink_of[name][index].write(records)
                    progress.add(rows, nbytes)
        totals = {name: sum(counts) for name, counts in shard_rows.items()}
        if totals["train"] == 0 or totals["eval"] == 0:
            raise StageError(
                f"the split left {totals['train']} train and {totals['eval']} eval row(s); need both "
                f"(add rows or change data.split.eval_fraction={split.eval_fraction})"
            )
        feature_stats = stats.as_dict()
        for name, entry_stats in feature_stats.items():
            if entry_stats["count"] == 0:
                raise StageError(f"numeric feature {name!r} has no values in the train split (every row is "
                                 "missing): check the data, or remove the feature from data.features")
        outputs = [
            {"path": str(path.relative_to(out)), "split": name, "rows": shard_rows[name][i],
             "bytes": path.stat().st_size, "sha256": _file_digest(path)}
            for name, paths in writers.items() for i, path in enumerate(paths)
        ]
        vocabularies = vocab.vocabularies()
        regression_stats = label_stats.as_dict()[label.name] if label.task == "regression" else None
        schema = schema_document(config, feature_stats, vocabularies, regression_stats)
        write_json(out / layout.PREPARED_SCHEMA.name, schema)
        write_json(out / layout.PREPARED_STATS.name, {
            "rows": totals, "computed_on": "train split", "features": feature_stats,
            "categorical": {name: {k: v for k, v in entry.items() if k != "vocabulary"} | {
                "vocabulary_size": len(entry["vocabulary"])} for name, entry in vocabularies.items()},
            "label_distribution": {name: dict(zip(classes, counts.tolist(), strict=True))
                                   for name, counts in label_counts.items()} if classes else None,
            "label": regression_stats,
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
