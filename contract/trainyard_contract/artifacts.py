"""The run files one package writes and another reads, as pydantic models (their paths are in layout.py).

The writer builds the model, so a field it forgets or misspells fails where the file is written, in the writer's
own test; the reader validates the file, so one left by another version of an image (or edited by hand) is a
clear bad-input error naming the file and the field, not a KeyError deep inside a stage. `TYPED` lists them; a
test checks that every file of a finished run validates against its model.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, StrictBool, ValidationError, model_validator

from trainyard_contract import layout
from trainyard_contract.atomic import write_json
from trainyard_contract.runtime import StageError

JsonValue = float | int | str | None  # a raw feature value as the evaluator read it (a REST `instances` cell)


class RunFile(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class SmokeSet(RunFile):
    """`eval/smoke.json`: a few eval rows with the evaluator's own outputs. Written by evaluate (trainer image);
    read by deploy (serving image), which sends the rows through the served API and compares, and by `trainyard
    predict` (Airflow side), which posts one of them."""

    inputs: dict[str, list[JsonValue]]  # feature -> one value per example
    dtypes: dict[str, str]  # feature -> "float" | "int" | "string", the tensor dtype each is sent as
    class_ids: list[int] | None = None  # classification
    probabilities: list[list[float]] | None = None  # classification: one row of class probabilities per example
    predictions: list[float] | None = None  # regression

    @model_validator(mode="after")
    def _one_task(self) -> SmokeSet:
        classification = self.class_ids is not None and self.probabilities is not None
        if classification == (self.predictions is not None):
            raise ValueError("holds either class_ids and probabilities (classification) or predictions (regression)")
        if set(self.dtypes) != set(self.inputs):
            raise ValueError(f"dtypes name {sorted(self.dtypes)}, inputs {sorted(self.inputs)}")
        return self

    @property
    def examples(self) -> int:
        return len(self.predictions if self.predictions is not None else self.class_ids or [])


class Decision(RunFile):
    """`deploy/decision.json`: decide's verdict and why. Written by decide (evaluate image); read by deploy (serving
    image) as its blessing: without `deploy: true` nothing is published."""

    deploy: StrictBool  # not lax: "yes" or 1 in a hand-edited file is no blessing
    forced: StrictBool
    reasons: list[str]
    held: list[str] = []  # a refused run: what did pass
    ignored: list[str] = []  # a forced run: what would have refused it
    champion: dict[str, Any] | None  # evaluate's record of the served model (None: nothing served yet)
    metrics: dict[str, float | None]
    data_window_end: dict[str, Any]
    comparison: dict[str, Any] | None
    signature: dict[str, Any] | None


class TrainingRecord(RunFile):
    """`model/training.json`: how the model was trained. Written by the trainer's chief beside the SavedModel; read
    by deploy (the published version's lineage) and by `trainyard run`'s summary table (its rates)."""

    steps: int
    resumed_from_step: int
    seconds: float
    examples_per_second: float
    final_loss: float
    strategy: str
    workers: int
    ps: int
    batch_size: int
    learning_rate: float
    model_module: str
    task: str
    tensorflow: str
    keras: str


class PinnedFile(RunFile):
    """One input file as validate_data pinned it into the run folder."""

    source: str  # relative to the volume
    snapshot: str  # relative to the run folder
    partition: str  # the day, ISO
    bytes: int
    sha256: str
    pinned_by: Literal["hardlink", "copy"]
    symlink_target: str | None = None  # the file (or its partition) was a permitted symbolic link


class InputsManifest(RunFile):
    """`inputs/manifest.json`: the partitions this run reads, pinned once. Written by validate_data or pin_inputs
    (prep image); read by prepare (prep), decide (trainer image: the window's end) and deploy (serving image: the
    lineage)."""

    source: str
    window_end: str | None  # ISO; None: every partition
    window_days: int | None
    partitions: list[str]
    files: list[PinnedFile]
    total_bytes: int
    trigger: dict[str, Any] | None  # run type and Param values: what was asked for


class InputsDigest(RunFile):
    files: int
    bytes: int
    sha256: str  # over the pinned files' sha256, in order: the data's identity


class PreparedManifest(RunFile):
    """`prepared/manifest.json`: the shards and the hashes of what they were made from. Written by prepare or merge
    (prep image); read by the trainer (its input files, and whether the champion was trained on the same data and
    config) and by deploy (the lineage)."""

    rows: dict[str, int]  # split -> rows
    shards: list[dict[str, Any]]
    inputs: InputsDigest
    split: dict[str, Any]
    config_sha256: str
    groups: list[dict[str, Any]]
    seconds: float
    throughput: dict[str, Any]


class EvalMetrics(RunFile):
    """`eval/metrics.json`: the challenger's and the served champion's metrics on this run's eval rows. Written by
    evaluate; read by decide (same image), deploy (serving image: the published version's metrics) and the
    report."""

    run_id: str
    task: str
    eval_rows: int
    loss: dict[str, Any]
    challenger: dict[str, float | None]
    champion: dict[str, Any] | None  # evaluate's record of the served model (None: nothing served yet)
    signature: dict[str, Any]
    comparison: dict[str, Any] | None  # the bootstrap of the change, when both were scored
    training_curve: list[tuple[int, float]] = []  # the chief's loss by step
    per_class: list[dict[str, Any]] | None = None  # classification
    confusion_matrix: list[list[int]] | None = None  # classification
    residuals: dict[str, float] | None = None  # regression
    scatter: list[list[float]] | None = None  # regression: label, prediction


class VersionRecord(RunFile):
    """`models/<name>/<N>/trainyard.json`: the lineage of a published version. Written by deploy (serving image)
    when it publishes; read by evaluate and train (trainer image) to know the champion. Every field may be missing
    from a version published by hand or by an older Trainyard: such a champion is still served, compared on its
    scores, and never counts as trained on the same data."""

    model_config = ConfigDict(extra="ignore", frozen=True)  # a newer Trainyard's fields do not unseat a champion

    pipeline: str | None = None
    run_id: str | None = None
    run_dir: str | None = None
    config_sha256: str | None = None
    data_sha256: str | None = None
    data_window_end: str | None = None
    trigger: dict[str, Any] | None = None
    training: dict[str, Any] = {}
    metrics: dict[str, float | None] = {}
    eval_rows: int | None = None
    classes: list[str] | None = None  # the probabilities' column order
    tensorflow: str | None = None
    images: dict[str, str] = {}
    version: int | None = None
    published_by: str | None = None
    published_at: str | None = None


DeployState = Literal["refused", "publishing", "published", "rolled_back", "interrupted", "verified"]


class DeployJournal(RunFile):
    """`deploy/result.json`: where this run's deploy got to, written before each step so a retry or `trainyard run`
    after a Ctrl-C knows what is on disk. Written by deploy (serving image); read by deploy's retry and by
    `trainyard run` (Airflow side)."""

    state: DeployState
    deployed: bool
    published: bool
    verified: bool | None = None
    model: str | None = None
    version: int | None = None
    reason: str | None = None
    rolled_back: bool | None = None
    endpoint: str | None = None
    available_after_seconds: float | None = None
    smoke_examples: int | None = None


TYPED: dict[layout.Artifact, type[RunFile]] = {
    layout.SMOKE_SET: SmokeSet, layout.DECISION: Decision, layout.TRAINING_RECORD: TrainingRecord,
    layout.INPUTS_MANIFEST: InputsManifest, layout.PREPARED_MANIFEST: PreparedManifest, layout.METRICS: EvalMetrics,
    layout.DEPLOY_RESULT: DeployJournal}
M = TypeVar("M", bound=RunFile)


def read(run_dir: Path, artifact: layout.Artifact, model: type[M], writer: str, reader: str) -> M:
    """`artifact` of the run at `run_dir` as `model`; StageError naming the file, the field and the stage that
    writes it (`writer`) when it is missing or not what that stage writes."""
    path = Path(run_dir) / artifact
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        raise StageError(f"{path} is missing: {writer} must run before {reader}") from None
    try:
        return model.model_validate_json(raw)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(part) for part in first["loc"]) or "(the whole file)"
        raise StageError(f"{path} is not what {writer} writes: {where}: {first['msg']} "
                         f"({exc.error_count()} problem(s)); re-run {writer}") from None


def read_if_present(run_dir: Path, artifact: layout.Artifact, model: type[M], writer: str, reader: str) -> M | None:
    """`read`, or None when the file does not exist (a model exported by hand has no run files around it); a file
    that is there and wrong is still bad input."""
    if not (Path(run_dir) / artifact).is_file():
        return None
    return read(run_dir, artifact, model, writer, reader)


def write(path: Path, record: RunFile) -> None:
    """`record` as JSON at `path`, by temp-then-rename (atomic.write_json): the fields its writer set, so a
    regression smoke set holds no class fields at all (not nulls)."""
    write_json(path, record.model_dump(exclude_unset=True))
