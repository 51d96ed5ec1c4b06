"""The launcher interface every backend implements."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any, Protocol

from trainyard.dag.cluster_spec import Replicas
from trainyard_contract.runtime import is_retryable_exit
from trainyard_contract.schema import PipelineConfig

if TYPE_CHECKING:
    from trainyard.dag.registry import Stage
    from trainyard.dag.stages import ContainerSpec, RunContext


class StageFailed(Exception):
    """A stage's pod or process ended unsuccessfully; the message says how and shows the tail of its output.

    `cause`: the stage's own error, found in its whole output by `trainyard_contract.runtime.CauseTracker` (its
    error marker line, else the exception line of its traceback, else its last ERROR line); it ends the message,
    so the summary and the task log end with it however far above the tail the stage printed it."""

    def __init__(self, message: str, exit_code: int | None = None, cause: str | None = None):
        self.cause = cause.strip() if cause and cause.strip() else None
        super().__init__(f"{message}\ncause: {self.cause}" if self.cause is not None else message)
        self.exit_code = exit_code

    @property
    def stage_message(self) -> str:
        """The stage's own words, for a summary: its cause (`validate failed: ...`; for a training job after how
        it ended: `training job failed: chief exited with code 3: train failed: ...`); without a cause, its ERROR
        lines from the output tail, else the first line of the message."""
        lines = str(self).splitlines()
        if self.cause is not None:  # a stage pod's cause says it all; a job's says which replica ended and how
            return self.cause if lines[0].startswith("pod ") else f"{lines[0]}: {self.cause}"
        errors = [i for i, line in enumerate(lines) if " ERROR " in line]
        if not errors:
            return lines[0] if lines else ""
        own = [line.split(" ERROR ", 1)[1].strip() if " ERROR " in line else line.strip()
               for line in lines[errors[0]:]]
        return "\n".join(line for line in own if line)

    @property
    def retryable(self) -> bool:
        """False when the stage said its input is bad: a retry would fail the same way."""
        return is_retryable_exit(self.exit_code)


class Launcher(Protocol):
    """What a backend does for the operators; `launcher_for` returns one (local processes or Kubernetes pods).

    The seam takes what a stage is (`ContainerSpec`s of a `RunContext`, from `trainyard.dag.stages`), never a
    backend's own objects: each backend builds what it runs from them (the Kubernetes one its pods and the
    job's headless Service through `podspec`, the local one its processes)."""

    def run_stage(self, run: RunContext, spec: ContainerSpec, log: logging.Logger,
                  context: Any = None) -> dict[str, Any] | None:
        """Run one stage container to completion, streaming its output to `log`; return its result (XCom) or None.

        `context` is the Airflow task context (the Kubernetes backend runs KubernetesPodOperator in it)."""
        ...

    def ensure_serving(self, config: PipelineConfig, log: logging.Logger) -> str:
        """Make sure the TF Serving endpoint of `config.model_name` exists (Kubernetes: create or patch its
        Deployment and Service); return its gRPC address. A named step of its own, run before deploy."""
        ...

    def cluster_hosts(self, job: str, namespace: str, port: int, replicas: Replicas) -> dict[str, list[str]]:
        """The address of every replica of a training job, by role (DNS names or local ports)."""
        ...

    def run_job(self, run: RunContext, stage: Stage, specs: list[ContainerSpec],
                log: logging.Logger) -> dict[str, Any] | None:
        """Run the training job of `stage` (one container per replica, named after `run.job_name`) until its
        chief ends, restarting workers within `training.restart_budget`; stop and reap every replica; return the
        chief's result."""
        ...

    def cleanup_job(self, selector: dict[str, str], service: str, log: logging.Logger) -> int:
        """Remove whatever a lost training task left behind (the teardown task); return how many pods."""
        ...

    def kill(self) -> None:
        """Stop whatever this launcher started (called from the operator's on_kill)."""
        ...
