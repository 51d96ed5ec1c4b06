"""The stage registry: one declaration per stage, from which everything else is derived.

The DAG factory builds one task per declaration (in order, with the operator its `kind` gives), `stages.py` builds
each stage's container from it, `trainyard render` renders its pods, the local backend maps images to modules
through `images()`, and the DAG docs list what each stage reads and writes. Adding a stage is one declaration here
plus one sub-command in an image's entrypoint (README, "Add a stage"). Pure data: no Airflow, no I/O.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

from trainyard.dag.stage_kinds import POD, Branch, Job, Pod
from trainyard_contract import layout as L
from trainyard_contract.layout import Artifact
from trainyard_contract.results import DecideResult, PinResult, StageResult
from trainyard_contract.schema import STAGE_SECTIONS, PipelineConfig, StageRuntime

Hardware = Literal["cpu", "gpu"]


@dataclass(frozen=True)
class StageImage:
    """One of Trainyard's images: its repository, the Python module its entrypoint runs (`python -m`), and the
    environment its processes need (every pod of the image gets it, on both backends)."""

    repository: str
    module: str
    env: tuple[tuple[str, str], ...] = ()  # (name, value) pairs: hashable, as the declarations are


# The data stages allocate and free a chunk's arrays (tens of MB) over and over. glibc hands blocks that large
# back to the kernel on free (munmap, or a trim of the heap's top), so every chunk first-touches fresh pages again:
# a page fault and zeroing per 4 KB, which on a VM with free page reporting (this project's CI machine) costs
# ~30 µs a page and made up a third of prepare's cast and statistics time. Keeping freed memory in the process
# reuses it; peak RSS is unchanged (bench/prep_bench.py measures both, its plain read under the same setting).
KEEP_FREED_MEMORY = (("MALLOC_MMAP_THRESHOLD_", str(2**32)), ("MALLOC_TRIM_THRESHOLD_", str(2**32)))

PREP = StageImage("trainyard/prep", "trainyard_prep", KEEP_FREED_MEMORY)
TRAINER = StageImage("trainyard/trainer", "trainyard_trainer")
EVALUATE = StageImage("trainyard/evaluate", "trainyard_trainer")
SERVING = StageImage("trainyard/serving", "trainyard_serving")


def runtime_of(section: str) -> Callable[[PipelineConfig], StageRuntime]:
    """The runtime a stage takes from its config section (`prep.runtime`, `training.runtime`, ...)."""
    if section not in STAGE_SECTIONS:
        raise ValueError(f"{section!r} is not a stage section of the config ({', '.join(STAGE_SECTIONS)})")
    return lambda config: getattr(config, section).runtime


def _no_pool(config: PipelineConfig) -> str | None:
    return None


def _no_flags(params: Mapping[str, Any]) -> tuple[str, ...]:
    return ()


def _default_retries(config: PipelineConfig) -> int:
    return config.retries


def _always(config: PipelineConfig) -> bool:
    return True


def _fans_out(config: PipelineConfig) -> bool:
    return config.prep.fans_out


@dataclass(frozen=True)
class Stage:
    """One stage: an Airflow task that runs `python -m <image.module> <command>` in a pod of `image`.

    kind (stage_kinds.py): `POD` (one pod), `Branch(on=key)` (one pod, then follow the next stage when the result's
    `key` is true, else `skip_<next>`), `Job(check_command=..., check_name=...)` (a one-pod check first, then the
    distributed training job, and a `teardown_<task_id>` task that sweeps what a lost attempt left). The kind checks
    the declaration when it is made.

    Fan-out: a stage with `maps_over` becomes an Airflow dynamically mapped task when the stage it names is in the
    DAG: one task, and one pod, per item of that stage's result (`result_key`), each run with `--group <item>`.
    `only_if` leaves a stage out of configs that do not need it (the fan-out's pin and merge stages).
    """

    task_id: str
    name: str  # the `trainyard/stage` label and the key in logs
    image: StageImage
    command: str  # the sub-command of the image's entrypoint
    kind: Pod
    hardware: Hardware
    doc: str
    runtime: Callable[[PipelineConfig], StageRuntime]  # image (as configured), resources, env of its pods
    reads: tuple[Artifact, ...] = ()
    writes: tuple[Artifact, ...] = ()
    pool: Callable[[PipelineConfig], str | None] = _no_pool
    retries: Callable[[PipelineConfig], int] = _default_retries
    flags: Callable[[Mapping[str, Any]], tuple[str, ...]] = _no_flags  # arguments from the trigger's Params
    needs_serving: bool = False  # the serving endpoint is ensured first and passed as `--endpoint`
    bad_input_hint: str = "bad input: not retried; fix the data or config and re-run"
    timeout: Callable[[PipelineConfig], dt.timedelta | None] = lambda c: None  # the task's execution_timeout
    only_if: Callable[[PipelineConfig], bool] = _always  # whether the stage is in this config's DAG
    maps_over: str | None = None  # the task_id whose result list this stage is mapped over, when it is present
    result_key: str | None = None  # the key of the stage's result that is the task's XCom (what others map over)
    result: type[StageResult] = StageResult  # what its result line holds; the operator validates it

    def __post_init__(self) -> None:
        self.kind.check(self)

    def stage_names(self) -> tuple[str, ...]:
        """Every `trainyard/stage` label this stage's pods carry (a job's check pod has its own)."""
        step = self.kind.check_step
        return (step.name, self.name) if step else (self.name,)


def _force_flag(params: Mapping[str, Any]) -> tuple[str, ...]:
    return ("--force",) if params.get("force_deploy") else ()


def _retrain_flag(params: Mapping[str, Any]) -> tuple[str, ...]:
    return ("--force-retrain",) if params.get("force_retrain") else ()


STAGES: tuple[Stage, ...] = (
    Stage(
        task_id="pin_inputs", name="pin", image=PREP, command="pin", kind=POD, hardware="cpu",
        doc="Pins the run's input partitions and cuts the files into `prep.parallelism` groups (fan-out only).",
        runtime=runtime_of("prep"),
        writes=(L.INPUTS_MANIFEST, L.INPUT_GROUPS), only_if=_fans_out, result_key="groups", result=PinResult,
    ),
    Stage(
        task_id="validate_data", name="validate", image=PREP, command="validate", kind=POD, hardware="cpu",
        doc="Great Expectations suite from the config on the run's input partitions.",
        runtime=runtime_of("prep"),
        writes=(L.INPUTS_MANIFEST, L.VALIDATION_PARTS, L.VALIDATION_RESULTS, L.DATA_DOCS),
        maps_over="pin_inputs",
    ),
    Stage(
        task_id="prepare_data", name="prepare", image=PREP, command="prepare", kind=POD, hardware="cpu",
        doc="Deterministic split into TFRecord shards with schema, stats and manifest.",
        runtime=runtime_of("prep"),
        reads=(L.INPUTS_MANIFEST,),
        writes=(L.PREPARED_PARTS, L.PREPARED_SCHEMA, L.PREPARED_STATS, L.PREPARED_MANIFEST),
        maps_over="pin_inputs",
    ),
    Stage(
        task_id="merge_data", name="merge", image=PREP, command="merge", kind=POD, hardware="cpu",
        doc="Joins the groups: one validation result and Data Docs site, the table-level checks, the shards in "
            "file order, statistics, schema and manifest (fan-out only).",
        runtime=runtime_of("prep"),
        reads=(L.INPUTS_MANIFEST, L.INPUT_GROUPS, L.VALIDATION_PARTS, L.PREPARED_PARTS),
        writes=(L.VALIDATION_RESULTS, L.DATA_DOCS, L.PREPARED_SCHEMA, L.PREPARED_STATS, L.PREPARED_MANIFEST),
        only_if=_fans_out,
    ),
    Stage(
        task_id="train", name="train", image=TRAINER, command="train", hardware="gpu",
        kind=Job(check_command="check", check_name="check_model"),
        doc="Distributed TensorFlow job (chief + parameter servers + workers); exports the SavedModel.",
        runtime=runtime_of("training"),
        reads=(L.PREPARED_SCHEMA, L.PREPARED_STATS, L.PREPARED_MANIFEST),
        writes=(L.CHECKPOINTS, L.CLUSTER_LOGS, L.TENSORBOARD_TRAIN, L.SAVED_MODEL, L.MODEL_SCHEMA,
                L.TRAINING_RECORD),
        pool=lambda c: c.training.pool, timeout=lambda c: dt.timedelta(minutes=c.training.timeout_minutes),
        flags=_retrain_flag,  # a job's flags go to its check
        bad_input_hint="bad config: not retried; fix training.model and re-run",
    ),
    Stage(
        task_id="evaluate", name="evaluate", image=EVALUATE, command="evaluate", kind=POD, hardware="cpu",
        doc="The new and the served model scored on the same eval rows; bootstrap of the change; report.",
        runtime=runtime_of("evaluation"),
        reads=(L.PREPARED_MANIFEST, L.SAVED_MODEL, L.MODEL_SCHEMA, L.TENSORBOARD_TRAIN),
        writes=(L.METRICS, L.SMOKE_SET, L.REPORT),
    ),
    Stage(
        task_id="decide", name="decide", image=EVALUATE, command="decide", kind=Branch(on="deploy"),
        hardware="cpu",
        doc="Thresholds met and better than the champion (or forced): deploy, else skip; reasons logged.",
        runtime=runtime_of("evaluation"),
        reads=(L.METRICS, L.INPUTS_MANIFEST), writes=(L.DECISION,), result=DecideResult,
        flags=_force_flag,
    ),
    Stage(
        task_id="deploy", name="deploy", image=SERVING, command="deploy", kind=POD, hardware="cpu",
        doc="Only with decide's blessing: publish version N+1, wait until AVAILABLE, smoke-test Predict, "
            "roll back on failure.",
        runtime=runtime_of("deploy"),
        reads=(L.DECISION, L.SAVED_MODEL, L.SMOKE_SET, L.METRICS, L.INPUTS_MANIFEST, L.PREPARED_MANIFEST,
               L.TRAINING_RECORD, L.MODEL_SCHEMA),
        writes=(L.DEPLOY_RESULT,),
        pool=lambda c: c.deploy.pool, needs_serving=True,
    ),
)


def stages_for(config: PipelineConfig, stages: Iterable[Stage] = STAGES) -> tuple[Stage, ...]:
    """The stages in `config`'s DAG, in order (those whose `only_if` holds)."""
    return tuple(stage for stage in stages if stage.only_if(config))


def wiring_problems(stages: Iterable[Stage]) -> list[str]:
    """What a DAG of `stages` (in order) would read before any stage of it writes it: each stage's `reads` must
    be among the `writes` of the stages before it. Empty when the wiring holds (tests/unit/test_registry_wiring.py
    checks every shape of DAG the configs can build)."""
    written: set[Artifact] = set()
    problems = []
    for stage in stages:
        problems += [f"{stage.task_id} reads {artifact}, which no stage before it writes"
                     for artifact in stage.reads if artifact not in written]
        written.update(stage.writes)
    return problems


def mapped_over(stage: Stage, present: Iterable[Stage]) -> Stage | None:
    """The stage `stage` is mapped over in a DAG of the `present` stages, or None (one plain task)."""
    if stage.maps_over is None:
        return None
    return next((s for s in present if s.task_id == stage.maps_over), None)


def images(stages: Iterable[Stage] = STAGES) -> dict[str, str]:
    """Image repository -> entrypoint module, for every image the stages use (the local backend's map)."""
    table: dict[str, str] = {}
    for stage in stages:
        known = table.setdefault(stage.image.repository, stage.image.module)
        if known != stage.image.module:
            raise ValueError(f"image {stage.image.repository!r} is declared with two modules: {known}, "
                             f"{stage.image.module}")
    return table


def stage_named(name: str, stages: Iterable[Stage] = STAGES) -> Stage:
    for stage in stages:
        if name in (stage.name, stage.task_id):
            return stage
    known = ", ".join(s.name for s in stages)
    raise ValueError(f"unknown stage {name!r}; known: {known}")
