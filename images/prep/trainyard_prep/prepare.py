"""prepare_data: pinned CSV / Parquet inputs -> deterministic train/eval TFRecord shards + schema, stats and manifest.

Streaming: files are read in chunks of `prep.rows_per_chunk` rows, so memory does not grow with the number of rows.
Deterministic: each row's split and shard come from a seeded hash of its content, so the output does not depend
on chunk size, file order or how many times the stage runs. Everything is written under a temporary sibling of
`<run>/prepared/` and renamed into place at the end.

Files are prepared in groups (`groups.py`): a group writes its part of every shard and each file's partial
statistics to `parts/prepare/<group>/`; `merge_prepared` concatenates the parts in group order and folds the
partials in manifest order, so shards, statistics and schema are the same bytes for any number of groups. A
one-pod run is one group merged in the same process (its parts renamed, not copied); with `prep.parallelism`
above 1 each group is a mapped task and merge_data merges them.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import time
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np
import pandas as pd

from trainyard_contract import artifacts, layout
from trainyard_contract.artifacts import PreparedManifest
from trainyard_contract.atomic import staged_dir, write_json
from trainyard_contract.runtime import StageError, log
from trainyard_contract.schema import DataConfig, Feature, Label, PipelineConfig
from trainyard_prep.encoding import ExampleEncoder
from trainyard_prep.groups import group_entries, load_group_parts, load_groups
from trainyard_prep.progress import Progress, combined_throughput
from trainyard_prep.readers import chunks_of_files, prefetched, text_columns
from trainyard_prep.tfrecord import TFRecordFile

HASH_BUCKETS = 10_000
PARTIALS = "partials.json"  # a group's per-file partial statistics and per-shard row counts
COPY_BLOCK = 8 << 20


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

    def state(self) -> dict[str, list[float]]:
        """Everything `fold` needs, as JSON (floats round-trip exactly)."""
        return {"count": self.count.tolist(), "missing": self.missing.tolist(), "mean": self.mean.tolist(),
                "m2": self.m2.tolist(), "min": self.min.tolist(), "max": self.max.tolist()}

    def fold(self, state: dict[str, list[float]]) -> None:
        """Merge in another instance's `state` (a file's partial statistics)."""
        self.missing += np.asarray(state["missing"], dtype=np.int64)
        self._merge(np.asarray(state["count"], dtype=np.float64), np.asarray(state["mean"], dtype=np.float64),
                    np.asarray(state["m2"], dtype=np.float64), np.asarray(state["min"], dtype=np.float64),
                    np.asarray(state["max"], dtype=np.float64))

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

    def state(self) -> dict[str, list[list[Any]]]:
        """Per feature, `[value, count]` pairs (JSON keeps an int an int and a string a string)."""
        return {name: [[_plain(value), int(count)] for value, count in counts.items()]
                for name, counts in self.counts.items()}

    def fold(self, state: dict[str, list[list[Any]]]) -> None:
        for name, pairs in state.items():
            counts = self.counts[name]
            for value, count in pairs:
                counts[value] += count

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


class FilePartials:
    """One input file's share of everything computed on the whole train split: statistics, vocabulary counts,
    label counts. Kept per file and folded in manifest order, the totals come out the same to the last bit however
    the files were grouped."""

    def __init__(self, config: PipelineConfig):
        data = config.data
        features = data.columns()
        self.stats = RunningStats([f.name for f in features if not f.is_categorical])
        self.label_stats = RunningStats([data.label.name])
        self.vocab = VocabularyCounter([f for f in features if f.is_categorical])
        classes = len(data.label.classes or [])
        self.label_counts = {"train": np.zeros(classes, dtype=np.int64), "eval": np.zeros(classes, dtype=np.int64)}

    def state(self, source: str, rows: int) -> dict[str, Any]:
        return {"source": source, "rows": rows, "stats": self.stats.state(), "label_stats": self.label_stats.state(),
                "vocab": self.vocab.state(), "label_counts": {k: v.tolist() for k, v in self.label_counts.items()}}

    def fold(self, state: dict[str, Any]) -> None:
        self.stats.fold(state["stats"])
        self.label_stats.fold(state["label_stats"])
        self.vocab.fold(state["vocab"])
        for name, counts in state["label_counts"].items():
            self.label_counts[name] += np.asarray(counts, dtype=np.int64)


def shard_paths(root: Path, data: DataConfig) -> dict[str, list[Path]]:
    """`<root>/<split>/part-i-of-n.tfrecord` for every shard of both splits."""
    return {split_name: [root / split_name / layout.shard_name(i, count) for i in range(count)]
            for split_name, count in (("train", data.shards.train), ("eval", data.shards.eval))}


def prepare_files(run_dir: Path, config: PipelineConfig, entries: list[dict[str, Any]], out: Path) -> dict[str, Any]:
    """Split, shard and encode one group of pinned files into `out/<split>/part-*.tfrecord` (this group's part of
    every shard), with each file's partial statistics in `out/partials.json`."""
    data = config.data
    features = data.columns()
    label = data.label
    numeric = [f.name for f in features if not f.is_categorical]
    classes = [str(c) for c in label.classes or []]
    class_index = {value: i for i, value in enumerate(classes)}
    read_columns = [f.name for f in features] + [label.name]
    stored = [(f.name, f.stored_dtype) for f in features] + [
        (label.name, "int" if label.task == "classification" else "float")]
    split = data.split
    text = text_columns(data)
    encoder = ExampleEncoder(stored)
    writers = shard_paths(out, data)
    shard_rows = {name: [0] * len(paths) for name, paths in writers.items()}
    with encoder.open_writers([p for paths in writers.values() for p in paths]) as sinks:
        progress = Progress("prepare")  # started once the shard files are open: rows/s of the work itself
        sink_of = {"train": sinks[: data.shards.train], "eval": sinks[data.shards.train :]}
        partials = [FilePartials(config) for _ in entries]  # statistics are kept per file (merge folds them)
        file_rows = [0] * len(entries)
        paths = [run_dir / entry["snapshot"] for entry in entries]
        stream = chunks_of_files(paths, config.prep.rows_per_chunk(len(read_columns)), read_columns, text,
                                 data.source_columns())
        for item in progress.timed("read", prefetched(stream)):
            if item.error is not None:
                raise item.error
            file, chunk, nbytes = item.file, item.frame, item.nbytes
            del item  # the chunk is dropped below, once cast
            source, partial = entries[file]["source"], partials[file]
            missing = [c for c in read_columns if c not in chunk.columns]
            if missing:
                raise StageError(f"{source}: missing column(s) {missing} (did validate_data run?)")
            with progress.phase("cast"):
                frame = typed_frame(chunk, data, class_index, source)
            rows = len(chunk)
            del chunk  # the typed frame is all that is needed: one chunk less in memory
            with progress.phase("hash_split"):
                is_eval, shard = split_and_shard(frame, split.seed, split.eval_fraction, data.shards.train,
                                                 data.shards.eval)
            with progress.phase("statistics"):
                add_train_statistics(partial, frame[~is_eval], numeric, label)
            for name, mask in (("train", ~is_eval), ("eval", is_eval)):
                if mask.any():
                    write_split(frame[mask], shard[mask], name, len(classes), label.name, partial, encoder,
                                sink_of[name], shard_rows[name], progress)
            progress.add(rows, nbytes)
            file_rows[file] += rows
        files = [partial.state(entry["source"], rows)
                 for partial, entry, rows in zip(partials, entries, file_rows, strict=True)]
        with progress.phase("write"):  # the writes still behind (tfrecord.WriteBehind) count as writing
            for sink in sinks:
                sink.flush()
        shard_sha256 = {name: [sink.sha256() for sink in group] for name, group in sink_of.items()}
    summary = {"files": files, "shard_rows": shard_rows, "shard_sha256": shard_sha256, "throughput": progress.done()}
    write_json(out / PARTIALS, summary)
    return summary


def add_train_statistics(partial: FilePartials, train_rows: pd.DataFrame, numeric: list[str], label: Label) -> None:
    """Fold a chunk's training rows into its file's partial statistics: numeric moments, vocabularies, and the
    label's moments for regression (eval rows never reach the statistics the model is normalised with)."""
    partial.stats.update(train_rows[numeric].to_numpy(dtype=np.float64))
    partial.vocab.update(train_rows)
    if label.task == "regression":
        partial.label_stats.update(train_rows[[label.name]].to_numpy(dtype=np.float64))


def write_split(part: pd.DataFrame, part_shards: np.ndarray, split: str, n_classes: int, label_name: str,
                partial: FilePartials, encoder: ExampleEncoder, sinks: list[TFRecordFile], rows_per_shard: list[int],
                progress: Progress) -> None:
    """Encode one split's rows of a chunk and append them to their shards' files, counting rows per shard and
    (for classification) per class."""
    if n_classes:
        partial.label_counts[split] += np.bincount(part[label_name].to_numpy(), minlength=n_classes)
    for index in np.unique(part_shards):
        with progress.phase("encode"):
            records = encoder.encode(part[part_shards == index])
        with progress.phase("write"):
            rows_per_shard[index] += sinks[index].write(records)


def join_files(sources: list[Path], target: Path) -> None:
    """`target` = the `sources` one after the other (a single source is renamed: no bytes copied). The copy is
    the kernel's (`copy_file_range`: no pass through this process, and a server-side copy on NFS 4.2 or a reflink
    where the filesystem has them), falling back to read-and-write where it is not supported."""
    target.parent.mkdir(parents=True, exist_ok=True)
    if len(sources) == 1:
        os.replace(sources[0], target)
        return
    with target.open("wb") as out:
        for source in sources:
            with source.open("rb") as handle:
                append(handle, out)


def append(handle: BinaryIO, out: BinaryIO) -> None:
    size = os.fstat(handle.fileno()).st_size
    copied = 0
    try:
        while copied < size:
            step = os.copy_file_range(handle.fileno(), out.fileno(), size - copied)
            if step == 0:
                break
            copied += step
    except OSError:  # not supported here (another filesystem, an old kernel): copy what is left ourselves
        pass
    if copied < size:
        handle.seek(copied)
        out.seek(0, os.SEEK_END)
        shutil.copyfileobj(handle, out, COPY_BLOCK)


def merge_prepared(run_dir: Path, config: PipelineConfig, manifest: dict[str, Any], parts: list[Path],
                   before_commit: Callable[[], None] | None = None) -> dict[str, Any]:
    """Join the groups' shard parts (in group order) into `prepared/`, fold their files' partial statistics (in
    manifest order) and write schema, statistics and manifest; the parts are removed once `prepared/` is in place.
    The bytes do not depend on how many groups there were. `before_commit` runs just before `prepared/` is
    renamed into place; if it raises, nothing is (merge_data waits there for the validation join). Bad input
    (StageError) also removes the parts: no retry can use them, and they hold a copy of every shard."""
    try:
        return _merge_prepared(run_dir, config, manifest, parts, before_commit)
    except StageError:
        shutil.rmtree(run_dir / layout.PREPARED_PARTS, ignore_errors=True)
        raise


@dataclass
class MergedFigures:
    """The groups' partial figures folded in file order: row counts per shard, train statistics, vocabularies."""

    groups: list[dict[str, Any]]
    totals_of: FilePartials
    shard_rows: dict[str, list[int]]
    totals: dict[str, int]
    feature_stats: dict[str, Any]
    vocabularies: dict[str, Any]
    regression_stats: dict[str, Any] | None


def _fold_groups(config: PipelineConfig, parts: list[Path]) -> MergedFigures:
    """Fold every group's per-file partials in manifest order; StageError when a split or a feature is empty."""
    data = config.data
    groups = load_group_parts(parts, PARTIALS, "prepare_data")
    totals_of = FilePartials(config)
    for group in groups:
        for state in group["files"]:
            totals_of.fold(state)
    shard_rows = {name: [sum(g["shard_rows"][name][i] for g in groups) for i in range(count)]
                  for name, count in (("train", data.shards.train), ("eval", data.shards.eval))}
    totals = {name: sum(counts) for name, counts in shard_rows.items()}
    if totals["train"] == 0 or totals["eval"] == 0:
        raise StageError(
            f"the split left {totals['train']} train and {totals['eval']} eval row(s); need both "
            f"(add rows or change data.split.eval_fraction={data.split.eval_fraction})"
        )
    feature_stats = totals_of.stats.as_dict()
    for name, entry_stats in feature_stats.items():
        if entry_stats["count"] == 0:
            raise StageError(f"numeric feature {name!r} has no values in the train split (every row is "
                             "missing): check the data, or remove the feature from data.features")
    label = data.label
    return MergedFigures(groups, totals_of, shard_rows, totals, feature_stats, totals_of.vocab.vocabularies(),
                         totals_of.label_stats.as_dict()[label.name] if label.task == "regression" else None)


def _join_shards(out: Path, data: DataConfig, parts: list[Path], merged: MergedFigures) -> list[dict[str, Any]]:
    """Each shard as the concatenation of its groups' parts, in group order; its rows, bytes and sha256."""
    writers = shard_paths(out, data)
    for name, paths in writers.items():
        for path in paths:
            join_files([part / name / path.name for part in parts], path)
    every = [path for paths in writers.values() for path in paths]
    written = merged.groups[0].get("shard_sha256") if len(merged.groups) == 1 else None
    if written is not None:  # the part was renamed into place: the digests taken as it was written hold
        digests = written["train"] + written["eval"]
    else:
        with ThreadPoolExecutor(max_workers=os.cpu_count() or 1) as pool:  # hashlib lets go of the GIL
            digests = list(pool.map(_file_digest, every))
    sha256_of = dict(zip(every, digests, strict=True))
    return [{"path": str(path.relative_to(out)), "split": name, "rows": merged.shard_rows[name][i],
             "bytes": path.stat().st_size, "sha256": sha256_of[path]}
            for name, paths in writers.items() for i, path in enumerate(paths)]


def _stats_document(config: PipelineConfig, merged: MergedFigures) -> dict[str, Any]:
    """`prepared/stats.json`: train-split statistics, vocabulary sizes and the label's distribution."""
    classes = [str(c) for c in config.data.label.classes or []]
    return {
        "rows": merged.totals, "computed_on": "train split", "features": merged.feature_stats,
        "categorical": {name: {k: v for k, v in entry.items() if k != "vocabulary"} | {
            "vocabulary_size": len(entry["vocabulary"])} for name, entry in merged.vocabularies.items()},
        "label_distribution": {name: dict(zip(classes, counts.tolist(), strict=True))
                               for name, counts in merged.totals_of.label_counts.items()} if classes else None,
        "label": merged.regression_stats,
    }


def _prepared_manifest(config: PipelineConfig, manifest: dict[str, Any], merged: MergedFigures,
                       outputs: list[dict[str, Any]], merge_seconds: float) -> dict[str, Any]:
    """`prepared/manifest.json` (and the stage's result): shards, rows, the inputs' and config's hashes, timings."""
    split, groups = config.data.split, merged.groups
    input_digest = hashlib.sha256("".join(f["sha256"] for f in manifest["files"]).encode()).hexdigest()
    throughput = combined_throughput([g["throughput"] for g in groups])
    throughput.setdefault("us_per_row", {})["merge"] = round(
        merge_seconds * 1e6 / max(sum(merged.totals.values()), 1), 3)
    return {
        "rows": merged.totals,
        "shards": outputs,
        "inputs": {"files": len(manifest["files"]), "bytes": manifest["total_bytes"], "sha256": input_digest},
        "split": {"eval_fraction": split.eval_fraction, "seed": split.seed, "method": "sha256-keyed row hash"},
        "config_sha256": hashlib.sha256(config.model_dump_json().encode()).hexdigest(),
        "groups": [{"files": len(g["files"]), "rows": sum(f["rows"] for f in g["files"]),
                    "seconds": g["throughput"]["seconds"]} for g in groups],
        "seconds": round(max(g["throughput"]["seconds"] for g in groups) + merge_seconds, 3),
        "throughput": throughput,
    }


def _merge_prepared(run_dir: Path, config: PipelineConfig, manifest: dict[str, Any], parts: list[Path],
                    before_commit: Callable[[], None] | None) -> dict[str, Any]:
    started = time.monotonic()
    merged = _fold_groups(config, parts)
    with staged_dir(run_dir / layout.PREPARED) as out:
        outputs = _join_shards(out, config.data, parts, merged)
        if before_commit is not None:
            before_commit()
        write_json(out / layout.PREPARED_SCHEMA.name, schema_document(config, merged.feature_stats,
                                                                     merged.vocabularies, merged.regression_stats))
        write_json(out / layout.PREPARED_STATS.name, _stats_document(config, merged))
        result = _prepared_manifest(config, manifest, merged, outputs, time.monotonic() - started)
        artifacts.write(out / layout.PREPARED_MANIFEST.name, PreparedManifest(**result))
    shutil.rmtree(run_dir / layout.PREPARED_PARTS, ignore_errors=True)  # every byte of it is in prepared/ now
    log.info("prepared %d train / %d eval rows into %d shard(s) from %d group(s)", merged.totals["train"],
             merged.totals["eval"], len(outputs), len(merged.groups))
    return result


def prepare_group(run_dir: Path, config: PipelineConfig, manifest: dict[str, Any], group: int) -> dict[str, Any]:
    """One mapped prepare_data task: file group `group` into `parts/prepare/<group>/` (merge_data joins them)."""
    entries = group_entries(manifest, load_groups(run_dir), group)
    with staged_dir(run_dir / layout.PREPARED_PARTS / layout.group_name(group)) as out:
        summary = prepare_files(run_dir, config, entries, out)
    return {"rows": sum(f["rows"] for f in summary["files"]), "files": len(entries)}


def prepare(run_dir: Path, config: PipelineConfig, manifest: dict[str, Any]) -> dict[str, Any]:
    """The one-pod prepare_data: every pinned file as one group, joined by the same merge a fanned-out run's
    merge_data does (the group's parts are renamed into place, not copied)."""
    part = run_dir / layout.PREPARED_PARTS / layout.group_name(0)
    with staged_dir(part) as out:
        prepare_files(run_dir, config, manifest["files"], out)
    try:
        return merge_prepared(run_dir, config, manifest, [part])
    except BaseException:
        shutil.rmtree(run_dir / layout.PREPARED_PARTS, ignore_errors=True)  # a retry prepares again anyway
        raise
