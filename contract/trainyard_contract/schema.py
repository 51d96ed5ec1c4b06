"""The pipeline config schema: one frozen, strict pydantic model per section of `pipelines_config/*.yaml`.

Everything a stage needs to know comes from here, so scheduling facts (pools, GPU tiers, resources) live in the
config and not in code. Unknown keys are errors (`extra="forbid"`), so a typo never silently falls back to a
default. This module imports only pydantic: the stage images import it too.
"""

from __future__ import annotations

import datetime as dt
import re
from functools import cached_property
from typing import Annotated, Any, Literal, get_args

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Discriminator,
    Field,
    StringConstraints,
    Tag,
    field_validator,
    model_validator,
)

from trainyard_contract.metrics import DEFAULT_METRICS, METRICS, impossible_bound

IDENTIFIER = r"^[A-Za-z_][A-Za-z0-9_]*$"
PIPELINE_NAME = r"^[a-z][a-z0-9_-]{0,50}$"
K8S_NAME = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"
QUANTITY = r"^[0-9]+(\.[0-9]+)?(m|k|Ki|Mi|Gi|Ti|M|G|T)?$"
SCHEDULE_PRESETS = {"@once", "@continuous", "@hourly", "@daily", "@weekly", "@monthly", "@quarterly", "@yearly"}

Identifier = Annotated[str, StringConstraints(pattern=IDENTIFIER)]
K8sName = Annotated[str, StringConstraints(pattern=K8S_NAME, max_length=63)]
Quantity = Annotated[str, StringConstraints(pattern=QUANTITY)]
# A data file's own column name (mapped to an identifier by `source_column`): any text but a comma (CSV headers
# are read by splitting on commas) or a control character, and not only spaces.
SOURCE_COLUMN_MAX = 255
SourceColumn = Annotated[str, StringConstraints(pattern=r"^[^,\x00-\x1f]*[^,\s][^,\x00-\x1f]*$",
                                                max_length=SOURCE_COLUMN_MAX)]
# A registry host (and port) with an optional path: registry.example.com/ml, localhost:5000
RegistryPrefix = Annotated[str, StringConstraints(
    pattern=r"^[a-z0-9]([a-z0-9.-]*[a-z0-9])?(:[0-9]{1,5})?(/[a-z0-9]+([._-][a-z0-9]+)*)*$", max_length=200)]
OWN_IMAGES = "trainyard/"  # the repositories `make images` builds (images/<stage>/Dockerfile headers)
ImageRef = Annotated[str, StringConstraints(pattern=r"^[a-z0-9][a-z0-9._/:@-]*$", max_length=255)]
PoolName = Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9_.-]+$", max_length=256)]


# A model validator that blames one sub-field starts its message with "@sub.field: "; the loader moves the error
# there, so it reads `training.workers.replicas: ...` at that line instead of `training: ...`.


def shared(default: BaseModel) -> Any:
    """A frozen section used as a default without copying it: pydantic deep-copies plain model defaults on every
    validation, which was most of the parse-time cost of a DAG (see bench/parse_bench.py)."""
    return Field(default_factory=lambda: default)


class Strict(BaseModel):
    """Base of every config section: unknown keys are errors and loaded configs cannot be mutated."""

    model_config = ConfigDict(extra="forbid", frozen=True)


def check_volume_path(value: str) -> str:
    """A path inside the shared volume: relative, no `..`, no empty parts."""
    if not value or value.startswith("/") or re.match(r"^[A-Za-z]:", value):
        raise ValueError(f"must be a path relative to the shared volume root, not absolute (got {value!r})")
    parts = value.replace("\\", "/").split("/")
    if ".." in parts:
        raise ValueError(f"must stay inside the shared volume: '..' is not allowed (got {value!r})")
    if any(part in ("", ".") for part in parts):
        raise ValueError(f"must be a clean relative path without empty or '.' parts (got {value!r})")
    return value


VolumePath = Annotated[str, AfterValidator(check_volume_path)]


class Resources(Strict):
    """Kubernetes requests (and optional limits); `gpu` is a count of `nvidia.com/gpu`."""

    cpu: Quantity = "500m"
    memory: Quantity = "1Gi"
    cpu_limit: Quantity | None = None
    memory_limit: Quantity | None = None
    gpu: int = Field(0, ge=0, le=16)


EnvName = Annotated[str, StringConstraints(pattern=r"^[A-Za-z_][A-Za-z0-9_]*$", max_length=128)]
# What Trainyard itself sets in every stage process: a stage's `runtime.env` cannot replace it.
RESERVED_ENV = ("TF_CONFIG", "TF_GRPC_DEFAULT_OPTIONS", "PYTHONUNBUFFERED")
RESERVED_ENV_PREFIX = "TRAINYARD_"


class StageRuntime(Strict):
    """Where a stage's pods run, the same shape in every stage section (`prep`, `training`, `evaluation`,
    `deploy`): the image, the Kubernetes resources, and environment variables for the code in it (your model
    module's settings, a proxy, a thread count). Each section's subclass gives its own defaults."""

    image: ImageRef
    resources: Resources = shared(Resources())
    env: dict[EnvName, str] = Field({}, description="extra environment variables of every pod of the stage (on "
                                    "both backends); secrets belong in kubernetes.secrets, not here")

    @field_validator("env")
    @classmethod
    def _not_reserved(cls, env: dict[str, str]) -> dict[str, str]:
        for name in env:
            if name in RESERVED_ENV or name.startswith(RESERVED_ENV_PREFIX):
                raise ValueError(f"@{name}: set by Trainyard itself in every stage process; choose another name")
        return env


class PrepRuntime(StageRuntime):
    image: ImageRef = "trainyard/prep:0.1.0"
    resources: Resources = shared(Resources(cpu="1", memory="2Gi"))


class TrainingRuntime(StageRuntime):
    """The training job's image and env (every replica), and the chief's resources (ps and workers have theirs)."""

    image: ImageRef = "trainyard/trainer:0.1.0"
    resources: Resources = shared(Resources(cpu="1", memory="2Gi"))


class EvaluationRuntime(StageRuntime):
    image: ImageRef = "trainyard/evaluate:0.1.0"  # the trainer's package on a CPU base
    resources: Resources = shared(Resources(cpu="1", memory="2Gi"))


class DeployRuntime(StageRuntime):
    """The deploy step's pod (not TF Serving's: that is `deploy.image` and `deploy.resources`)."""

    image: ImageRef = "trainyard/serving:0.1.0"
    resources: Resources = shared(Resources(cpu="500m", memory="2Gi"))


class Vocabulary(Strict):
    """How prepare builds a categorical feature's vocabulary from the train split."""

    min_count: int = Field(1, ge=1, description="values seen fewer times are out of vocabulary")
    max_size: int = Field(10_000, ge=1, le=1_000_000, description="keep the most frequent values")
    oov_buckets: int = Field(1, ge=1, le=1000, description="ids for values outside the vocabulary (hashed)")


class Feature(Strict):
    """One input column. With `count: N` the name holds `{i}` and expands to N columns (pixel_{i} -> pixel_0..).

    `kind`: numeric (float or int) or categorical (string or int), default by dtype (string is categorical).
    A nullable numeric feature is imputed with the train split's mean; a missing categorical value is out of
    vocabulary. Both happen inside the exported model, so serving takes the raw value.
    """

    name: str = Field(pattern=r"^[A-Za-z_][A-Za-z0-9_{}]*$")
    dtype: Literal["float", "int", "string"] = "float"
    kind: Literal["numeric", "categorical"] | None = None
    vocabulary: Vocabulary | None = None
    min: float | None = None
    max: float | None = None
    allowed: list[str | int] | None = Field(None, min_length=1)
    nullable: bool = False
    count: int | None = Field(None, ge=1, le=100_000)
    source_column: SourceColumn | None = Field(
        None, description="the column's name in the data files when it is not an identifier (`od280/od315`, "
        "`sepal length (cm)`): validate and prepare read it under this name; `name` is what the model and "
        "serving call it")

    @model_validator(mode="after")
    def _check(self) -> Feature:
        if self.source_column is not None and self.count is not None:
            raise ValueError("@source_column: a feature with `count` expands to several columns; give each its "
                             "own entry to map a source column")
        if self.count is None and "{i}" in self.name:
            raise ValueError("a name with '{i}' needs 'count' (how many columns it expands to)")
        if self.count is not None and "{i}" not in self.name:
            raise ValueError("'count' needs a name containing '{i}', e.g. 'pixel_{i}'")
        if self.min is not None and self.max is not None and self.min > self.max:
            raise ValueError(f"min ({self.min}) is greater than max ({self.max})")
        if self.dtype == "string" and (self.min is not None or self.max is not None):
            raise ValueError("min/max apply to numeric features; use 'allowed' for strings")
        if self.dtype == "string" and self.kind == "numeric":
            raise ValueError("@kind: a string feature is categorical (or declare dtype float/int)")
        if self.dtype == "float" and self.kind == "categorical":
            raise ValueError("@kind: a float feature cannot be categorical (use dtype int or string)")
        if self.vocabulary is not None and not self.is_categorical:
            raise ValueError("@vocabulary: only a categorical feature has a vocabulary (kind: categorical)")
        if self.is_categorical and self.dtype == "int" and self.nullable:
            raise ValueError("@nullable: an int categorical feature cannot be nullable; declare it dtype string "
                             "(a missing value is then out of vocabulary)")
        return self

    @property
    def is_categorical(self) -> bool:
        return self.kind == "categorical" or (self.kind is None and self.dtype == "string")

    @property
    def vocab(self) -> Vocabulary:
        return self.vocabulary or DEFAULT_VOCABULARY

    @property
    def stored_dtype(self) -> Literal["float", "int", "string"]:
        """The dtype in the prepared shards and the serving signature: a nullable int is float (NaN = missing)."""
        return "float" if self.dtype == "int" and self.nullable else self.dtype

    def expand(self) -> list[Feature]:
        """The concrete columns this entry stands for."""
        if self.count is None:
            return [self]
        fields = self.model_dump(exclude={"name", "count", "vocabulary"})
        # already validated as a whole: build the copies without validating each again (cheap at parse time)
        return [Feature.model_construct(name=self.name.replace("{i}", str(i)), count=None,
                                        vocabulary=self.vocabulary, **fields)
                for i in range(self.count)]


DEFAULT_VOCABULARY = Vocabulary()


class Label(Strict):
    """The target column. Classification: `classes` lists the labels (int or string); regression
    (`task: regression`, a float label): optional `min`/`max` bounds. Given classes imply classification."""

    name: Identifier
    source_column: SourceColumn | None = Field(None, description="the label's column name in the data files, "
                                               "when it is not an identifier")
    task: Literal["classification", "regression"]
    dtype: Literal["int", "string", "float"]
    classes: list[int | str] | None = Field(None, min_length=2)
    allow_missing_classes: bool = Field(False, description="let a run whose data lacks a configured class go on")
    min: float | None = None
    max: float | None = None

    @model_validator(mode="before")
    @classmethod
    def _infer_task(cls, value: Any) -> Any:
        if not isinstance(value, dict):
            return value
        value = dict(value)
        if "task" not in value:
            if value.get("classes") is not None:
                value["task"] = "classification"
            elif value.get("dtype") == "float":
                value["task"] = "regression"
            else:
                raise ValueError("say what is predicted: `classes: [...]` (classification) or `task: regression`")
        if "dtype" not in value:
            value["dtype"] = "float" if value["task"] == "regression" else "int"
        return value

    @model_validator(mode="after")
    def _check(self) -> Label:
        if self.task == "classification":
            if self.classes is None:
                raise ValueError("@classes: a classification label needs its classes, e.g. classes: [0, 1]")
            if self.dtype == "float":
                raise ValueError("@dtype: a classification label is int or string (a float label is regression)")
            if self.min is not None or self.max is not None:
                raise ValueError("min/max bound a regression label; a classification label has classes")
            if len({str(c) for c in self.classes}) != len(self.classes):
                raise ValueError("@classes: a class is listed twice")
            if self.dtype == "int" and not all(isinstance(c, int) for c in self.classes):
                raise ValueError("@classes: an int label's classes are integers (or set dtype: string)")
        else:
            if self.classes is not None:
                raise ValueError("@classes: a regression label has no classes (remove them, or task: classification)")
            if self.dtype == "string":
                raise ValueError("@dtype: a regression label is a number (float or int)")
            if self.min is not None and self.max is not None and self.min > self.max:
                raise ValueError(f"min ({self.min}) is greater than max ({self.max})")
        return self

    @property
    def num_classes(self) -> int:
        return len(self.classes or [])


class Window(Strict):
    """Which partitions a run reads: the `days` before its data interval end. No window: every partition."""

    days: int = Field(ge=1, le=3650)


class Split(Strict):
    """Deterministic train/eval split by a hash of each row's content (stable across re-runs and re-orderings)."""

    eval_fraction: float = Field(0.2, gt=0, lt=1)
    seed: int = Field(42, ge=0)


class Shards(Strict):
    train: int = Field(4, ge=1, le=4096)
    eval: int = Field(1, ge=1, le=4096)


class Expectations(Strict):
    """Table-level expectations; column-level ones come from `features` (types, ranges, allowed values, nulls)."""

    min_rows: int = Field(1, ge=1)
    max_rows: int | None = Field(None, ge=1)


class DataConfig(Strict):
    source: VolumePath = Field(
        description="folder on the shared volume holding `<partition_key>=YYYY-MM-DD/` partitions")
    format: Literal["csv", "parquet"] = Field(
        "csv", description="csv (a header line) or parquet; each partition's files end in .csv / .parquet")
    partition_key: Identifier = "date"
    symlinks: Literal["refuse", "copy"] = Field(
        "refuse", description="a symbolic link in the dataset folder (a partition or a file) may point outside the "
        "volume, and what it points to may change after the run pinned it: `refuse` (the run fails, naming the "
        "link) or `copy` (what it points to is copied into the run's inputs and hashed as what it really is)")
    window: Window | None = None
    label: Label
    features: list[Feature] = Field(min_length=1)
    expectations: Expectations = shared(Expectations())
    split: Split = shared(Split())
    shards: Shards = shared(Shards())

    @model_validator(mode="after")
    def _unique_columns(self) -> DataConfig:
        names = self.column_names()
        seen: set[str] = {self.label.name}
        for name in names:
            if name in seen:
                raise ValueError(f"column {name!r} is defined twice (features and label must be distinct)")
            seen.add(name)
        mapped = self.source_columns()
        read: dict[str, str] = {}
        for name in [*names, self.label.name]:
            source = mapped.get(name, name)
            if source in read:
                raise ValueError(f"source column {source!r} is read twice (by {read[source]!r} and {name!r}); "
                                 "each column of the files maps to one feature or the label")
            read[source] = name
        return self

    def source_columns(self) -> dict[str, str]:
        """{served name: the data files' column name} for the feature and label columns mapped by
        `source_column`; every other column is read under its own name."""
        return {entry.name: entry.source_column for entry in [*self.features, self.label]
                if entry.source_column is not None}

    def column_names(self) -> list[str]:
        """Feature column names, `count` entries expanded; cheap (no Feature objects), for parse-time use."""
        return [
            name for f in self.features
            for name in ([f.name] if f.count is None else [f.name.replace("{i}", str(i)) for i in range(f.count)])
        ]

    @cached_property
    def _columns(self) -> tuple[Feature, ...]:
        return tuple(column for feature in self.features for column in feature.expand())

    def columns(self) -> list[Feature]:
        """Every feature column, with `count` entries expanded (computed once per config)."""
        return list(self._columns)


# Automatic chunks of prepare: about 64 MB of float64 cells, 200k to 1M rows (prepare holds a chunk and its
# encodings; its costs are per row, so larger chunks buy nothing).
CHUNK_CELLS = 8_000_000
CHUNK_ROWS_RANGE = (200_000, 1_000_000)
# Automatic chunks of validate: each is one Great Expectations validation, whose fixed cost (building the metric
# graph: ~4.5 ms per expectation) equals its per-row work at about 1.4M rows whatever the columns (both grow with
# the expectations), so wide tables get chunks of up to 256 MB of float64 cells rather than prepare's 64 MB (at 64
# features 492k rows, not 200k), and at most 500k rows: 1M-row chunks saved a further ~15% of validate's time at
# 16 features but held twice the memory (the stage holds its chunk and the next one, read ahead).
VALIDATION_CELLS = 32_000_000
VALIDATION_ROWS_RANGE = (200_000, 500_000)


MAX_PREP_GROUPS = 64


class PrepConfig(Strict):
    runtime: PrepRuntime = shared(PrepRuntime())  # every data-stage pod
    chunk_rows: int | None = Field(
        None, ge=100, le=5_000_000, description="rows per chunk read, validated and written; default: for "
        "prepare about 8M cells (64 MB of numbers), 200k to 1M rows; for validate up to 32M cells (256 MB), "
        "200k to 500k rows, since each chunk is one Great Expectations validation, which has a fixed cost. Memory is "
        "bounded by the chunk")
    parallelism: int = Field(
        1, ge=1, le=MAX_PREP_GROUPS, description="CPU pods that validate and prepare at once: above 1, the pinned "
        "files are cut into this many groups of whole files (fewer when there are fewer files), each group is "
        "one mapped validate_data and prepare_data task, and merge_data joins them. Output bytes do not depend "
        "on it")

    @property
    def fans_out(self) -> bool:
        """Whether the data stages run as mapped tasks over groups of files (pin, groups, merge)."""
        return self.parallelism > 1

    def rows_per_chunk(self, columns: int) -> int:
        """prepare's chunk: `chunk_rows`, or the automatic size for a table of `columns` columns."""
        return self._rows(columns, CHUNK_CELLS, CHUNK_ROWS_RANGE)

    def rows_per_validation(self, columns: int) -> int:
        """validate's chunk (one Great Expectations validation): `chunk_rows`, or the automatic size."""
        return self._rows(columns, VALIDATION_CELLS, VALIDATION_ROWS_RANGE)

    def _rows(self, columns: int, cells: int, bounds: tuple[int, int]) -> int:
        if self.chunk_rows is not None:
            return self.chunk_rows
        low, high = bounds
        return max(low, min(high, cells // max(columns, 1)))


class ReplicaSet(Strict):
    replicas: int = Field(1, ge=0, le=64)
    max_replicas: int | None = Field(None, ge=1, le=64, description="upper bound a UI trigger may ask for")
    resources: Resources = shared(Resources())

    @model_validator(mode="after")
    def _bounds(self) -> ReplicaSet:
        if self.max_replicas is not None and self.max_replicas < self.replicas:
            raise ValueError(f"max_replicas ({self.max_replicas}) is below replicas ({self.replicas})")
        return self

    @property
    def upper_bound(self) -> int:
        return self.max_replicas if self.max_replicas is not None else self.replicas


class PsReplicas(ReplicaSet):
    """Parameter servers: CPU pods."""

    resources: Resources = shared(Resources(cpu="1", memory="2Gi"))


class WorkerReplicas(ReplicaSet):
    """Workers: GPU pods by default, so `workers: {replicas: 4}` alone keeps one GPU per worker."""

    replicas: int = Field(2, ge=0, le=64)
    resources: Resources = shared(Resources(cpu="2", memory="4Gi", gpu=1))


class ModelSpec(Strict):
    module: str = Field("trainyard_trainer.models.mlp", pattern=r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$")
    params: dict[str, Any] = {}


class TrainingConfig(Strict):
    strategy: Literal["parameter_server", "multi_worker_mirrored", "single"] = "parameter_server"
    runtime: TrainingRuntime = shared(TrainingRuntime())
    model: ModelSpec = shared(ModelSpec())
    ps: PsReplicas = shared(PsReplicas())
    workers: WorkerReplicas = shared(WorkerReplicas())
    priority: Literal["high", "low"] = "low"
    gpu_tier: str | None = None
    steps: int = Field(500, ge=1, le=10_000_000)
    batch_size: int = Field(64, ge=1, le=1_000_000)
    learning_rate: float = Field(0.01, gt=0, le=10)
    checkpoint_every_steps: int = Field(100, ge=1)
    steps_per_execution: int = Field(
        20, ge=1, le=10_000, description="training steps run by one call of the compiled step function (on one "
        "worker, for parameter_server): fewer dispatches per step, Keras' steps_per_execution; a checkpoint "
        "interval is cut into such calls")
    restart_budget: int = Field(3, ge=0, le=100)
    timeout_minutes: int = Field(
        24 * 60, ge=1, le=30 * 24 * 60, description="the longest a training job may run: every replica pod gets it "
        "as activeDeadlineSeconds (the kubelet stops it then, whoever launched it is gone), and the train task "
        "as its execution_timeout")
    port: int = Field(2222, ge=1024, le=65535)
    pool: PoolName = Field("trainyard_training", description="Airflow pool of the train task: its slots are how "
                           "many training jobs (of every pipeline in the pool) may hold GPUs at once")

    @model_validator(mode="after")
    def _replicas_fit_strategy(self) -> TrainingConfig:
        if self.strategy == "parameter_server":
            for role, replicas in (("ps", self.ps.replicas), ("workers", self.workers.replicas)):
                if replicas < 1:
                    raise ValueError(f"@{role}.replicas: must be ≥ 1 for parameter_server training (got {replicas})")
        if self.strategy == "multi_worker_mirrored" and self.ps.replicas:
            raise ValueError(f"@ps.replicas: multi_worker_mirrored uses no parameter servers: set 0 "
                             f"(got {self.ps.replicas})")
        if self.strategy == "single":
            for role, replicas in (("ps", self.ps.replicas), ("workers", self.workers.replicas)):
                if replicas:
                    raise ValueError(f"@{role}.replicas: single training runs on the chief alone: set 0 "
                                     f"(got {replicas})")
        return self


class Threshold(Strict):
    min: float | None = None
    max: float | None = None


class ChangeThreshold(Strict):
    metric: str
    min_delta: float = 0.0
    confidence: float = Field(
        0.95, ge=0.0, lt=1.0,
        description="deploy only when the improvement's lower confidence bound (a paired bootstrap on the same "
                    "eval rows) clears min_delta; 0 compares the point estimates alone")


class EvaluationConfig(Strict):
    runtime: EvaluationRuntime = shared(EvaluationRuntime())  # evaluate and decide
    metrics: list[Identifier] | None = Field(
        None, description="what evaluate computes (default per task: see trainyard_contract.metrics)")
    thresholds: dict[str, Threshold] = {}
    change_threshold: ChangeThreshold | None = None


class DeployConfig(Strict):
    model_name: K8sName | None = None
    runtime: DeployRuntime = shared(DeployRuntime())  # the deploy step
    image: ImageRef = Field("tensorflow/serving:2.19.0", description="the TF Serving image (Kubernetes backend)")
    grpc_port: int = Field(8500, ge=1, le=65535)
    rest_port: int = Field(8501, ge=1, le=65535)
    replicas: int = Field(1, ge=1, le=100)
    resources: Resources = shared(Resources(cpu="1", memory="2Gi"))
    node_selector: dict[str, str] = {}
    pool: PoolName = Field("trainyard_deploy", description="Airflow pool of the deploy task")
    allow_signature_change: bool = Field(
        False, description="deploy a model whose serving signature breaks the served one's clients (an input "
                           "added, removed or retyped; an output removed or changed); off: such a model is held back")


class GpuTier(Strict):
    node_selector: dict[str, str] = {}
    tolerations: list[dict[str, str]] = []
    priority_class: K8sName | None = None


class VolumeConfig(Strict):
    claim: K8sName = "trainyard-data"
    mount_path: str = Field("/data", pattern=r"^/[A-Za-z0-9._/-]*$")


class SecretRef(Strict):
    """An environment variable filled from a Kubernetes Secret key: only the reference is in the config."""

    env: Annotated[str, StringConstraints(pattern=r"^[A-Z_][A-Z0-9_]*$")]
    secret: K8sName
    key: str = Field(pattern=r"^[-._a-zA-Z0-9]+$")


class NodePools(Strict):
    cpu: dict[str, str] = {}
    gpu: dict[str, str] = {}


class KubernetesConfig(Strict):
    namespace: K8sName = "trainyard"
    volume: VolumeConfig = shared(VolumeConfig())
    service_account: K8sName = "trainyard-runner"
    node_pools: NodePools = shared(NodePools())
    gpu_tiers: dict[str, GpuTier] = {}
    tier_by_priority: dict[Literal["high", "low"], str] = {}
    image_pull_secrets: list[K8sName] = []
    registry: RegistryPrefix | None = Field(
        None, description="where `make images REGISTRY=...` pushed Trainyard's own images: it prefixes every "
        "image reference that starts with `trainyard/` (`registry.example.com/ml` + `trainyard/prep:0.1.0` -> "
        "`registry.example.com/ml/trainyard/prep:0.1.0`); other images (deploy.image, your own) are used as written")
    secrets: list[SecretRef] = []
    connection_id: str = Field("kubernetes_default", min_length=1,
                               description="the Airflow Kubernetes connection (in-cluster or a kubeconfig)")
    startup_timeout_seconds: int = Field(600, ge=10, le=86_400,
                                         description="how long a pod may stay Pending before its stage fails")

    def image(self, reference: str) -> str:
        """`reference` as the cluster pulls it: Trainyard's own images (`trainyard/...`) under `registry`."""
        if self.registry and reference.startswith(OWN_IMAGES):
            return f"{self.registry}/{reference}"
        return reference


BROKER_URL = r"^rediss?://[A-Za-z0-9]([A-Za-z0-9.-]*[A-Za-z0-9])?(:[0-9]{1,5})?(/[0-9]{1,2})?$"


def check_broker_url(url: str) -> str:
    """redis://host[:port][/db] (rediss:// for TLS), and never a password in it: a config is not a secret."""
    if "@" in url:
        raise ValueError("the URL must not carry credentials: give the password's Secret as stream.password "
                         "({env, secret, key}) and write the URL as redis://host:port/db")
    if not re.match(BROKER_URL, url) or len(url) > 255:
        raise ValueError(f"must be redis://host[:port][/db] or rediss://... (got {url!r})")
    return url


BrokerUrl = Annotated[str, AfterValidator(check_broker_url)]
StreamName = Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9][A-Za-z0-9:._-]*$", max_length=200)]


class MicroBatch(Strict):
    """How many records the scorer sends to TF Serving in one Predict, and how long it waits to fill a batch."""

    max_records: int = Field(64, ge=1, le=10_000)
    max_wait_ms: int = Field(20, ge=0, le=60_000, description="after a batch's first record, wait at most this "
                             "long for more before scoring what it has")


class StreamLand(Strict):
    """Labelled events from a stream, landed as the pipeline's own daily partitions of `data.source`."""

    source: StreamName = Field(description="the stream of labelled events (features, label and the key)")
    dead_letter: StreamName = Field(description="where an event that fails the features' or label's checks goes")
    group: StreamName = "trainyard-land"
    max_rows: int = Field(50_000, ge=1, le=5_000_000, description="close a part file at this many rows")
    max_seconds: float = Field(300.0, gt=0, le=86_400, description="or this long after its first event")
    airflow_api_url: str | None = Field(
        None, pattern=r"^https?://[^\s/]+(/[^\s]*)?$",
        description="the api-server the lander registers the pipeline's asset events with (in a cluster, e.g. "
        "http://airflow-api-server.airflow.svc:8080); default $AIRFLOW_API_URL, else http://127.0.0.1:8080. "
        "Credentials: AIRFLOW_API_TOKEN, or AIRFLOW_USERNAME/AIRFLOW_PASSWORD (kubernetes.secrets in a cluster)")


class StreamConfig(Strict):
    """Real-time scoring of a stream through the served model, and (`land`) a stream landed as training data.

    The broker is Redis Streams: each event is one entry whose `data` field holds a JSON object with the raw
    features by name and the key. The URL carries no password: `password` names the environment variable that
    holds it, filled from a Kubernetes Secret (`secret`/`key`) in the cluster and from the environment locally.
    """

    broker: BrokerUrl = Field(description="redis://host:port[/db] (rediss:// for TLS); no credentials in it")
    password: SecretRef | None = None
    source: StreamName = Field(description="the stream of events to score")
    sink: StreamName = Field(description="where one result per event is written")
    dead_letter: StreamName = Field(description="where an event the scorer cannot score goes, with the reason")
    group: StreamName = Field("trainyard-score", description="the consumer group the scorer replicas share")
    key: Identifier = Field("key", description="the event field that identifies it (copied into its result)")
    batch: MicroBatch = shared(MicroBatch())
    claim_idle_ms: int = Field(30_000, ge=100, le=3_600_000, description="an event a consumer has held this long "
                               "without acknowledging it (the consumer died) is reclaimed by another")
    replicas: int = Field(1, ge=1, le=100)
    image: ImageRef = Field("trainyard/stream:0.1.0", description="the scorer's and lander's image (Kubernetes)")
    # the scorer imports TensorFlow (tensorflow-serving-api's protos need it): about 800 MiB resident
    resources: Resources = shared(Resources(cpu="500m", memory="1Gi"))
    land: StreamLand | None = None

    @model_validator(mode="after")
    def _distinct_streams(self) -> StreamConfig:
        named = {"source": self.source, "sink": self.sink, "dead_letter": self.dead_letter}
        if self.land is not None:
            named["land.source"] = self.land.source
        seen: dict[str, str] = {}
        for field, stream in named.items():
            if stream in seen:
                raise ValueError(f"@{field}: stream {stream!r} is also {seen[stream]}; each role needs its own "
                                 "stream")
            seen[stream] = field
        return self


class AssetSchedule(Strict):
    """Data-aware scheduling: a run starts when an event is registered for this Airflow Asset (new data landed).

    `asset` is the dataset's folder on the shared volume (usually `data.source`); the Asset's URI is
    `trainyard://volume/<asset>`, the same on every backend, so an ingestion DAG's outlet or a REST/CLI call
    (`trainyard mark-data`) that names it triggers the pipeline.
    """

    asset: VolumePath

    @property
    def uri(self) -> str:
        return asset_uri(self.asset)


def asset_uri(volume_path: str) -> str:
    """The Airflow Asset URI of a folder on the shared volume."""
    return f"trainyard://volume/{volume_path.strip('/')}"


# Tags of the schedule's union: a mapping is an AssetSchedule, anything else a cron string or preset, so an error
# names one reading, not both. The loader leaves tags out of the dotted field names it prints.
UNION_TAGS = frozenset({"cron-schedule", "asset-schedule"})
Schedule = Annotated[
    Annotated[str, Tag("cron-schedule")] | Annotated[AssetSchedule, Tag("asset-schedule")],
    Discriminator(lambda value: "asset-schedule" if isinstance(value, (dict, AssetSchedule)) else "cron-schedule"),
]


def _unknown_metric(task: str, name: str) -> str:
    import difflib

    names = sorted(METRICS[task])
    other = next((t for t in METRICS if t != task and name in METRICS[t]), None)
    if other:
        return f"{name!r} is a {other} metric; this {task} pipeline has {names}"
    close = difflib.get_close_matches(name, names, n=1)
    hint = f"; did you mean {close[0]!r}?" if close else ""
    return f"unknown metric {name!r} for {task}{hint} (one of {names})"


Backend = Literal["local", "kubernetes"]  # the one list of backends: trainyard.launch.LAUNCHERS builds each
BACKENDS: tuple[str, ...] = get_args(Backend)


STAGE_SECTIONS = ("prep", "training", "evaluation", "deploy")  # the sections with a `runtime`


class PipelineConfig(Strict):
    """One pipeline = one DAG. `name` is the DAG id and must match the file name."""

    name: str = Field(pattern=PIPELINE_NAME)
    description: str = ""
    owner: str = "trainyard"
    tags: list[str] = []
    schedule: Schedule | None = Field(
        None, description="cron, a preset (@daily...), {asset: <volume path>} (run on new data), or null (manual)")
    start_date: dt.date = dt.date(2026, 1, 1)
    catchup: bool = False
    max_active_runs: int = Field(1, ge=1, le=64)
    retries: int = Field(1, ge=0, le=20)
    backend: Backend | None = None
    data: DataConfig
    prep: PrepConfig = shared(PrepConfig())
    training: TrainingConfig = shared(TrainingConfig())
    evaluation: EvaluationConfig = shared(EvaluationConfig())
    deploy: DeployConfig = shared(DeployConfig())
    kubernetes: KubernetesConfig = shared(KubernetesConfig())
    stream: StreamConfig | None = Field(None, description="real-time scoring of a stream, and landing a stream "
                                        "as training data (README: Streams)")

    @model_validator(mode="after")
    def _metrics_fit_task(self) -> PipelineConfig:
        """Every metric, threshold and change threshold names a metric of the task that evaluate computes."""
        task = self.data.label.task
        known = METRICS[task]
        wanted = self.evaluation.metrics
        for index, name in enumerate(wanted or []):
            if name not in known:
                raise ValueError(f"@evaluation.metrics.{index}: {_unknown_metric(task, name)}")
        computed = self.metric_names
        for name, bound in self.evaluation.thresholds.items():
            where = f"@evaluation.thresholds.{name}"
            if name not in known:
                raise ValueError(f"{where}: {_unknown_metric(task, name)}")
            if name not in computed:
                raise ValueError(f"{where}: {name!r} is not computed: add it to evaluation.metrics "
                                 f"(now {list(computed)})")
            problem = impossible_bound(known[name], bound.min, bound.max)
            if problem:
                raise ValueError(f"{where}: {problem}")
        change = self.evaluation.change_threshold
        if change is not None:
            if change.metric not in known:
                raise ValueError(f"@evaluation.change_threshold.metric: {_unknown_metric(task, change.metric)}")
            if change.metric not in computed:
                raise ValueError(f"@evaluation.change_threshold.metric: {change.metric!r} is not computed: add it "
                                 f"to evaluation.metrics (now {list(computed)})")
        return self

    @model_validator(mode="after")
    def _env_is_not_a_secret(self) -> PipelineConfig:
        """A name in a stage's `runtime.env` and in `kubernetes.secrets` would be two values for one variable."""
        secret_names = {ref.env for ref in self.kubernetes.secrets}
        for section in STAGE_SECTIONS:
            for name in getattr(self, section).runtime.env:
                if name in secret_names:
                    raise ValueError(f"@{section}.runtime.env.{name}: also filled from a secret in "
                                     "kubernetes.secrets; keep one")
        return self

    def runtimes(self) -> dict[str, StageRuntime]:
        """Each stage section's runtime, by section name."""
        return {section: getattr(self, section).runtime for section in STAGE_SECTIONS}

    @property
    def metric_names(self) -> tuple[str, ...]:
        """What evaluate computes: `evaluation.metrics`, else the task's defaults."""
        wanted = self.evaluation.metrics
        return tuple(wanted) if wanted else DEFAULT_METRICS[self.data.label.task]

    @field_validator("schedule")
    @classmethod
    def _schedule(cls, value: str | AssetSchedule | None) -> str | AssetSchedule | None:
        if value is None or isinstance(value, AssetSchedule) or value in SCHEDULE_PRESETS:
            return value
        fields = value.split()
        if len(fields) != 5 or not all(re.match(r"^[0-9*/,\-A-Za-z?LW#]+$", f) for f in fields):
            raise ValueError(
                f"must be a 5-field cron expression, one of {sorted(SCHEDULE_PRESETS)}, {{asset: <volume path>}}, "
                f"or null (got {value!r})"
            )
        return value

    @property
    def model_name(self) -> str:
        """The served model's name: `deploy.model_name`, else the pipeline name as a DNS label."""
        return self.deploy.model_name or self.name.replace("_", "-")
