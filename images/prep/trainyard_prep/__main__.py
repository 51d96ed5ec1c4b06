"""Entrypoint of the prep image: `python -m trainyard_prep {validate,prepare,pin,merge} --volume ... --run-dir ...`.

`validate` and `prepare` alone are the one-pod data stages. With `prep.parallelism` above 1 the DAG runs `pin`,
then `validate --group G` and `prepare --group G` as mapped tasks (one per file group), then `merge`.

Exit codes: 0 success; 2 usage error; 3 bad input (data or config) that a retry cannot fix; 1 anything else.
"""

from __future__ import annotations

import argparse
import json
import sys
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from trainyard_contract import layout
from trainyard_contract.results import PinResult
from trainyard_contract.runtime import (
    Command,
    StageError,
    add_run_arguments,
    load_trigger,
    log,
    relative_to_volume,
    stage_main,
)
from trainyard_contract.schema import PipelineConfig


def non_negative(text: str) -> int:
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"a group number is 0 or more, not {value}")
    return value


def parser() -> argparse.ArgumentParser:
    root = argparse.ArgumentParser(prog="trainyard_prep", description=__doc__)
    commands = root.add_subparsers(dest="command", required=True)
    for name, text in (("validate", "pin the run's inputs and validate them with Great Expectations (with --group: "
                                    "validate one group of the inputs pin_inputs pinned)"),
                       ("prepare", "split and shard the pinned inputs into TFRecord (with --group: one group's part)"),
                       ("pin", "pin the run's inputs and cut them into prep.parallelism groups (fan-out)"),
                       ("merge", "join the groups' validation and prepared parts (fan-out)")):
        command = commands.add_parser(name, help=text)
        add_run_arguments(command)
        if name in ("validate", "prepare"):
            command.add_argument("--group", type=non_negative, help="the file group of a fanned-out run")
    return root


def validate(args: argparse.Namespace, config: PipelineConfig) -> dict[str, Any]:
    from trainyard_prep.inputs import load_manifest, pin_inputs
    from trainyard_prep.validate import validate_group, validate_inputs

    if args.group is not None:
        summary = validate_group(args.run_dir, config, load_manifest(args.run_dir), args.group)
        return {"group": args.group, "rows": sum(f["rows"] for f in summary["files"]),
                "files": len(summary["files"])}
    manifest = pin_inputs(args.volume, args.run_dir, config.data, args.window_end, load_trigger())
    return validation_result(args, validate_inputs(args.run_dir, config, manifest))


def validation_result(args: argparse.Namespace, summary: dict[str, Any]) -> dict[str, Any]:
    return {"rows": summary["rows"], "files": len(summary["files"]), "expectations": summary["expectations"],
            "results": relative_to_volume(args.volume, args.run_dir / layout.VALIDATION_RESULTS),
            "data_docs": relative_to_volume(args.volume, args.run_dir / layout.DATA_DOCS_INDEX)}


def prepared_result(args: argparse.Namespace, out: dict[str, Any]) -> dict[str, Any]:
    return {"rows": out["rows"], "shards": len(out["shards"]),
            "prepared": relative_to_volume(args.volume, args.run_dir / layout.PREPARED),
            "inputs_sha256": out["inputs"]["sha256"]}


def prepare(args: argparse.Namespace, config: PipelineConfig) -> dict[str, Any]:
    from trainyard_prep.inputs import load_manifest
    from trainyard_prep.prepare import prepare, prepare_group

    if args.group is not None:
        return {"group": args.group, **prepare_group(args.run_dir, config, load_manifest(args.run_dir), args.group)}
    return prepared_result(args, prepare(args.run_dir, config, load_manifest(args.run_dir)))


def pin(args: argparse.Namespace, config: PipelineConfig) -> PinResult:
    from trainyard_prep.groups import write_groups
    from trainyard_prep.inputs import pin_inputs

    manifest = pin_inputs(args.volume, args.run_dir, config.data, args.window_end, load_trigger())
    groups = write_groups(args.run_dir, manifest, config.prep.parallelism)
    for group in groups["groups"]:
        log.info("group %d: %d file(s), %.1f MB", group["index"], len(group["files"]), group["bytes"] / 1e6)
    return PinResult(groups=[g["index"] for g in groups["groups"]], files=len(manifest["files"]),
                     bytes=manifest["total_bytes"])


def merge(args: argparse.Namespace, config: PipelineConfig) -> dict[str, Any]:
    from trainyard_prep.groups import load_groups
    from trainyard_prep.inputs import load_manifest
    from trainyard_prep.prepare import merge_prepared
    from trainyard_prep.validate import finish_validation

    manifest = load_manifest(args.run_dir)
    names = [layout.group_name(g["index"]) for g in load_groups(args.run_dir)["groups"]]
    parts = [args.run_dir / layout.PREPARED_PARTS / n for n in names]
    done = args.run_dir / layout.PREPARED_MANIFEST
    # The validation join (Great Expectations: its import and the Data Docs take seconds) runs beside the shards'
    # join (the kernel's copies and hashing); prepared/ is committed only once validation has passed, and a
    # validation failure is the error reported when both fail.
    with ThreadPoolExecutor(max_workers=1) as pool:
        validation = pool.submit(finish_validation, args.run_dir, config, manifest,
                                 [args.run_dir / layout.VALIDATION_PARTS / n for n in names])
        try:
            if done.is_file() and not any(part.exists() for part in parts):  # merged before; its parts are gone
                log.info("the groups were merged already: %s", done)
                out = json.loads(done.read_text())
            else:
                out = merge_prepared(args.run_dir, config, manifest, parts, before_commit=validation.result)
        except StageError:
            validation.result()
            raise
        summary = validation.result()
    return {**validation_result(args, summary), **prepared_result(args, out)}


COMMANDS = {name: Command(run) for name, run in
            (("validate", validate), ("prepare", prepare), ("pin", pin), ("merge", merge))}


def describe(args: argparse.Namespace) -> str:
    group = getattr(args, "group", None)
    return f" window_end={args.window_end}" + (f" group={group}" if group is not None else "")


def main(argv: list[str] | None = None) -> int:
    return stage_main(parser(), COMMANDS, argv, describe)


if __name__ == "__main__":
    sys.exit(main())
