"""What a stage's result line says, as the Airflow side reads it (the line itself is `runtime.write_result`).

A stage's result is small JSON: the figures its task shows as XCom, and the few keys the Airflow side acts on.
Those keys have models here, used on both sides: the image builds its result from the model, so a misspelled key
fails in the image's own test; the operator validates what came back, so a result from another version of an
image is a clear error naming the stage and the field, not a branch that quietly goes the wrong way. Figures no
code reads stay free-form (`extra="allow"`).
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field, NonNegativeInt, StrictBool, ValidationError


class StageResult(BaseModel):
    """Any stage's result. `skipped`: why a stage did nothing (its task ends skipped, with that reason)."""

    model_config = ConfigDict(extra="allow", frozen=True)

    skipped: str | None = Field(default=None, min_length=1)

    def payload(self) -> dict[str, Any]:
        """The JSON the result line carries: what the stage set, nothing filled in by default."""
        return self.model_dump(mode="json", exclude_unset=True)


class PinResult(StageResult):
    """`pin_inputs`: the file groups the mapped validate and prepare tasks run over."""

    groups: list[NonNegativeInt] = Field(min_length=1)
    files: NonNegativeInt
    bytes: NonNegativeInt


class DecideResult(StageResult):
    """`decide`: whether deploy runs (the branch follows `deploy`), whether a person forced it, and why."""

    deploy: StrictBool
    forced: StrictBool = False
    reasons: list[str] = []


class ResultError(ValueError):
    """A stage's result that does not match what its declaration says it returns."""


def read_result(model: type[StageResult], payload: Any, stage: str) -> StageResult:
    """`payload` (a result line's JSON) as `model`; a mismatch names the stage and each field that is wrong."""
    try:
        return model.model_validate(payload)
    except ValidationError as exc:
        problems = "; ".join(f"{'.'.join(map(str, e['loc'])) or 'the result'}: {e['msg']}" for e in exc.errors())
        raise ResultError(f"stage {stage!r} returned a result that is not a {model.__name__} ({problems}): is its "
                          "image the version this Airflow side expects?") from None
