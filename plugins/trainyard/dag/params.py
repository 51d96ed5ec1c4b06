"""Trigger-form Params and how their values override the config for one run.

The Params' JSON schema (shown and enforced by the Airflow trigger form and REST API) keeps values inside the
config's bounds; `apply_overrides` re-validates through the config schema so a run never sees a value the
schema would refuse.
"""

from __future__ import annotations

from typing import Any

from airflow.sdk import Param
from pydantic import ValidationError

from trainyard_contract.schema import PipelineConfig


class OverrideError(ValueError):
    """A trigger value the config schema refuses; the message names the Param."""


def build_params(config: PipelineConfig) -> dict[str, Param]:
    training = config.training
    return {
        "steps": Param(
            training.steps, type="integer", minimum=1, maximum=10_000_000, title="Training steps",
            description="Number of optimizer steps for this run.",
        ),
        "learning_rate": Param(
            training.learning_rate, type="number", exclusiveMinimum=0, maximum=10, title="Learning rate",
            description="The optimizer's learning rate for this run (above 0, at most 10).",
        ),
        "batch_size": Param(
            training.batch_size, type="integer", minimum=1, maximum=1_000_000, title="Batch size (per worker)",
            description="Examples per step on each worker.",
        ),
        "workers": Param(
            training.workers.replicas, type="integer", minimum=0 if training.strategy == "single" else 1,
            maximum=max(training.workers.upper_bound, training.workers.replicas), title="Worker replicas",
            description=f"Up to workers.max_replicas ({training.workers.upper_bound}) from the config.",
        ),
        "ps": Param(
            training.ps.replicas, type="integer", minimum=0 if training.strategy != "parameter_server" else 1,
            maximum=max(training.ps.upper_bound, training.ps.replicas), title="Parameter server replicas",
            description=f"Up to ps.max_replicas ({training.ps.upper_bound}) from the config.",
        ),
        "window_days": Param(
            config.data.window.days if config.data.window else None, type=["null", "integer"], minimum=1,
            maximum=3650, title="Data window (days)",
            description="Read the partitions of this many days before the data interval end; empty = the config's.",
        ),
        "force_deploy": Param(
            False, type="boolean", title="Force deploy",
            description="Deploy even if the model is not better than the one served (the smoke test still runs).",
        ),
        "force_retrain": Param(
            False, type="boolean", title="Force retrain",
            description="Train even when the pinned inputs and the config are those the served model was trained on "
                        "(otherwise training and deploy are skipped: nothing new to learn).",
        ),
    }


def apply_overrides(config: PipelineConfig, params: dict[str, Any]) -> PipelineConfig:
    """The config for one run: the Params' values folded into it, validated by the config schema again."""
    data = config.model_dump()
    training = data["training"]
    for key in ("steps", "learning_rate", "batch_size"):
        if params.get(key) is not None:
            training[key] = params[key]
    if params.get("workers") is not None:
        training["workers"]["replicas"] = params["workers"]
    if params.get("ps") is not None:
        training["ps"]["replicas"] = params["ps"]
    if params.get("window_days") is not None:
        data["data"]["window"] = {"days": params["window_days"]}
    try:
        return PipelineConfig.model_validate(data)
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in err['loc'])}: {err['msg']}" for err in exc.errors(include_url=False)
        )
        raise OverrideError(f"trigger parameters are not valid for pipeline {config.name!r}: {problems}") from None
