"""The typed schema a model module's `build_model(params, schema)` receives. Pure Python (no TensorFlow).

Built from the prepared `schema.json` (vocabularies and train statistics as prepare measured them), or from the
config alone (`from_config`: placeholder vocabularies and unit statistics) so `trainyard check` can build the
model before any data exists.

What the model is called with (`trainyard_trainer.features.FeatureTransform` makes it, in training, evaluation
and inside the exported SavedModel alike):
- `"numeric"`: float32 `[batch, len(schema.numeric)]`, the numeric features in schema order, missing values of
  nullable features already replaced by the train mean (absent when there are no numeric features);
- one int64 `[batch]` entry per categorical feature, by name: ids in `[0, feature.size)`, where ids below
  `oov_buckets` are out-of-vocabulary buckets and `oov_buckets + i` is `vocabulary[i]`.
It returns logits `[batch, num_classes]` (classification) or predictions `[batch]` / `[batch, 1]` (regression).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from trainyard_contract.runtime import StageError

NUMERIC_INPUT = "numeric"
PLACEHOLDER_VOCABULARY = 50  # categories per feature when `check` builds a model before any data exists: enough that
# a model with a hard-coded, too small vocabulary (an Embedding of 4 rows) fails there, not in training


@dataclass(frozen=True)
class NumericFeature:
    name: str
    dtype: str  # the serving dtype: float or int
    nullable: bool
    mean: float
    std: float
    min: float | None
    max: float | None
    impute: float | None  # the value a missing one becomes (the train mean), None when not nullable


@dataclass(frozen=True)
class CategoricalFeature:
    name: str
    dtype: str  # string or int
    vocabulary: tuple[Any, ...]
    oov_buckets: int

    @property
    def size(self) -> int:
        """How many ids the feature takes: out-of-vocabulary buckets plus the vocabulary."""
        return self.oov_buckets + len(self.vocabulary)


@dataclass(frozen=True)
class LabelInfo:
    name: str
    task: str  # classification or regression
    classes: tuple[Any, ...] = ()
    mean: float = 0.0  # regression: train split statistics of the label
    std: float = 1.0
    min: float | None = None
    max: float | None = None


@dataclass(frozen=True)
class ModelSchema:
    task: str
    numeric: tuple[NumericFeature, ...]
    categorical: tuple[CategoricalFeature, ...]
    label: LabelInfo
    order: tuple[str, ...]  # every feature name in config order

    @property
    def is_classification(self) -> bool:
        return self.task == "classification"

    @property
    def num_classes(self) -> int:
        return len(self.label.classes)

    @property
    def output_units(self) -> int:
        """Logits per class, or one prediction."""
        return self.num_classes if self.is_classification else 1

    @property
    def feature_names(self) -> list[str]:
        return list(self.order)

    @classmethod
    def from_document(cls, document: dict[str, Any]) -> ModelSchema:
        """From the prepared `schema.json`."""
        numeric, categorical = [], []
        for f in document["features"]:
            if f.get("kind", "numeric") == "categorical":
                categorical.append(CategoricalFeature(f["name"], f["dtype"], tuple(f["vocabulary"]),
                                                      int(f["oov_buckets"])))
            else:
                stats = f.get("stats") or {}
                numeric.append(NumericFeature(
                    f["name"], f["dtype"], bool(f.get("nullable")), float(stats.get("mean") or 0.0),
                    float(stats.get("std") or 1.0), stats.get("min"), stats.get("max"), f.get("impute")))
        label = document["label"]
        task = document.get("task", "classification")
        if task == "classification":
            info = LabelInfo(label["name"], task, tuple(label["classes"]))
        else:
            stats = label.get("stats") or {}
            info = LabelInfo(label["name"], task, (), float(stats.get("mean") or 0.0),
                             float(stats.get("std") or 1.0), label.get("min"), label.get("max"))
        return cls._checked(task, numeric, categorical, info, [f["name"] for f in document["features"]])

    @classmethod
    def from_config(cls, config: Any) -> ModelSchema:
        """What the schema will look like, from the config alone (for `trainyard check`): a categorical
        feature's vocabulary is its `allowed` values, else placeholders; numeric statistics are unit."""
        numeric, categorical = [], []
        for f in config.data.columns():
            if f.is_categorical:
                values = tuple(f.allowed) if f.allowed else tuple(
                    (f"value_{i}" if f.dtype == "string" else i) for i in range(PLACEHOLDER_VOCABULARY))
                categorical.append(CategoricalFeature(f.name, f.dtype, values, f.vocab.oov_buckets))
            else:
                low, high = f.min, f.max
                mean = (low + high) / 2 if low is not None and high is not None else 0.0
                numeric.append(NumericFeature(f.name, f.stored_dtype, f.nullable, mean, 1.0, low, high,
                                              mean if f.nullable else None))
        label = config.data.label
        info = LabelInfo(label.name, label.task, tuple(label.classes or ()), min=label.min, max=label.max)
        return cls._checked(label.task, numeric, categorical, info, [f.name for f in config.data.columns()])

    @classmethod
    def _checked(cls, task: str, numeric: list[NumericFeature], categorical: list[CategoricalFeature],
                 label: LabelInfo, order: list[str]) -> ModelSchema:
        if any(f.name == NUMERIC_INPUT for f in categorical):
            raise StageError(f"a categorical feature may not be named {NUMERIC_INPUT!r}: the model's input of that "
                             "name holds the numeric features")
        return cls(task, tuple(numeric), tuple(categorical), label, tuple(order))


def schema_with_stats(document: dict[str, Any], stats: dict[str, Any]) -> dict[str, Any]:
    """The prepared schema document with each numeric feature's train statistics attached."""
    features = [dict(f, stats=stats.get(f["name"])) if f.get("kind", "numeric") == "numeric" else f
                for f in document["features"]]
    return {**document, "features": features}
