"""Launch one training job through a backend: model check, cluster addresses, replica pods, run to the chief's end.

Shared by the Airflow operator and the fault tests, so both exercise exactly the same path.
"""

from __future__ import annotations

import logging
from typing import Any

from trainyard.cluster_spec import job_name
from trainyard.layout import RunLayout
from trainyard.podspec import build_headless_service, build_job_pods, build_stage_pod
from trainyard.schema import PipelineConfig
from trainyard.stages import RunContext, stage_container, train_containers, train_replicas


def launch_training(
    config: PipelineConfig, run: RunContext, launcher: Any, log: logging.Logger, context: Any = None
) -> dict[str, Any] | None:
    layout = RunLayout.for_run(config.kubernetes.volume.mount_path, config.name, run.run_id)
    launcher.run_pod(build_stage_pod(config, run, stage_container(config, run, "check_model")), log, context)
    job = job_name(config.name, layout.key)
    cluster = launcher.cluster_hosts(job, config.kubernetes.namespace, config.training.port, train_replicas(config))
    log.info("training job %s: cluster %s", job, cluster)
    pods = build_job_pods(config, run, train_containers(config, run, cluster), job)
    return launcher.run_job(pods, log, config.training.restart_budget, str(layout.stage_dir("cluster") / "logs"),
                            service=build_headless_service(config, run, job))
