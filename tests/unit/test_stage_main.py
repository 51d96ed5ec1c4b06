"""Every image entrypoint has one shape (`runtime.stage_main`): its commands are the registry's, a typed failure
decides the exit code, and an unexpected exception stays a retryable failure with its traceback."""

from __future__ import annotations

import importlib
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from trainyard.dag.registry import STAGES
from trainyard_contract.runtime import (
    CONFIG_ENV,
    ERROR_MARKER,
    EXIT_BAD_INPUT,
    EXIT_ENVIRONMENT,
    EXIT_FAILED,
    RESULT_MARKER,
    command_names,
    failure_cause,
)
from trainyard_contract.schema import PipelineConfig

CONFIG = PipelineConfig.model_validate({"name": "p", "data": {
    "source": "d", "label": {"name": "y", "classes": [0, 1]}, "features": [{"name": "a"}]}})
ENTRYPOINTS = ("trainyard_prep", "trainyard_trainer", "trainyard_serving")


@pytest.mark.parametrize("package", ENTRYPOINTS)
def test_each_entrypoint_runs_exactly_the_commands_its_parser_accepts(package: str) -> None:
    entry = importlib.import_module(f"{package}.__main__")
    assert set(entry.COMMANDS) == command_names(entry.parser())
    assert set(entry.COMMANDS)  # a parser without sub-commands would make the line above vacuous


def test_every_command_the_registry_names_exists_in_its_image() -> None:
    named = [(stage.image.module, command) for stage in STAGES for command in stage.kind.commands(stage)]
    assert len(named) > len(STAGES)  # the job's check command is among them
    missing = [f"{module} {command}" for module, command in named
               if command not in importlib.import_module(f"{module}.__main__").COMMANDS]
    assert missing == []


ENTRYPOINT = textwrap.dedent("""
    import argparse, errno, sys
    from trainyard_contract.runtime import Command, StageError, StageFailure, add_run_arguments, stage_main

    class RolledBack(StageFailure):
        outcome = "failed and was rolled back"

    def bad(args, config):
        raise StageError("column 'a' holds text")

    def bug(args, config):
        raise ValueError("an internal mistake")

    def rolled_back(args, config):
        raise RolledBack("version 3 did not load")

    def full(args, config):
        try:
            raise OSError(errno.ENOSPC, "No space left on device", "/data/x")
        except OSError as exc:
            raise StageError("the export could not be written") from exc

    def ok(args, config):
        return {"rows": 3, "pipeline": config.name if config else None}

    def quiet(args, config):
        return None

    def typed(args, config):
        from trainyard_contract.results import DecideResult
        return DecideResult(deploy=False, reasons=["worse"])

    commands = {"bad": Command(bad, needs_config=False), "bug": Command(bug, needs_config=False),
                "rolled_back": Command(rolled_back, needs_config=False), "full": Command(full, needs_config=False),
                "ok": Command(ok), "quiet": Command(quiet, needs_config=False),
                "typed": Command(typed, needs_config=False)}
    parser = argparse.ArgumentParser()
    sub = parser.add_subparsers(dest="command", required=True)
    for name in commands:
        add_run_arguments(sub.add_parser(name))
    sys.exit(stage_main(parser, commands))
""")


def run_entrypoint(command: str, tmp_path: Path, config: str | None = None) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != CONFIG_ENV}
    if config is not None:
        env[CONFIG_ENV] = config
    return subprocess.run([sys.executable, "-c", ENTRYPOINT, command, "--volume", str(tmp_path), "--run-dir",
                           str(tmp_path / "run"), "--run-id", "r", "--xcom", str(tmp_path / "return.json")],
                          capture_output=True, text=True, timeout=60, env=env)


@pytest.mark.parametrize(("command", "code", "cause"), [
    ("bad", EXIT_BAD_INPUT, "bad failed: column 'a' holds text"),
    ("rolled_back", EXIT_FAILED, "rolled_back failed and was rolled back: version 3 did not load"),
    ("full", EXIT_ENVIRONMENT, "full failed: out of space: the export could not be written"),
    ("bug", EXIT_FAILED, "ValueError: an internal mistake"),
])
def test_a_failure_type_decides_the_exit_code_and_the_cause(command: str, code: int, cause: str,
                                                            tmp_path: Path) -> None:
    done = run_entrypoint(command, tmp_path)
    assert done.returncode == code, done.stdout + done.stderr
    assert done.stdout.splitlines()[-1].startswith(ERROR_MARKER)
    assert failure_cause((done.stdout + done.stderr).splitlines()) == cause
    # only an exception no stage raised on purpose is logged with its traceback
    assert ("Traceback (most recent call last)" in done.stderr) == (command == "bug")
    assert not (tmp_path / "return.json").exists()


def test_a_result_is_written_and_printed_once(tmp_path: Path) -> None:
    config = CONFIG
    done = run_entrypoint("ok", tmp_path, config.model_dump_json())
    assert done.returncode == 0, done.stdout + done.stderr
    assert json.loads((tmp_path / "return.json").read_text()) == {"rows": 3, "pipeline": "p"}
    markers = [line for line in done.stdout.splitlines() if line.startswith(RESULT_MARKER)]
    assert [json.loads(line[len(RESULT_MARKER):]) for line in markers] == [{"pipeline": "p", "rows": 3}]
    quiet = run_entrypoint("quiet", tmp_path / "q")
    assert quiet.returncode == 0 and RESULT_MARKER not in quiet.stdout


def test_a_typed_result_is_written_as_what_the_stage_set(tmp_path: Path) -> None:
    done = run_entrypoint("typed", tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    assert json.loads((tmp_path / "return.json").read_text()) == {"deploy": False, "reasons": ["worse"]}


@pytest.mark.parametrize(("config", "says"), [
    (None, f"{CONFIG_ENV} is not set"),
    ('{"name": "p"}', f"{CONFIG_ENV} is not a config this image accepts"),
    ("not json", f"{CONFIG_ENV} is not a config this image accepts"),
])
def test_a_missing_or_invalid_config_is_bad_input(config: str | None, says: str, tmp_path: Path) -> None:
    done = run_entrypoint("ok", tmp_path, config)
    assert done.returncode == EXIT_BAD_INPUT, done.stdout + done.stderr
    assert failure_cause(done.stdout.splitlines()).startswith(f"ok failed: {says}")


def test_the_trainer_no_longer_calls_an_internal_value_error_bad_input(monkeypatch: pytest.MonkeyPatch,
                                                                      tmp_path: Path) -> None:
    """The trainer used to map every ValueError and FileNotFoundError to 'bad input' (exit 3, never retried), so
    a bug in Trainyard read as the user's fault; now only StageError (ModelError among them) is bad input."""
    import trainyard_contract.tf_config
    from trainyard_trainer.__main__ import main

    def broken(environ: object = None) -> None:
        raise ValueError("an internal mistake")

    config = CONFIG
    monkeypatch.setenv(CONFIG_ENV, config.model_dump_json())
    monkeypatch.setattr(trainyard_contract.tf_config, "read_tf_config", broken)
    args = ["train", "--volume", str(tmp_path), "--run-dir", str(tmp_path / "run"), "--run-id", "r"]
    assert main(args) == EXIT_FAILED
    # what the user must fix is still bad input: the prepared data is missing
    monkeypatch.undo()
    monkeypatch.setenv(CONFIG_ENV, config.model_dump_json())
    assert main(args) == EXIT_BAD_INPUT
