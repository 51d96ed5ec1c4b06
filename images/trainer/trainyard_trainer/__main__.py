"""Entrypoint of the trainer image: `python -m trainyard_trainer {check,train} --volume ... --run-dir ...`.

`check` builds the configured model once (a bad module or params fails before any replica starts). `train` reads
TF_CONFIG once: a `ps` or `worker` task of parameter-server training serves until the job stops it; the `chief`
(or the only process) trains, checkpoints and, alone, exports the SavedModel.
Exit codes: 0 success; 2 usage error; 3 bad input (the model module, its params, or an op of the model refusing a
training batch); 4 the volume is full or not writable; 1 anything else (a lost replica, ...). Every failure ends
with its cause on a marker line (trainyard_contract.runtime.report_error), which the run's summary quotes.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, NoReturn

from trainyard_contract import layout
from trainyard_contract.results import DecideResult
from trainyard_contract.runtime import (
    Command,
    Outcome,
    StageError,
    add_run_arguments,
    relative_to_volume,
    stage_main,
)
from trainyard_contract.schema import PipelineConfig

log = logging.getLogger("trainyard")


def parser() -> argparse.ArgumentParser:
    root = argparse.ArgumentParser(prog="trainyard_trainer", description=__doc__)
    commands = root.add_subparsers(dest="command", required=True)
    check = commands.add_parser("check", help="build the configured model once and exit")
    add_run_arguments(check)
    check.add_argument("--from-config", action="store_true",
                       help="build on a schema made from the config alone (trainyard check: no data needed)")
    check.add_argument("--force-retrain", action="store_true",
                       help="force_retrain: train even when the inputs and config are the served champion's")
    add_run_arguments(commands.add_parser("train", help="run this replica of the training job"))
    add_run_arguments(commands.add_parser("evaluate", help="score the exported model on the eval split"))
    commands.add_parser("check-configs", help="build each model of the configs on stdin (a JSON list) on a schema "
                        "made from its config; one JSON line per config (trainyard check runs this)")
    decide = commands.add_parser("decide", help="decide whether the model is deployed (no TensorFlow)")
    add_run_arguments(decide)
    decide.add_argument("--force", action="store_true", help="force_deploy: skip the comparison")
    return root


def serve_forever(task) -> NoReturn:  # noqa: ANN001 - TaskConfig, imported lazily with TensorFlow
    import tensorflow as tf

    server = tf.distribute.Server(tf.train.ClusterSpec(task.cluster), job_name=task.role, task_index=task.index,
                                  protocol="grpc", start=True)
    log.info("%s %d serving on %s; it runs until the job stops it", task.role, task.index, server.target)
    while True:  # until SIGTERM, which runtime.exit_on_sigterm turns into exit 143 whichever thread receives it
        time.sleep(3600)


def run_check(args: argparse.Namespace, config: PipelineConfig) -> dict[str, Any]:
    from trainyard_trainer.data import load_schema_document
    from trainyard_trainer.model_schema import ModelSchema
    from trainyard_trainer.train import check_model

    schema = (ModelSchema.from_config(config) if args.from_config
              else ModelSchema.from_document(load_schema_document(args.run_dir)))
    result = check_model(config, schema)
    log.info("model check passed: %s", result)
    if not args.from_config and not args.force_retrain:
        from trainyard_trainer.champion import nothing_new

        unchanged = nothing_new(args.run_dir, layout.models_dir(args.volume, config.model_name))
        if unchanged is not None:
            log.info("%s", unchanged)
            result["skipped"] = unchanged
    return result


def run_train(args: argparse.Namespace, config: PipelineConfig) -> Outcome:
    """This replica's part of the job: a ps or worker of parameter-server training serves until the job stops it;
    the chief (or the only process) trains, checkpoints and, alone, exports the model and returns the result."""
    from trainyard_contract.tf_config import read_tf_config
    from trainyard_trainer.data import load_schema_document
    from trainyard_trainer.model_schema import ModelSchema
    from trainyard_trainer.train import train, training_record

    task = read_tf_config()
    log.info("train: strategy=%s task=%s", config.training.strategy,
             f"{task.role}:{task.index}" if task else "single")
    document = load_schema_document(args.run_dir)
    schema = ModelSchema.from_document(document)
    if task is not None and config.training.strategy == "parameter_server" and task.role in ("ps", "worker"):
        serve_forever(task)
    chief = task is None or task.is_chief
    scratch = None if chief else Path(tempfile.mkdtemp(prefix="trainyard-ckpt-"))
    outcome, model = train(config, args.run_dir, task, schema, checkpoint_dir=scratch)
    if not chief:
        return None
    from trainyard_trainer.export import export, plain_copy
    from trainyard_trainer.train import build

    training = training_record(outcome, config)
    export(plain_copy(model, lambda: build(config, schema).model, schema), schema, document,
           args.run_dir / layout.MODEL, training)
    log.info("training finished: %s", training)
    return {**training.model_dump(), "model": relative_to_volume(args.volume, args.run_dir / layout.MODEL)}


def run_check_configs(args: argparse.Namespace, config: None) -> int:
    """For `trainyard check`: one process (TensorFlow imported once) builds every pipeline's model; one JSON line
    per config on stdout, a failing model's as its error."""
    from trainyard_trainer.model_schema import ModelSchema
    from trainyard_trainer.train import check_model

    for raw in json.loads(sys.stdin.read()):
        each = PipelineConfig.model_validate_json(raw)
        try:
            line = {"name": each.name, "error": None, **check_model(each, ModelSchema.from_config(each))}
        except StageError as exc:
            line = {"name": each.name, "error": str(exc)}
        print(json.dumps(line), flush=True)
    return 0


def run_evaluate(args: argparse.Namespace, config: PipelineConfig) -> dict[str, Any]:
    from trainyard_trainer.evaluate import evaluate

    payload = evaluate(config, args.volume, args.run_dir, args.run_id)
    champion = payload["champion"]
    log.info("challenger %s; champion %s", payload["challenger"],
             f"v{champion['version']} {champion['metrics']}" if champion else "none")
    return {"metrics": payload["challenger"], "eval_rows": payload["eval_rows"],
            "champion_version": champion["version"] if champion else None,
            "report": relative_to_volume(args.volume, args.run_dir / layout.REPORT)}


def run_decide(args: argparse.Namespace, config: PipelineConfig) -> DecideResult:
    from trainyard_contract import artifacts
    from trainyard_contract.artifacts import Decision, EvalMetrics, InputsManifest
    from trainyard_contract.atomic import write_bytes
    from trainyard_trainer.decide import decide
    from trainyard_trainer.report import render_report

    evaluated = artifacts.read(args.run_dir, layout.METRICS, EvalMetrics, "evaluate", "decide")
    metrics = evaluated.model_dump(exclude_unset=True)  # the file as evaluate wrote it
    inputs = artifacts.read_if_present(args.run_dir, layout.INPUTS_MANIFEST, InputsManifest, "validate_data",
                                       "decide")
    window_end = inputs.window_end if inputs is not None else None
    decision = Decision(**decide(config, metrics, args.force, window_end))
    artifacts.write(args.run_dir / layout.DECISION, decision)
    # the report now says what was done with the model, and why
    write_bytes(args.run_dir / layout.REPORT, render_report(config, metrics, decision.model_dump()).encode())
    log.info("decision: %s", "DEPLOY" if decision.deploy else "SKIP")
    for reason in decision.reasons:
        log.info("  - %s", reason)
    for reason in decision.held:
        log.info("  (held) %s", reason)
    return DecideResult(deploy=decision.deploy, forced=decision.forced, reasons=decision.reasons)


COMMANDS = {"check": Command(run_check), "train": Command(run_train), "evaluate": Command(run_evaluate),
            "decide": Command(run_decide), "check-configs": Command(run_check_configs, needs_config=False)}


def main(argv: list[str] | None = None) -> int:
    return stage_main(parser(), COMMANDS, argv)


if __name__ == "__main__":
    sys.exit(main())
