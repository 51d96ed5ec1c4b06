"""`trainyard`: the verbs Airflow has no word for. `check` configs, `run` a pipeline end to end, write example `data`,
`serve` models locally and `predict` through them, create the `pools` the configs name, `mark-data` for
asset-scheduled pipelines, `new` to scaffold a pipeline, `render` a run's manifests, `cleanup` the training jobs on a
cluster whose launcher died.

Exit codes: 0 success, 1 invalid config or failed run, 2 usage error.
"""

# The verbs live in `trainyard.commands`, one module per group; each adds its own sub-commands (`register`). This
# stays one module, not a package with a `__main__.py`: Airflow's plugin manager imports every file under
# `plugins/` by its stem, so a `__main__.py` there once ran as `__main__` inside Airflow processes (`trainyard run`
# started itself again from within `dag.test`). `plugins/.airflowignore` now keeps the loader out of this package
# altogether; a wheel installed into another Airflow's plugins folder would not carry that file.

from __future__ import annotations

import argparse
import sys

from trainyard import settings
from trainyard.commands import authoring, operating, running, serving, streaming
from trainyard.commands.common import EXIT_OK, EXIT_USAGE

MODULES = (authoring, running, serving, streaming, operating)


def build_parser() -> argparse.ArgumentParser:
    root = argparse.ArgumentParser(prog="trainyard", description=__doc__)
    commands = root.add_subparsers(dest="command", required=True)
    for module in MODULES:
        module.register(commands)
    return root


def main(argv: list[str] | None = None) -> int:
    try:
        args = build_parser().parse_args(argv)
    except SystemExit as exc:
        return EXIT_USAGE if exc.code else EXIT_OK
    settings.default_airflow_home()
    return int(args.func(args))


if __name__ == "__main__":
    sys.exit(main())
