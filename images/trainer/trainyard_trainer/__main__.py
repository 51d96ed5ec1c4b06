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
import logging
import sys
import tempfile
import time
from pathlib import Path
from typing import NoReturn

from trainyard_contract import layout
from trainyard_contract.runtime import (
    EXIT_BAD_INPUT,
    EXIT_ENVIRONMENT,
    StageError,
    add_run_arguments,
    environment_problem,
    load_config,
    parse_args,
    relative_to_volume,
    report_error,
    run_stage,
    write_result,
)

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
    while True:  # not server.join(): a blocking C call would hold off the SIGTERM handler (runtime.exit_on_sigterm)
        time.sleep(3600)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(parser(), argv)
    if isinstance(args, int):
        return args
    if args.command == "decide":
        return run_decide(args)
    if args.command == "check-configs":
        return run_check_configs()
    if args.command == "evaluate":
        return run_evaluate(args)
    from trainyard_contract.tf_config import read_tf_config
    from trainyard_trainer.data import load_schema_document
    from trainyard_trainer.model_schema import ModelSchema
    from trainyard_trainer.train import ModelError, check_model, train, training_record

    try:
        config = load_config()
        task = read_tf_config()
        if args.command == "check" and args.from_config:
            document, schema = None, ModelSchema.from_config(config)
        else:
            document = load_schema_document(args.run_dir)
            schema = ModelSchema.from_document(document)
        log.info("%s: pipeline=%s run=%s strategy=%s task=%s", args.command, config.name, args.run_id,
                 config.training.strategy, f"{task.role}:{task.index}" if task else "single")
        if args.command == "check":
            result = check_model(config, schema)
            log.info("model check passed: %s", result)
            if not args.from_config and not args.force_retrain:
                from trainyard_trainer.champion import nothing_new

                unchanged = nothing_new(args.run_dir, layout.models_dir(args.volume, config.model_name))
                if unchanged is not None:
                    log.info("%s", unchanged)
                    result["skipped"] = unchanged
            write_result(args.xcom, result)
            return 0
        if task is not None and config.training.strategy == "parameter_server" and task.role in ("ps", "worker"):
            return serve_forever(task)
        chief = task is None or task.is_chief
        scratch = None if chief else Path(tempfile.mkdtemp(prefix="trainyard-ckpt-"))
        outcome, model = train(config, args.run_dir, task, schema, checkpoint_dir=scratch)
        if not chief:
            return 0
        from trainyard_trainer.export import export, plain_copy
        from trainyard_trainer.train import build

        training = training_record(outcome, config)
        export(plain_copy(model, lambda: build(config, schema).model, schema), schema, document,
               args.run_dir / layout.MODEL, training)
        write_result(args.xcom, {**training, "model": relative_to_volume(args.volume, args.run_dir / layout.MODEL)})
        log.info("training finished: %s", training)
        return 0
    except (ModelError, StageError, FileNotFoundError, ValueError) as exc:
        problem = environment_problem(exc)
        if problem is not None:  # a checkpoint or export that met a full or read-only volume
            return report_error(f"{args.command} failed: {problem}: {exc}", EXIT_ENVIRONMENT)
        return report_error(f"{args.command} failed: {exc}", EXIT_BAD_INPUT)


def run_check_configs() -> int:
    """For `trainyard check`: one process (TensorFlow imported once) builds every pipeline's model."""
    import json

    from trainyard_contract.schema import PipelineConfig
    from trainyard_trainer.model_schema import ModelSchema
    from trainyard_trainer.train import ModelError, check_model

    for raw in json.loads(sys.stdin.read()):
        config = PipelineConfig.model_validate_json(raw)
        try:
            result = check_model(config, ModelSchema.from_config(config))
            line = {"name": config.name, "error": None, **result}
        except (ModelError, ValueError) as exc:
            line = {"name": config.name, "error": str(exc)}
        print(json.dumps(line), flush=True)
    return 0


def run_evaluate(args: argparse.Namespace) -> int:
    from trainyard_trainer.evaluate import evaluate

    try:
        config = load_config()
        payload = evaluate(config, args.volume, args.run_dir, args.run_id)
    except (StageError, FileNotFoundError) as exc:
        return report_error(f"evaluate failed: {exc}", EXIT_BAD_INPUT)
    champion = payload["champion"]
    log.info("challenger %s; champion %s", payload["challenger"],
             f"v{champion['version']} {champion['metrics']}" if champion else "none")
    write_result(args.xcom, {"metrics": payload["challenger"], "eval_rows": payload["eval_rows"],
                             "champion_version": champion["version"] if champion else None,
                             "report": relative_to_volume(args.volume, args.run_dir / layout.REPORT)})
    return 0


def run_decide(args: argparse.Namespace) -> int:
    import json

    from trainyard_contract.atomic import write_json
    from trainyard_trainer.decide import decide

    try:
        config = load_config()
        metrics_path = args.run_dir / layout.METRICS
        if not metrics_path.is_file():
            raise StageError(f"{metrics_path} is missing: evaluate must run before decide")
        inputs_path = args.run_dir / layout.INPUTS_MANIFEST
        window_end = json.loads(inputs_path.read_text()).get("window_end") if inputs_path.is_file() else None
        decision = decide(config, json.loads(metrics_path.read_text()), args.force, window_end)
    except StageError as exc:
        return report_error(f"decide failed: {exc}", EXIT_BAD_INPUT)
    write_json(args.run_dir / layout.DECISION, decision)
    from trainyard_contract.atomic import write_bytes
    from trainyard_trainer.report import render_report

    # the report now says what was done with the model, and why
    write_bytes(args.run_dir / layout.REPORT,
                render_report(config, json.loads(metrics_path.read_text()), decision).encode())
    log.info("decision: %s", "DEPLOY" if decision["deploy"] else "SKIP")
    for reason in decision["reasons"]:
        log.info("  - %s", reason)
    for reason in decision.get("held", []):
        log.info("  (held) %s", reason)
    write_result(args.xcom, {"deploy": decision["deploy"], "forced": decision["forced"],
                             "reasons": decision["reasons"]})
    return 0


if __name__ == "__main__":
    sys.exit(run_stage(main))
