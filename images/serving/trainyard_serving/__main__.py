"""Entrypoint of the serving image.

`python -m trainyard_serving serve --models-dir DIR [--grpc-port 8500] [--rest-port 8501]`: the local server
(TF Serving API subset) for every model folder under DIR.
`python -m trainyard_serving deploy --volume ... --run-dir ...`: the deploy stage (publish, wait, smoke test,
roll back on failure).
Exit codes: 0 success; 2 usage error; 3 bad input; 1 anything else (a failed smoke test, rolled back).
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
import threading
from pathlib import Path
from typing import Any

from trainyard_contract.runtime import (
    EXIT_FAILED,
    EXIT_USAGE,
    Command,
    add_run_arguments,
    stage_main,
)
from trainyard_contract.schema import PipelineConfig
from trainyard_serving.limits import Limits

log = logging.getLogger("trainyard")


def parser() -> argparse.ArgumentParser:
    root = argparse.ArgumentParser(prog="trainyard_serving", description=__doc__)
    commands = root.add_subparsers(dest="command", required=True)
    serve = commands.add_parser("serve", help="serve every model under --models-dir")
    serve.add_argument("--models-dir", type=Path, required=True)
    serve.add_argument("--host", default="127.0.0.1")
    serve.add_argument("--grpc-port", type=int, default=8500)
    serve.add_argument("--rest-port", type=int, default=8501)
    serve.add_argument("--poll-seconds", type=float, default=1.0)
    serve.add_argument("--ready-file", type=Path, help="written with this process's pid once both ports are bound "
                                                        "and the models loaded (how `trainyard serve` knows it is "
                                                        "its own server that answers)")
    Limits.add_arguments(serve)
    deploy = commands.add_parser("deploy", help="publish the run's model as the next version, verify, roll back")
    add_run_arguments(deploy)
    deploy.add_argument("--endpoint", required=True, help="TF Serving gRPC address host:port")
    return root


def serve(args: argparse.Namespace, config: None) -> int:
    from trainyard_serving import grpc_service, rest
    from trainyard_serving.registry import ModelRegistry

    logging.getLogger("trainyard.serving").setLevel(logging.INFO)

    try:
        limits = Limits.from_arguments(args)
    except ValueError as exc:
        log.error("serve: %s", exc)
        return EXIT_USAGE
    settle_leftovers(args.models_dir)
    registry = ModelRegistry(args.models_dir, args.poll_seconds)
    try:  # both ports first: a taken one is an error before anything is served
        grpc_server = grpc_service.make_server(registry, args.host, args.grpc_port, limits)
        http_server = rest.make_server(registry, args.host, args.rest_port, limits)
    except OSError as exc:
        log.error("serve: %s", exc if isinstance(exc, grpc_service.PortTaken)
                  else f"cannot listen for REST on {args.host}:{args.rest_port}: {exc.strerror or exc}")
        return EXIT_FAILED
    registry.start()
    grpc_server.start()
    if args.ready_file is not None:
        from trainyard_contract.atomic import write_bytes

        write_bytes(args.ready_file, f"{os.getpid()}\n".encode())
    stopping = threading.Event()

    def stop(*_: object) -> None:
        stopping.set()
        threading.Thread(target=http_server.shutdown, daemon=True).start()

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    log.info("serving %s: gRPC %s:%d, REST http://%s:%d/v1/models/<name>", args.models_dir, args.host,
             args.grpc_port, args.host, args.rest_port)
    try:
        http_server.serve_forever(poll_interval=0.2)
    finally:
        grpc_server.stop(grace=2).wait()
        registry.stop()
        http_server.server_close()
    return 0


def settle_leftovers(models_dir: Path) -> None:
    """Before serving: remove versions whose deploy died before verifying them (see publishing.py), so a server
    (re)started after a killed deploy never serves an unchecked model."""
    from trainyard_serving.publishing import settle_unverified

    if models_dir.is_dir():
        for model_dir in sorted(p for p in models_dir.iterdir() if p.is_dir() and not p.name.startswith(".")):
            try:
                settle_unverified(model_dir)
            except OSError as exc:  # a read-only mount: serve anyway, the next deploy settles it
                log.warning("cannot check %s for unverified versions (%s); serving it as it is", model_dir, exc)


def run_deploy(args: argparse.Namespace, config: PipelineConfig) -> dict[str, Any]:
    from trainyard_serving.deploy import deploy

    logging.getLogger("trainyard.serving").setLevel(logging.INFO)
    result = deploy(config, args.volume, args.run_dir, args.run_id, args.endpoint)
    if result.get("skipped"):
        log.info("not deployed: %s", result["skipped"])
    return result


COMMANDS = {"serve": Command(serve, needs_config=False), "deploy": Command(run_deploy)}


def main(argv: list[str] | None = None) -> int:
    return stage_main(parser(), COMMANDS, argv)


if __name__ == "__main__":
    sys.exit(main())
