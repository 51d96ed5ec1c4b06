"""The run files one package writes and another reads, as pydantic models (their paths are in layout.py).

The writer builds the model, so a field it forgets or misspells fails where the file is written, in the writer's
own test; the reader validates the file, so one left by another version of an image (or edited by hand) is a
clear bad-input error naming the file and the field, not a KeyError deep inside a stage. `TYPED` lists them; a
test checks that every file of a finished run validates against its model.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, TypeVar

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


TYPED: dict[layout.Artifact, type[RunFile]] = {layout.SMOKE_SET: SmokeSet, layout.DECISION: Decision,
                                               layout.TRAINING_RECORD: TrainingRecord}
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


def write(path: Path, record: RunFile) -> None:
    """`record` as JSON at `path`, by temp-then-rename (atomic.write_json): the fields its writer set, so a
    regression smoke set holds no class fields at all (not nulls)."""
    write_json(path, record.model_dump(exclude_unset=True))
