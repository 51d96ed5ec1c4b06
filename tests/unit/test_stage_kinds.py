"""Stage kinds own their wiring: a declaration a kind cannot run fails when it is made, and a new kind reaches the
DAG, its docs and `trainyard render` without the factory or render knowing it."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest

from trainyard.config.loader import load_pipeline_file
from trainyard.dag.factory import build_dag
from trainyard.dag.registry import STAGES, stage_named
from trainyard.dag.stage_kinds import AddedTask, Branch, Job, Pod
from trainyard.launch.render import render_run


@pytest.mark.parametrize(("kind", "says"), [
    (Branch(on="deploy"), "only a `pod` stage can be mapped, not a 'branch' one"),
    (Job(), "only a `pod` stage can be mapped, not a 'job' one"),
])
def test_a_mapped_stage_of_a_kind_that_cannot_be_mapped_fails_when_declared(kind: Pod, says: str) -> None:
    prepare = stage_named("prepare")
    assert prepare.maps_over == "pin_inputs"
    with pytest.raises(ValueError, match=says):
        dataclasses.replace(prepare, kind=kind)


def test_a_job_check_needs_its_command_and_its_label() -> None:
    with pytest.raises(ValueError, match="give check_command and check_name together"):
        dataclasses.replace(stage_named("train"), kind=Job(check_command="check"))
    unchecked = dataclasses.replace(stage_named("train"), kind=Job())
    assert unchecked.stage_names() == ("train",) and unchecked.kind.commands(unchecked) == ("train",)
    assert stage_named("train").kind.commands(stage_named("train")) == ("train", "check")


@dataclasses.dataclass(frozen=True)
class Announced(Pod):
    """A kind no module of Trainyard knows: its stage's pod, then an `announce_<task>` task."""

    def added(self, stage: Any, next_stage: Any) -> tuple[AddedTask, ...]:
        return (AddedTask(f"announce_{stage.task_id}", "Tells the team the model was evaluated."),)

    def added_operator(self, added: AddedTask, config: Any, stage: Any) -> Any:
        from airflow.providers.standard.operators.empty import EmptyOperator

        return EmptyOperator(task_id=added.task_id, doc_md=added.doc)


def test_a_new_kind_reaches_the_dag_its_docs_and_render_through_the_kind_alone(pipelines_dir: Path) -> None:
    config = load_pipeline_file(pipelines_dir / "digits.yaml")
    stages = tuple(dataclasses.replace(s, kind=Announced()) if s.task_id == "evaluate" else s for s in STAGES)
    dag = build_dag(config, "digits.yaml", stages)
    announce = dag.get_task("announce_evaluate")
    assert announce.upstream_task_ids == {"evaluate"}
    assert "| `announce_evaluate` | - | Tells the team the model was evaluated. | - | - |" in dag.doc_md
    assert {t.task_id for t in build_dag(config, "digits.yaml").tasks} == {t.task_id for t in dag.tasks} - {
        "announce_evaluate"}
    pods = [m["metadata"]["name"] for m in render_run(config, "r1", stages=stages) if m["kind"] == "Pod"]
    assert any(name.startswith("digits-evaluate-") for name in pods)
