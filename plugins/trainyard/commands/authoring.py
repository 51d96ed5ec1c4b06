"""`trainyard check` (every config, and each model built once on its config's features) and `trainyard new`
(scaffold a pipeline from a sample file)."""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from trainyard import settings
from trainyard.commands.common import EXIT_FAILED, EXIT_OK, EXIT_USAGE
from trainyard.config.loader import (
    check_folder,
    pipeline_files,
)
from trainyard_contract.schema import PipelineConfig


def cmd_check(args: argparse.Namespace) -> int:
    paths: list[Path] = []
    for given in args.paths or [settings.pipelines_dir()]:
        path = Path(given)
        if path.is_dir():
            paths.extend(pipeline_files(path))
        elif path.is_file():
            paths.append(path)
        else:
            print(f"trainyard check: {path}: no such file or folder", file=sys.stderr)
            return EXIT_USAGE
    if not paths:
        print("trainyard check: no pipeline configs (*.yaml) found", file=sys.stderr)
        return EXIT_FAILED
    notices: list[str] = []
    configs, errors = check_folder(paths, notices)
    for line in notices:  # old spellings still read: a warning, not an error
        print(f"warning: {line}", file=sys.stderr)
    from trainyard.commands.scaffold import installed_models_dir, model_module_problem, pairing_problems

    by_name = {path.stem: path for path in paths}
    buildable = []
    failed: set[str] = set()
    models_here = settings.stage_python() == sys.executable
    if models_here and installed_models_dir() is None:
        print("trainyard check: note: model modules not checked: the trainer's package is not installed in this "
              "Airflow (it lives in the training image); set TRAINYARD_STAGE_PYTHON to an interpreter that has it "
              "to check them here")
        configs_to_check: list[PipelineConfig] = []
    else:
        configs_to_check = configs
    for config in configs_to_check:
        problem = model_module_problem(config.training.model.module) if models_here else None
        if problem is not None:
            errors.append(f"{module_location(by_name.get(config.name), config)}: training.model.module: {problem}")
            failed.add(config.name)
        else:
            buildable.append(config)
    if buildable and not args.no_build:
        built = model_build_problems(buildable, by_name)
        errors += [line for _, line in built]
        failed |= {name for name, _ in built}
    if not args.paths:  # the configured folder: each pipeline needs its DAG shim, and each shim its config
        errors += pairing_problems({c.name for c in configs}, dags_folder())
    for line in errors:
        print(line, file=sys.stderr)
    for config in configs:
        if config.name not in failed:
            print(f"ok  {config.name}{model_name_note(config)}")
    if errors:
        print(f"{len(errors)} error(s) in {len(paths)} file(s)", file=sys.stderr)
        return EXIT_FAILED
    return EXIT_OK


def module_location(path: Path | None, config: PipelineConfig) -> str:
    """`FILE:LINE:COL` of a pipeline's `training.model.module` (or of its file when the default is used)."""
    from trainyard.config.loader import display_path
    from trainyard.config.yaml_source import load_yaml_file

    if path is None:
        return config.name
    document = load_yaml_file(path, display_path(path))
    for loc in (("training", "model", "module"), ("training", "model"), ("training",)):
        mark = document.mark_for(loc)
        if mark is not None and loc in document.marks:
            return str(mark)
    return f"{display_path(path)}:1:1"


def model_build_problems(configs: list[PipelineConfig], paths: dict[str, Path]) -> list[tuple[str, str]]:
    """Build each model once on a schema made from its config, in one trainer process (TensorFlow never enters
    this one): a module that fails on the pipeline's features is an error at its config line."""
    import subprocess

    request = json.dumps([config.model_dump_json() for config in configs])
    try:
        done = subprocess.run([settings.stage_python(), "-m", "trainyard_trainer", "check-configs"], input=request,
                              capture_output=True, text=True, timeout=600, env={**os.environ,
                                                                               "TF_CPP_MIN_LOG_LEVEL": "3"})
    except subprocess.TimeoutExpired:
        return [("", "trainyard check: building the models took over 10 minutes (--no-build skips this step)")]
    results = {}
    for line in done.stdout.splitlines():
        if line.startswith("{"):
            entry = json.loads(line)
            results[entry["name"]] = entry
    problems = []
    for config in configs:
        entry = results.get(config.name)
        where = module_location(paths.get(config.name), config)
        if entry is None:
            tail = (done.stderr.strip().splitlines() or ["no output"])[-1]
            problems.append((config.name, f"{where}: training.model.module: the model check did not finish: {tail}"))
        elif entry["error"]:
            problems.append((config.name, f"{where}: training.model.module: {entry['error']}"))
    return problems


def dags_folder() -> Path:
    """The dags folder of this Airflow home (`[core] dags_folder`), where the DAG shims live."""
    from airflow.configuration import conf

    return Path(conf.get("core", "dags_folder"))


def cmd_new(args: argparse.Namespace) -> int:
    from trainyard.commands.scaffold import ScaffoldError, new_pipeline
    from trainyard.commands.serving import server_alive

    try:
        written = new_pipeline(args.name, Path(args.sample) if args.sample else None, args.label,
                               pipelines=settings.pipelines_dir(), dags=dags_folder(), volume=settings.data_dir(),
                               force=args.force, task=args.task, serving_running=server_alive())
    except ScaffoldError as exc:
        print(f"trainyard new: {exc}", file=sys.stderr)
        return EXIT_USAGE
    print(f"trainyard new: config  {written.config}")
    print(f"trainyard new: shim    {written.shim}")
    if written.model is not None:
        print(f"trainyard new: model   {written.model} (training.model.module: "
              f"trainyard_trainer.models.{args.name})")
    if written.data is not None:
        print(f"trainyard new: data    {written.data} (the sample, as today's partition)")
    for note in written.notes:
        print(f"trainyard new: note: {note}")
    print(f"next: trainyard check && trainyard serve --background && trainyard run {args.name} && "
          f"trainyard predict {args.name}")
    return EXIT_OK


def model_name_note(config: PipelineConfig) -> str:
    """Say so when the served model's name is not the pipeline's own (the rule: a DNS label, `_` -> `-`)."""
    if config.deploy.model_name is None and config.model_name != config.name:
        return (f" (serves as model {config.model_name!r}: model names are DNS labels, so `_` becomes `-`; "
                "set deploy.model_name to choose it)")
    return ""


def register(commands: argparse._SubParsersAction) -> None:
    """Add this module's sub-commands to `trainyard`'s parser."""
    check = commands.add_parser("check", help="validate pipeline configs (default: the pipelines folder)")
    check.add_argument("paths", nargs="*", help="config files or folders")
    check.add_argument("--no-build", action="store_true",
                       help="do not build each model on its config's features (that step imports TensorFlow, "
                            "in a subprocess: a few seconds)")
    check.set_defaults(func=cmd_check)
    new = commands.add_parser("new", help="scaffold a pipeline: config (from a sample CSV or Parquet file), DAG shim, "
                              "model module")
    new.add_argument("name", help="the pipeline's name (lowercase, digits, '_')")
    new.add_argument("--from", dest="sample", help="a sample CSV or Parquet file: features, dtypes and ranges are "
                                                   "inferred from it, and it becomes the dataset's first partition")
    new.add_argument("--label", help="the column to predict (required with --from)")
    new.add_argument("--task", choices=["classification", "regression"],
                     help="what the label is (default: regression when its values are not all whole numbers)")
    new.add_argument("--force", action="store_true", help="overwrite files that exist")
    new.set_defaults(func=cmd_new)
