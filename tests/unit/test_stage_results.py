"""Stage results are typed where the Airflow side acts on them: a result from another image version is an error
naming the stage and the field, never a branch that quietly goes the wrong way or a map over nothing."""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace
from typing import Any
from unittest.mock import MagicMock

import pytest
from airflow.sdk.exceptions import AirflowSkipException

from trainyard.dag.operators import StageOperator
from trainyard.dag.registry import stage_named
from trainyard.dag.stage_kinds import Branch
from trainyard_contract.results import DecideResult, PinResult, ResultError, StageResult, read_result
from trainyard_contract.schema import PipelineConfig

CONFIG = PipelineConfig.model_validate({"name": "p", "prep": {"parallelism": 2}, "data": {
    "source": "d", "label": {"name": "y", "classes": [0, 1]}, "features": [{"name": "a"}]}})


def test_a_decide_result_with_a_string_for_deploy_is_refused_and_the_field_named() -> None:
    with pytest.raises(ResultError, match=r"stage 'decide' .* not a DecideResult \(deploy: Input should be a valid "
                                          r"boolean"):
        read_result(DecideResult, {"deploy": "yes", "reasons": []}, "decide")


def test_a_pin_result_needs_at_least_one_group_and_keeps_its_other_figures() -> None:
    with pytest.raises(ResultError, match="groups: List should have at least 1 item"):
        read_result(PinResult, {"groups": [], "files": 0, "bytes": 0}, "pin")
    pinned = read_result(PinResult, {"groups": [0, 1], "files": 2, "bytes": 10, "seconds": 0.5}, "pin")
    assert pinned.groups == [0, 1] and pinned.model_extra == {"seconds": 0.5}


def test_the_result_line_carries_what_the_stage_set_and_nothing_filled_in() -> None:
    assert DecideResult(deploy=True, reasons=["better"]).payload() == {"deploy": True, "reasons": ["better"]}
    assert StageResult(skipped="nothing new").payload() == {"skipped": "nothing new"}


def test_a_declaration_acting_on_a_key_its_result_model_lacks_fails_when_declared() -> None:
    pin = stage_named("pin")
    with pytest.raises(ValueError, match="acts on its result's 'groups', which its result model StageResult"):
        dataclasses.replace(pin, result=StageResult)
    decide = stage_named("decide")
    with pytest.raises(ValueError, match="acts on its result's 'go', which its result model DecideResult"):
        dataclasses.replace(decide, kind=Branch(on="go"))


class ReturnsResult:
    """A launcher whose stage pod answered `result` (the seam the operator calls; no pod runs)."""

    def __init__(self, result: dict[str, Any] | None):
        self.result = result

    def run_stage(self, run: Any, spec: Any, log: Any, context: Any = None) -> dict[str, Any] | None:
        return self.result


def execute(stage_name: str, result: dict[str, Any] | None, monkeypatch: pytest.MonkeyPatch) -> Any:
    operator = StageOperator(task_id=stage_named(stage_name).task_id, config=CONFIG, stage=stage_named(stage_name))
    monkeypatch.setattr(StageOperator, "launcher", lambda self, config: ReturnsResult(result))
    context = {"ti": MagicMock(map_index=-1), "params": {}, "run_id": "manual__r1",
               "dag_run": SimpleNamespace(run_id="manual__r1", run_after=None, run_type="manual")}
    return operator.execute(context)


def test_the_operator_maps_over_the_validated_groups(monkeypatch: pytest.MonkeyPatch) -> None:
    assert execute("pin", {"groups": [0, 1], "files": 2, "bytes": 10}, monkeypatch) == [0, 1]
    with pytest.raises(ResultError, match=r"stage 'pin' .*\(groups: Field required"):
        execute("pin", {"files": 2, "bytes": 10}, monkeypatch)


def test_the_operator_refuses_a_decision_it_cannot_read_and_skips_on_a_reason(
        monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(ResultError, match="deploy: Input should be a valid boolean"):
        execute("decide", {"deploy": "no"}, monkeypatch)
    with pytest.raises(AirflowSkipException, match="validate_data skipped: nothing new"):
        execute("validate", {"skipped": "nothing new"}, monkeypatch)
    assert execute("validate", {"rows": 3}, monkeypatch) == {"rows": 3}
