"""The verbs for a cluster or a running Airflow: `render` (the manifests of one run), `pools`, `cleanup` (training
jobs whose launcher died) and `mark-data` (an asset event for an asset-scheduled pipeline)."""

from __future__ import annotations

import argparse
import datetime as dt
import sys
from pathlib import Path

from trainyard import settings
from trainyard.commands.common import EXIT_FAILED, EXIT_OK, EXIT_USAGE, load_named
from trainyard.config.loader import (
    check_folder,
    pipeline_files,
)


def cmd_render(args: argparse.Namespace) -> int:
    loaded = load_named(args.pipeline)
    if loaded is None:
        return EXIT_FAILED
    config = loaded[0]
    from trainyard.launch.render import render_run, write_manifests

    run_id = args.run_id or f"manual__{dt.datetime.now(dt.UTC).replace(microsecond=0).isoformat()}"
    manifests = render_run(config, run_id)
    paths = write_manifests(manifests, Path(args.out))
    print(f"trainyard render: {len(paths)} manifest(s) for run {run_id} of {config.name} in {args.out}")
    return EXIT_OK


def cmd_pools(args: argparse.Namespace) -> int:
    """Create the Airflow pools the configs name (a task in a missing pool would wait forever, silently)."""
    configs, errors = check_folder(pipeline_files(settings.pipelines_dir()))
    for line in errors:
        print(line, file=sys.stderr)
    from trainyard.dag.pools import ensure_pools, required_pools

    created = ensure_pools(configs, slots=args.slots)
    for name in required_pools(configs):
        print(f"{'created' if name in created else 'exists '}  {name}")
    return EXIT_FAILED if errors else EXIT_OK


def cmd_cleanup(args: argparse.Namespace) -> int:
    """Delete the training jobs whose launcher died (an expired lease), in every namespace the configs use,
    through each config's Kubernetes connection. Safe to schedule: live jobs renew their lease."""
    import logging

    configs, errors = check_folder(pipeline_files(settings.pipelines_dir()))
    for line in errors:
        print(line, file=sys.stderr)
    if args.pipeline:
        unknown = sorted(set(args.pipeline) - {c.name for c in configs})
        if unknown:
            print(f"trainyard cleanup: no valid pipeline named {', '.join(unknown)}", file=sys.stderr)
            return EXIT_USAGE
        configs = [c for c in configs if c.name in args.pipeline]
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    log = logging.getLogger("trainyard.cleanup")
    from trainyard.launch.kubernetes import KubernetesLauncher

    swept: list[str] = []
    seen: set[tuple[str, str]] = set()
    for config in configs:
        where = (config.kubernetes.connection_id, config.kubernetes.namespace)
        if where in seen:
            continue
        seen.add(where)
        try:
            swept += KubernetesLauncher(config).sweep_expired(log, dry_run=args.dry_run)
        except Exception as exc:  # a connection that is not set up: say which, go on with the others
            print(f"trainyard cleanup: namespace {where[1]} via connection {where[0]!r}: {exc}", file=sys.stderr)
            errors.append(str(exc))
    verb = "would delete" if args.dry_run else "deleted"
    print(f"trainyard cleanup: {verb} {len(swept)} abandoned training job(s){': ' if swept else ''}"
          f"{', '.join(swept)}")
    return EXIT_FAILED if errors else EXIT_OK


def cmd_mark_data(args: argparse.Namespace) -> int:
    """Register new data for an asset-scheduled pipeline through the REST API: Airflow then starts a run."""
    loaded = load_named(args.pipeline)
    if loaded is None:
        return EXIT_FAILED
    config = loaded[0]
    from trainyard_contract.airflow_api import AirflowApi, ApiError
    from trainyard_contract.schema import AssetSchedule

    if not isinstance(config.schedule, AssetSchedule):
        print(f"trainyard mark-data: pipeline {config.name!r} is not scheduled on data "
              f"(schedule: {config.schedule!r}); set `schedule: {{asset: {config.data.source}}}`", file=sys.stderr)
        return EXIT_USAGE
    extra = {"source": "trainyard mark-data", **({"partition": args.partition} if args.partition else {})}
    try:
        event = AirflowApi.from_env(args.api_url).mark_asset(config.schedule.uri, extra)
    except (ApiError, LookupError, OSError) as exc:
        print(f"trainyard mark-data: {exc}", file=sys.stderr)
        return EXIT_FAILED
    print(f"asset event {event['id']} on {config.schedule.uri} at {event['timestamp']}: "
          f"{config.name} will start a run")
    return EXIT_OK


def register(commands: argparse._SubParsersAction) -> None:
    """Add this module's sub-commands to `trainyard`'s parser."""
    render = commands.add_parser("render", help="write every Kubernetes manifest one run would create, as YAML")
    render.add_argument("pipeline")
    render.add_argument("--run-id", help="the Airflow run id to render for (default: a manual run now)")
    render.add_argument("--out", default="rendered", help="output folder (default: ./rendered)")
    render.set_defaults(func=cmd_render)
    pools = commands.add_parser("pools", help="create the Airflow pools the configs name (existing ones are kept)")
    pools.add_argument("--slots", type=int, default=1, help="slots of each pool created (default 1)")
    pools.set_defaults(func=cmd_pools)
    cleanup = commands.add_parser("cleanup", help="delete training jobs on the cluster whose launcher died "
                                  "(no lease renewal for 60 s); schedule it, e.g. every 5 minutes")
    cleanup.add_argument("pipeline", nargs="*", help="only these pipelines' namespaces (default: every config's)")
    cleanup.add_argument("--dry-run", action="store_true", help="list what would be deleted")
    cleanup.set_defaults(func=cmd_cleanup)
    mark = commands.add_parser("mark-data", help="register new data for an asset-scheduled pipeline (REST API)")
    mark.add_argument("pipeline")
    mark.add_argument("--partition", help="the partition that landed (recorded in the event's extra)")
    mark.add_argument("--api-url", help="the api-server (default: $AIRFLOW_API_URL or http://127.0.0.1:8080)")
    mark.set_defaults(func=cmd_mark_data)
