"""Airflow pools the pipelines name (`training.pool`, `deploy.pool`), and creating the missing ones.

A task in a pool that does not exist is never scheduled and says nothing about it (apache/airflow#795), so
`trainyard pools` (run by `make`, the compose file's init job and the test services) creates every pool a
config names. Existing pools keep their slots: sizing them to the GPUs you have is the operator's call.
"""

from __future__ import annotations

from collections.abc import Iterable

from trainyard.dag.registry import STAGES, Stage
from trainyard_contract.schema import PipelineConfig

DEFAULT_SLOTS = 1


def required_pools(configs: Iterable[PipelineConfig], stages: tuple[Stage, ...] = STAGES) -> dict[str, str]:
    """Pool name -> a description naming the pipelines and stages that use it (each stage declares its pool)."""
    users: dict[str, list[str]] = {}
    for config in configs:
        for stage in stages:
            pool = stage.pool(config)
            if pool:
                users.setdefault(pool, []).append(f"{config.name}.{stage.task_id}")
    return {name: f"Trainyard: {', '.join(sorted(tasks))}" for name, tasks in sorted(users.items())}


def ensure_pools(configs: Iterable[PipelineConfig], slots: int = DEFAULT_SLOTS) -> list[str]:
    """Create each required pool that is missing, with `slots` slots; returns the names created."""
    from airflow.models.pool import Pool

    created = []
    for name, description in required_pools(configs).items():
        if Pool.get_pool(name) is None:
            Pool.create_or_update_pool(name, slots=slots, description=description, include_deferred=False)
            created.append(name)
    return created
