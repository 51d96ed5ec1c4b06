"""The Airflow operator that runs one stage's pod(s) on the configured backend."""

from __future__ import annotations

import datetime as dt
import json
from typing import Any

from airflow.providers.standard.operators.branch import BranchMixIn
from airflow.sdk import BaseOperator
from airflow.sdk.exceptions import AirflowFailException

from trainyard.params import apply_overrides
from trainyard.schema import PipelineConfig
from trainyard.settings import backend_name
from trainyard.stages import RunContext

XCOM_LIMIT_BYTES = 64 * 1024


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


class StageOperator(BaseOperator):
    """Builds the stage's pod spec from the config and this run, and launches it through the backend.

    Returns the stage's small JSON result (counts, paths, metrics) as XCom; data never travels through XCom.
    """

    ui_color = "#d6eaf8"

    def __init__(self, *, config: PipelineConfig, stage: str, **kwargs: Any):
        super().__init__(**kwargs)
        self.config = config
        self.stage = stage
        self._launcher: Any = None

    def execute(self, context: Any) -> dict[str, Any] | None:
        from trainyard.backends import launcher_for
        from trainyard.backends.base import StageFailed
        from trainyard.podspec import build_stage_pod
        from trainyard.stages import stage_container

        config = apply_overrides(self.config, context["params"])
        run = run_context(context, config.name)
        self._launcher = launcher_for(backend_name(config.backend), config)
        extra = self.extra_args(context, config)
        pod = build_stage_pod(config, run, stage_container(config, run, self.stage, extra))
        try:
            result = self._launcher.run_pod(pod, self.log, context)
        except StageFailed as exc:
            if not exc.retryable:
                hint = "(bad input: not retried; fix the data or config and re-run)"
                raise AirflowFailException(f"{exc}\n{hint}") from exc
            raise
        if result is not None and len(json.dumps(result)) > XCOM_LIMIT_BYTES:
            raise ValueError(f"stage {self.stage!r} returned more than {XCOM_LIMIT_BYTES} bytes of XCom")
        return result

    def extra_args(self, context: Any, config: PipelineConfig) -> tuple[str, ...]:
        """Stage arguments that depend on the run: decide's --force, deploy's serving endpoint."""
        if self.stage == "decide" and context["params"].get("force_deploy"):
            return ("--force",)
        if self.stage == "deploy":
            return ("--endpoint", self._launcher.serving_endpoint(config))
        return ()

    def on_kill(self) -> None:
        if self._launcher is not None:
            self._launcher.kill()


class DecideOperator(StageOperator, BranchMixIn):
    """The decide pod, then a branch: `deploy` when the decision says so, else `skip_deploy` (a success)."""

    ui_color = "#e8daef"

    def __init__(self, *, config: PipelineConfig, **kwargs: Any):
        super().__init__(config=config, stage="decide", **kwargs)

    def execute(self, context: Any) -> Any:
        decision = super().execute(context) or {}
        verdict = "DEPLOY" if decision.get("deploy") else "SKIP"
        self.log.info("decision: %s%s", verdict, " (forced)" if decision.get("forced") else "")
        for reason in decision.get("reasons", []):
            self.log.info("  - %s", reason)
        return self.do_branch(context, "deploy" if decision.get("deploy") else "skip_deploy")


class TrainJobOperator(StageOperator):
    """Launches the whole training job (chief + PS + workers) through the backend; succeeds when the chief does.

    First a one-pod model check (a bad model module or params fails before any replica starts), then the job.
    A worker lost mid-training is restarted within `training.restart_budget`; a lost PS or chief fails the attempt,
    and Airflow's retry resumes from the last checkpoint in the run folder.
    """

    ui_color = "#fdebd0"

    def __init__(self, *, config: PipelineConfig, **kwargs: Any):
        super().__init__(config=config, stage="train", **kwargs)

    def execute(self, context: Any) -> dict[str, Any] | None:
        from trainyard.backends import launcher_for
        from trainyard.backends.base import StageFailed
        from trainyard.training_job import launch_training

        config = apply_overrides(self.config, context["params"])
        run = run_context(context, config.name)
        self._launcher = launcher_for(backend_name(config.backend), config)
        try:
            result = launch_training(config, run, self._launcher, self.log, context)
        except StageFailed as exc:
            if not exc.retryable:
                raise AirflowFailException(f"{exc}\n(bad config: not retried; fix training.model and re-run)") from exc
            raise
        return result


class TrainTeardownOperator(BaseOperator):
    """Runs after `train` whatever its outcome (trigger rule all_done): deletes replica pods and the headless
    Service a lost training task could not (its worker died with SIGKILL, or the node went away)."""

    ui_color = "#eaeded"

    def __init__(self, *, config: PipelineConfig, **kwargs: Any):
        super().__init__(trigger_rule="all_done", **kwargs)
        self.config = config

    def execute(self, context: Any) -> int:
        from trainyard.backends import launcher_for
        from trainyard.cluster_spec import job_name
        from trainyard.layout import run_key
        from trainyard.podspec import job_selector

        run = run_context(context, self.config.name)
        launcher = launcher_for(backend_name(self.config.backend), self.config)
        return launcher.cleanup_job(job_selector(self.config, run), job_name(self.config.name, run_key(run.run_id)),
                                    self.log)
