"""Entrypoint of the prep image: `python -m trainyard_prep {validate,prepare} --volume ... --run-dir ...`.

Exit codes: 0 success; 2 usage error; 3 bad input (data or config) that a retry cannot fix; 1 anything else.
"""

from __future__ import annotations

import argparse
import sys

from trainyard_contract import layout
from trainyard_contract.runtime import (
    EXIT_BAD_INPUT,
    StageError,
    add_run_arguments,
    load_config,
    load_trigger,
    log,
    parse_args,
    relative_to_volume,
    write_result,
)


def parser() -> argparse.ArgumentParser:
    root = argparse.ArgumentParser(prog="trainyard_prep", description=__doc__)
    commands = root.add_subparsers(dest="command", required=True)
    for name, text in (("validate", "pin the run's inputs and validate them with Great Expectations"),
                       ("prepare", "split and shard the pinned inputs into TFRecord")):
        add_run_arguments(commands.add_parser(name, help=text))
    return root


def main(argv: list[str] | None = None) -> int:
    args = parse_args(parser(), argv)
    if isinstance(args, int):
        return args
    try:
        config = load_config()
        log.info("%s: pipeline=%s run=%s run_dir=%s window_end=%s", args.command, config.name, args.run_id,
                 args.run_dir, args.window_end)
        if args.command == "validate":
            from trainyard_prep.inputs import pin_inputs
            from trainyard_prep.validate import validate_inputs

            manifest = pin_inputs(args.volume, args.run_dir, config.data, args.window_end, load_trigger())
            summary = validate_inputs(args.volume, args.run_dir, args.run_id, config, manifest)
            result = {"rows": summary["rows"], "files": len(summary["files"]),
                      "expectations": summary["expectations"],
                      "results": relative_to_volume(args.volume, args.run_dir / layout.VALIDATION_RESULTS),
                      "data_docs": relative_to_volume(args.volume, args.run_dir / layout.DATA_DOCS_INDEX)}
        else:
            from trainyard_prep.inputs import load_manifest
            from trainyard_prep.prepare import prepare

            out = prepare(args.run_dir, config, load_manifest(args.run_dir))
            result = {"rows": out["rows"], "shards": len(out["shards"]),
                      "prepared": relative_to_volume(args.volume, args.run_dir / layout.PREPARED),
                      "inputs_sha256": out["inputs"]["sha256"]}
    except StageError as exc:
        log.error("%s failed: %s", args.command, exc)
        return EXIT_BAD_INPUT
    write_result(args.xcom, result)
    log.info("%s succeeded: %s", args.command, result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
