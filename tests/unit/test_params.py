"""Trigger Params and how they override one run's config."""

from __future__ import annotations

from pathlib import Path

import pytest

from trainyard.config.loader import load_pipeline_file
from trainyard.dag.params import OverrideError, apply_overrides, build_params


def test_params_carry_config_defaults_and_bounds(pipelines_dir: Path) -> None:
    config = load_pipeline_file(pipelines_dir / "digits.yaml")
    params = build_params(config)
    assert params["steps"].value == 300
    assert params["workers"].schema["maximum"] == 4  # workers.max_replicas
    assert params["workers"].schema["minimum"] == 1
    assert params["force_deploy"].value is False
    assert params["window_days"].value is None
    # every Param is titled and described on the trigger form
    assert all(p.schema.get("title") and p.description for p in params.values())


def test_overrides_reach_the_run_config(pipelines_dir: Path) -> None:
    config = load_pipeline_file(pipelines_dir / "digits.yaml")
    run = apply_overrides(config, {"steps": 50, "workers": 3, "learning_rate": 0.1, "window_days": 2})
    assert (run.training.steps, run.training.workers.replicas, run.training.learning_rate) == (50, 3, 0.1)
    assert run.data.window is not None and run.data.window.days == 2
    assert config.training.steps == 300  # the parsed config is untouched


def test_invalid_override_is_refused_by_the_schema(pipelines_dir: Path) -> None:
    config = load_pipeline_file(pipelines_dir / "digits.yaml")
    with pytest.raises(OverrideError, match="training.steps"):
        apply_overrides(config, {"steps": 0})
