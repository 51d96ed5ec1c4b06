"""The registry's reads and writes are a wiring check, not only DAG docs: in every DAG a config can build, each
stage reads only what a stage before it writes; and the typed run files refuse what their writer would not write."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from trainyard.dag.registry import stage_named, stages_for, wiring_problems
from trainyard_contract import artifacts, layout
from trainyard_contract.artifacts import Decision, DeployJournal, EvalMetrics, InputsManifest, SmokeSet, VersionRecord
from trainyard_contract.runtime import StageError
from trainyard_contract.schema import PipelineConfig


def config(parallelism: int) -> PipelineConfig:
    return PipelineConfig.model_validate({"name": "p", "prep": {"parallelism": parallelism}, "data": {
        "source": "d", "label": {"name": "y", "classes": [0, 1]}, "features": [{"name": "a"}]}})


@pytest.mark.parametrize("parallelism", [1, 3])
def test_every_stage_reads_only_what_an_earlier_stage_writes(parallelism: int) -> None:
    stages = stages_for(config(parallelism))
    assert ("merge_data" in [s.task_id for s in stages]) == (parallelism > 1)  # both shapes of the DAG
    assert wiring_problems(stages) == []


def test_a_stage_that_reads_what_nothing_before_it_writes_is_named() -> None:
    early = dataclasses.replace(stage_named("validate"), task_id="peek", reads=(layout.METRICS,))
    stages = (*stages_for(config(1)), early)
    assert wiring_problems(stages) == []  # last: evaluate wrote the metrics before it
    assert wiring_problems((early, *stages_for(config(1)))) == [
        "peek reads eval/metrics.json, which no stage before it writes"]


SMOKE = {"inputs": {"a": [1.0, 2.0]}, "dtypes": {"a": "float"}}


@pytest.mark.parametrize(("smoke", "says"), [
    ({**SMOKE, "class_ids": [0, 1]}, "either class_ids and probabilities"),
    ({**SMOKE, "class_ids": [0, 1], "probabilities": [[1, 0], [0, 1]], "predictions": [0.5, 1.5]}, "either"),
    ({**SMOKE, "dtypes": {"b": "float"}, "predictions": [0.5, 1.5]}, "dtypes name ['b'], inputs ['a']"),
    ({**SMOKE, "predictions": [0.5, 1.5], "labels": [1, 2]}, "Extra inputs are not permitted"),
])
def test_a_smoke_set_its_writer_would_not_write_is_refused(smoke: dict, says: str) -> None:
    with pytest.raises(ValueError, match=says.replace("[", r"\[").replace("]", r"\]")):
        SmokeSet.model_validate(smoke)


def test_a_run_file_that_is_missing_or_not_what_its_writer_writes_names_the_file_and_field(tmp_path: Path) -> None:
    with pytest.raises(StageError, match=f"{layout.DECISION} is missing: decide must run before deploy$"):
        artifacts.read(tmp_path, layout.DECISION, Decision, "decide", "deploy")
    (tmp_path / layout.DEPLOY).mkdir()
    (tmp_path / layout.DECISION).write_text('{"deploy": "maybe", "forced": false, "reasons": []}')
    with pytest.raises(StageError, match=r"decision.json is not what decide writes: deploy: Input should be a valid "
                                         r"boolean.*\(6 problem\(s\)\); re-run decide"):
        artifacts.read(tmp_path, layout.DECISION, Decision, "decide", "deploy")
    (tmp_path / layout.DECISION).write_text("{half")
    with pytest.raises(StageError, match="is not what decide writes: \\(the whole file\\): Invalid JSON"):
        artifacts.read(tmp_path, layout.DECISION, Decision, "decide", "deploy")


def test_the_other_cross_image_run_files_refuse_what_their_writer_would_not_write(tmp_path: Path) -> None:
    (tmp_path / layout.EVAL).mkdir()
    (tmp_path / layout.METRICS).write_text(
        '{"run_id": "r", "task": "classification", "eval_rows": 10, "loss": {}, "challenger": {"auc": "high"}, '
        '"champion": null, "signature": {}, "comparison": null}')
    with pytest.raises(StageError, match=r"metrics.json is not what evaluate writes: challenger.auc: Input should "
                                         r"be a valid number"):
        artifacts.read(tmp_path, layout.METRICS, EvalMetrics, "evaluate", "decide")
    assert artifacts.read_if_present(tmp_path, layout.INPUTS_MANIFEST, InputsManifest, "validate_data",
                                     "deploy") is None  # a model exported by hand has no run files around it
    (tmp_path / layout.INPUTS).mkdir()
    (tmp_path / layout.INPUTS_MANIFEST).write_text(
        '{"source": "d", "window_end": null, "window_days": null, "partitions": ["2026-01-01"], "total_bytes": 1, '
        '"trigger": null, "files": [{"source": "d/date=2026-01-01/a.csv", "snapshot": "inputs/a.csv", '
        '"partition": "2026-01-01", "bytes": 1, "sha256": "0", "pinned_by": "symlink"}]}')
    with pytest.raises(StageError, match=r"files.0.pinned_by: Input should be 'hardlink' or 'copy'"):
        artifacts.read_if_present(tmp_path, layout.INPUTS_MANIFEST, InputsManifest, "validate_data", "deploy")
    with pytest.raises(ValueError, match="state"):
        DeployJournal.model_validate({"state": "done", "deployed": True, "published": True})


def test_a_published_versions_record_from_another_trainyard_or_by_hand_still_reads() -> None:
    """trainyard.json outlives the Trainyard that wrote it: a field it does not know is ignored, a missing one is
    unknown (such a champion is never "the same data"), and a wrongly typed one is refused."""
    assert VersionRecord.model_validate({}).data_sha256 is None
    newer = VersionRecord.model_validate({"run_id": "r", "data_sha256": "ab", "signed_by": "a future field"})
    assert newer.data_sha256 == "ab" and "signed_by" not in newer.model_dump()
    with pytest.raises(ValueError, match="metrics"):
        VersionRecord.model_validate({"metrics": "0.9"})
