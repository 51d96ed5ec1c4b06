"""The Airflow operator that runs one stage's pod(s) on the configured backend."""

from __future__ import annotations

import datetime as dt
import json
from typing import TYPE_CHECKING, Any, NoReturn

from airflow.providers.standard.operators.branch import BranchMixIn
from airflow.sdk import BaseOperator
from airflow.sdk.exceptions import AirflowFailException, AirflowSkipException

from trainyard.dag.params import apply_overrides
from trainyard.dag.registry import Stage
from trainyard.dag.registry import images as registry_images
from trainyard.dag.stages import RunContext
from trainyard.settings import backend_name
from trainyard_contract.results import StageResult, read_result
from trainyard_contract.schema import PipelineConfig

if TYPE_CHECKING:
    from trainyard.launch.base import Launcher, StageFailed

XCOM_LIMIT_BYTES = 64 * 1024
FAILURE_XCOM = "trainyard_failure"  # the stage's own error, pushed before the task fails (`trainyard run` reads it)
SKIP_XCOM = "trainyard_skip"  # why a stage skipped itself (nothing new to train on), pushed before it skips


def run_context(context: Any, pipeline: str) -> RunContext:
    """The stage-relevant facts of the current Airflow run (data interval; run_after for manual runs)."""
    dag_run = context["dag_run"]
    end = context.get("data_interval_end") or getattr(dag_run, "run_after", None)
    start = context.get("data_interval_start")
    run_type = getattr(dag_run, "run_type", None)
    params = context.get("params") or {}
    return RunContext(
        pipeline=pipeline,
        run_id=dag_run.run_id,
        data_interval_start=start if isinstance(start, dt.datetime) else None,
        data_interval_end=end if isinstance(end, dt.datetime) else None,
        run_type=str(getattr(run_type, "value", run_type)) if run_type is not None else None,
        params=dict(params),  # a ParamsDict resolves each value
    )


def bad_input(exc: StageFailed, stage: Stage) -> AirflowFailException:
    """A stage that said its input is bad (or its volume full or not writable) fails for good: Airflow's retry
    would fail the same way."""
    from trainyard_contract.runtime import EXIT_ENVIRONMENT, EXIT_MEANINGS

    hint = (f"{EXIT_MEANINGS[EXIT_ENVIRONMENT]}; not retried" if exc.exit_code == EXIT_ENVIRONMENT
            else stage.bad_input_hint)
    return AirflowFailException(f"{exc}\n({hint})")


def record_failure(context: Any, exc: StageFailed) -> None:
    """Keep the stage's own message beside the run (an XCom), so `trainyard run` and people can read it without
    digging through the log; never let recording it hide the failure itself."""
    try:
        context["ti"].xcom_push(key=FAILURE_XCOM, value={"message": exc.stage_message[:4000], "cause": exc.cause,
                                                         "retryable": exc.retryable, "exit_code": exc.exit_code})
    except Exception:  # noqa: BLE001 - the task fails with the stage's error either way
        pass


def record_skip(context: Any, reason: str) -> None:
    """Keep why a stage skipped itself beside the run (an XCom), for `trainyard run`'s summary."""
    try:
        context["ti"].xcom_push(key=SKIP_XCOM, value=reason[:4000])
    except Exception:  # noqa: BLE001 - the task is skipped either way
        pass


def checked_result(context: Any, stage: Stage, result: dict[str, Any] | None) -> StageResult:
    """`result` validated against the stage's result model; a stage that skipped itself ends its task skipped,
    with its reason kept for `trainyard run`."""
    typed = read_result(stage.result, result if result is not None else {}, stage.name)
    if typed.skipped:
        record_skip(context, typed.skipped)
        raise AirflowSkipException(f"{stage.task_id} skipped: {typed.skipped}")
    return typed


def stopped_by_user() -> AirflowFailException:
    """Ctrl-C in `trainyard run`: the launcher already stopped the stage's processes; no retry."""
    return AirflowFailException("stopped by Ctrl-C: the stage's processes were stopped; not retried")


def fail(context: Any, exc: StageFailed, stage: Stage) -> NoReturn:
    """Raise the failure Airflow should see for a failed stage (and record its message first)."""
    record_failure(context, exc)
    if not exc.retryable:
        raise bad_input(exc, stage) from exc
    raise exc


class StageOperator(BaseOperator):
    """Builds the stage's pod spec from its declaration, the config and this run, and launches it through the
    backend. Returns the stage's small JSON result (counts, paths, metrics) as XCom; data never travels through
    XCom. A result with a `skipped` reason marks the task skipped (deploy without decide's blessing)."""

    ui_color = "#d6eaf8"

    def __init__(self, *, config: PipelineConfig, stage: Stage, group: int | None = None, **kwargs: Any):
        super().__init__(**kwargs)
        self.config = config
        self.stage = stage
        self.group = group  # the file group of a mapped task (`Stage.maps_over`), passed to the stage as --group
        self._launcher: Launcher | None = None

    def launcher(self, config: PipelineConfig) -> Launcher:
        """The backend's launcher; the local one runs this stage's image as its module (from the declaration)."""
        from trainyard.launch import launcher_for

        self._launcher = launcher_for(backend_name(config.backend), config, registry_images((self.stage,)))
        return self._launcher

    def execute(self, context: Any) -> dict[str, Any] | None:
        from trainyard.dag.stages import stage_container
        from trainyard.launch.base import StageFailed

        config = apply_overrides(self.config, context["params"])
        run = run_context(context, config.name)
        launcher = self.launcher(config)
        extra = self.stage.flags(context["params"])
        if self.stage.needs_serving:
            extra += ("--endpoint", self.ensure_serving(launcher, config))
        spec = stage_container(config, run, self.stage, extra, group=self.group)
        try:
            result = launcher.run_stage(run, spec, self.log, context)
        except StageFailed as exc:
            fail(context, exc, self.stage)
        except KeyboardInterrupt as exc:
            raise stopped_by_user() from exc
        if result is not None and len(json.dumps(result)) > XCOM_LIMIT_BYTES:
            raise ValueError(f"stage {self.stage.name!r} returned more than {XCOM_LIMIT_BYTES} bytes of XCom")
        typed = checked_result(context, self.stage, result)
        if self.stage.result_key is not None:
            self.log.info("%s result: %s", self.stage.task_id, result)
            return getattr(typed, self.stage.result_key)
        return result

    def ensure_serving(self, launcher: Launcher, config: PipelineConfig) -> str:
        """The named step before a stage that talks to serving: make sure the endpoint exists; its address."""
        self.log.info("step: ensure the serving endpoint of model %s", config.model_name)
        endpoint = launcher.ensure_serving(config, self.log)
        self.log.info("serving endpoint: %s", endpoint)
        return endpoint

    def on_kill(self) -> None:
        if self._launcher is not None:
            self._launcher.kill()


class DecideOperator(StageOperator, BranchMixIn):
    """The decide pod, then a branch: `follow` (deploy) when its result's `on` key is true, else `skip` (a
    success)."""

    ui_color = "#e8daef"

    def __init__(self, *, follow: str, skip: str, on: str, **kwargs: Any):
        super().__init__(**kwargs)
        self.follow, self.skip, self.on = follow, skip, on

    def execute(self, context: Any) -> Any:
        decision = super().execute(context) or {}
        go_on = bool(decision.get(self.on))
        self.log.info("decision: %s%s", "DEPLOY" if go_on else "SKIP", " (forced)" if decision.get("forced") else "")
        for reason in decision.get("reasons", []):
            self.log.info("  - %s", reason)
        return self.do_branch(context, self.follow if go_on else self.skip)


class TrainJobOperator(StageOperator):
    """Launches the whole training job (chief + PS + workers) through the backend; succeeds when the chief does.

    First a one-pod model check (a bad model module or params fails before any replica starts), then the job.
    A worker lost mid-training is restarted within `training.restart_budget` (the contract's replica policy); a
    lost PS or chief fails the attempt, and Airflow's retry resumes from the last checkpoint in the run folder.
    """

    ui_color = "#fdebd0"

    def execute(self, context: Any) -> dict[str, Any] | None:
        from trainyard.launch.base import StageFailed
        from trainyard.launch.training_job import launch_training

        config = apply_overrides(self.config, context["params"])
        run = run_context(context, config.name)
        try:
            result = launch_training(config, run, self.stage, self.launcher(config), self.log, context,
                                     check_args=self.stage.flags(context["params"]))
        except StageFailed as exc:
            fail(context, exc, self.stage)
        except KeyboardInterrupt as exc:
            raise stopped_by_user() from exc
        checked_result(context, self.stage, result)
        return result


class TrainTeardownOperator(BaseOperator):
    """Runs after `train` whatever its outcome (trigger rule all_done): deletes replica pods and the headless
    Service a lost training task could not (its worker died with SIGKILL, or the node went away)."""

    ui_color = "#eaeded"

    def __init__(self, *, config: PipelineConfig, stage: Stage, **kwargs: Any):
        super().__init__(trigger_rule="all_done", **kwargs)
        self.config = config
        self.stage = stage

    def execute(self, context: Any) -> int:
        from trainyard.launch import launcher_for
        from trainyard.launch.podspec import job_selector

        run = run_context(context, self.config.name)
        launcher = launcher_for(backend_name(self.config.backend), self.config)
        return launcher.cleanup_job(job_selector(self.config, run, self.stage),
                                    run.job_name, self.log)
