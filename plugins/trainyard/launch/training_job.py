"""Launch one training job through a backend: model check, cluster addresses, replica pods, run to the chief's end.

Shared by the Airflow operator and the fault tests, so both exercise exactly the same path.
"""

from __future__ import annotations

import logging
from typing import Any

from trainyard.dag.registry import Stage
from trainyard.dag.stages import RunContext, stage_container, train_containers, train_replicas
from trainyard.launch.base import Launcher
from trainyard_contract.results import StageResult, read_result
from trainyard_contract.schema import PipelineConfig


def launch_training(config: PipelineConfig, run: RunContext, stage: Stage, launcher: Launcher, log: logging.Logger,
                    context: Any = None, check_args: tuple[str, ...] = ()) -> dict[str, Any] | None:
    """The job stage `stage` of `run`: its one-pod check, then every replica until the chief ends. A check that
    answers `skipped` (nothing new since the served model) ends it there: its result is returned, no replica
    starts."""
    if stage.kind.check_step is not None:
        check = stage_container(config, run, stage, check_args, check=True)
        checked = launcher.run_stage(run, check, log, context)
        skipped = read_result(StageResult, checked or {}, stage.kind.check_step.name).skipped
        if skipped:
            log.info("no training job: %s", skipped)
            return checked
    job = run.job_name
    cluster = launcher.cluster_hosts(job, config.kubernetes.namespace, config.training.port, train_replicas(config))
    log.info("training job %s: cluster %s", job, cluster)
    return launcher.run_job(run, stage, train_containers(config, run, stage, cluster), log)
