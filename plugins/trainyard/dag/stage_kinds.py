"""Stage kinds: what each kind of stage adds to the DAG, its docs and its manifests.

A `Stage` declaration (registry.py) names one kind: `POD` (one pod), `Branch(on=...)` (one pod, then the next stage
or `skip_<next>`) or `Job(check_command=..., check_name=...)` (an optional one-pod check, then the distributed
training job, and `teardown_<task>`). The kind owns what differs between them: its operator, the tasks it adds,
its rows in the DAG docs, the objects `trainyard render` shows, and the checks of its own fields, which run when the
declaration is made, so a bad declaration fails when the registry is imported, not when a DAG is built. The DAG
factory and render ask the kind; neither branches on it.

Airflow, the operators and the pod builders are imported inside the methods: the registry stays importable
without them (its declarations are pure data).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, NamedTuple

if TYPE_CHECKING:
    from trainyard.dag.registry import Stage
    from trainyard.dag.stages import RunContext
    from trainyard_contract.schema import PipelineConfig

MAP_INDEX_TEMPLATE = "file group {{ task.group }}"
TEARDOWN_DOC = "Deletes any replica pod or Service of this run's training job left behind (runs whatever train did)."


def skip_task_id(stage: Stage) -> str:
    return f"skip_{stage.task_id}"


def teardown_task_id(stage: Stage) -> str:
    return f"teardown_{stage.task_id}"


def skip_doc(stage: Stage, gated: Stage) -> str:
    return f"The run did not earn `{gated.task_id}` (see `{stage.task_id}`)."


class AddedTask(NamedTuple):
    """A task a kind adds beside its stage's own: its id and its line in the DAG docs."""

    task_id: str
    doc: str


class CheckStep(NamedTuple):
    """A job's one-pod check before any replica starts: the image's sub-command and its `trainyard/stage` label."""

    command: str
    name: str


@dataclass(frozen=True)
class Pod:
    """One pod, one task; the only kind that can be mapped over another stage's result (`maps_over`)."""

    name: ClassVar[str] = "pod"
    mappable: ClassVar[bool] = True

    @property
    def check_step(self) -> CheckStep | None:
        return None

    def check(self, stage: Stage) -> None:
        """Refuse a declaration this kind cannot run (called by `Stage.__post_init__`)."""
        if stage.maps_over is not None and not self.mappable:
            raise ValueError(f"stage {stage.name!r}: only a `pod` stage can be mapped, not a {self.name!r} one")
        for key in self.result_keys(stage):
            if key not in stage.result.model_fields:
                raise ValueError(f"stage {stage.name!r} acts on its result's {key!r}, which its result model "
                                 f"{stage.result.__name__} does not declare")

    def result_keys(self, stage: Stage) -> tuple[str, ...]:
        """The keys of the stage's result the Airflow side acts on (each must be a field of `stage.result`)."""
        return (stage.result_key,) if stage.result_key is not None else ()

    def commands(self, stage: Stage) -> tuple[str, ...]:
        """Every sub-command of the stage's image this stage runs."""
        step = self.check_step
        return (stage.command, step.command) if step else (stage.command,)

    def operator(self, stage: Stage, next_stage: Stage | None, common: dict[str, Any], over: Any = None) -> Any:
        """The stage's task; mapped over the result list of the task `over` (one task per item) if given."""
        from trainyard.dag.operators import StageOperator

        if over is not None:
            # the UI and the REST API name each map index by its group, not by a bare number
            return StageOperator.partial(map_index_template=MAP_INDEX_TEMPLATE, **common).expand(group=over.output)
        return StageOperator(**common)

    def added(self, stage: Stage, next_stage: Stage | None) -> tuple[AddedTask, ...]:
        """The tasks this kind adds after its stage's own (they run when it ends)."""
        return ()

    def added_operator(self, added: AddedTask, config: PipelineConfig, stage: Stage) -> Any:
        raise NotImplementedError(f"a {self.name!r} stage adds no task")

    def manifests(self, config: PipelineConfig, run: RunContext, stage: Stage, groups: list[int | None],
                  extra_args: tuple[str, ...]) -> list[Any]:
        """The objects one run of this stage creates: a pod per file group (one, when not mapped)."""
        from trainyard.dag.stages import stage_container
        from trainyard.launch.podspec import build_stage_pod

        return [build_stage_pod(config, run, stage_container(config, run, stage, extra_args, group=group))
                for group in groups]


@dataclass(frozen=True)
class Branch(Pod):
    """One pod, then a branch: the next stage when its result's `on` key is true, else `skip_<next>` (a success)."""

    on: str  # the result key that says "go on"
    name: ClassVar[str] = "branch"
    mappable: ClassVar[bool] = False

    def result_keys(self, stage: Stage) -> tuple[str, ...]:
        return (*super().result_keys(stage), self.on)

    def operator(self, stage: Stage, next_stage: Stage | None, common: dict[str, Any], over: Any = None) -> Any:
        from trainyard.dag.operators import DecideOperator

        if next_stage is None:
            raise ValueError(f"branch stage {stage.name!r} needs a next stage to gate")
        return DecideOperator(follow=next_stage.task_id, skip=skip_task_id(next_stage), on=self.on, **common)

    def added(self, stage: Stage, next_stage: Stage | None) -> tuple[AddedTask, ...]:
        return (AddedTask(skip_task_id(next_stage), skip_doc(stage, next_stage)),) if next_stage else ()

    def added_operator(self, added: AddedTask, config: PipelineConfig, stage: Stage) -> Any:
        from airflow.providers.standard.operators.empty import EmptyOperator

        return EmptyOperator(task_id=added.task_id, doc_md=added.doc)


@dataclass(frozen=True)
class Job(Pod):
    """The distributed training job: `check_command` in one pod first (labelled `check_name`; a bad model fails
    before any replica starts), then chief + parameter servers + workers, and `teardown_<task>` whatever happened."""

    check_command: str | None = None
    check_name: str | None = None
    name: ClassVar[str] = "job"
    mappable: ClassVar[bool] = False

    @property
    def check_step(self) -> CheckStep | None:
        return CheckStep(self.check_command, self.check_name) if self.check_command and self.check_name else None

    def check(self, stage: Stage) -> None:
        super().check(stage)
        if (self.check_command is None) != (self.check_name is None):
            raise ValueError(f"job stage {stage.name!r}: give check_command and check_name together")

    def operator(self, stage: Stage, next_stage: Stage | None, common: dict[str, Any], over: Any = None) -> Any:
        from trainyard.dag.operators import TrainJobOperator

        return TrainJobOperator(**common)

    def added(self, stage: Stage, next_stage: Stage | None) -> tuple[AddedTask, ...]:
        return (AddedTask(teardown_task_id(stage), TEARDOWN_DOC),)

    def added_operator(self, added: AddedTask, config: PipelineConfig, stage: Stage) -> Any:
        from trainyard.dag.operators import TrainTeardownOperator

        return TrainTeardownOperator(task_id=added.task_id, config=config, stage=stage, doc_md=added.doc)

    def manifests(self, config: PipelineConfig, run: RunContext, stage: Stage, groups: list[int | None],
                  extra_args: tuple[str, ...]) -> list[Any]:
        """The check pod, the headless Service, then one pod per replica (Kubernetes DNS hosts in TF_CONFIG)."""
        from trainyard.dag.cluster_spec import kubernetes_hosts
        from trainyard.dag.stages import stage_container, train_containers, train_replicas
        from trainyard.launch.podspec import build_headless_service, build_job_pods, build_stage_pod

        cluster = kubernetes_hosts(run.job_name, config.kubernetes.namespace, config.training.port,
                                   train_replicas(config))
        objects: list[Any] = []
        if self.check_step is not None:
            objects.append(build_stage_pod(config, run, stage_container(config, run, stage, check=True)))
        objects.append(build_headless_service(config, run, stage, run.job_name))
        objects.extend(build_job_pods(config, run, train_containers(config, run, stage, cluster), run.job_name))
        return objects


POD = Pod()
