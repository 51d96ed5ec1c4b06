"""Entrypoint of the stream image.

`python -m trainyard_stream score --endpoint HOST:PORT`: the stream scorer of the pipeline in TRAINYARD_CONFIG.
`python -m trainyard_stream land --volume DIR`: the stream lander (the config's `stream.land`).
Both run until SIGTERM (which drains the batch in hand) and exit 0; a broker that cannot be reached at start is one
line and exit 1; a config without `stream:` (or `stream.land:`) is a usage error (2).
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
import threading
from pathlib import Path

from trainyard_contract.runtime import EXIT_FAILED, EXIT_OK, EXIT_USAGE, load_config, parse_args, run_stage
from trainyard_contract.schema import PipelineConfig

log = logging.getLogger("trainyard")


def parser() -> argparse.ArgumentParser:
    root = argparse.ArgumentParser(prog="trainyard_stream", description=__doc__,
                                   formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = root.add_subparsers(dest="command", required=True)
    score = commands.add_parser("score", help="score the source stream through the served model")
    score.add_argument("--endpoint", required=True, help="TF Serving gRPC address host:port")
    land = commands.add_parser("land", help="land the labelled stream as the pipeline's daily partitions")
    land.add_argument("--volume", required=True, type=Path, help="root of the shared volume")
    return root


def drain_on_sigterm() -> threading.Event:
    """SIGTERM (and SIGINT) set the returned event: the loop finishes the batch in hand and returns."""
    stop = threading.Event()

    def handle(signum: int, frame: object) -> None:
        log.info("%s: finishing the batch in hand, then stopping", signal.Signals(signum).name)
        stop.set()

    signal.signal(signal.SIGTERM, handle)
    signal.signal(signal.SIGINT, handle)
    return stop


def connect(config: PipelineConfig):  # noqa: ANN201 - a RedisBroker (redis imported here, not at module level)
    from trainyard_stream.broker import RedisBroker

    assert config.stream is not None
    password = None
    if config.stream.password is not None:
        password = os.environ.get(config.stream.password.env)
        if password is None:
            raise SystemExit(f"stream.password: the environment variable {config.stream.password.env} is not set "
                             "(in the cluster it comes from the Secret the config names)")
    return RedisBroker(config.stream.broker, password)


def asset_marker(config: PipelineConfig):  # noqa: ANN201
    """How the lander registers new data: the pipeline's Asset event over Airflow's REST API (`land.airflow_api_url`
    or AIRFLOW_API_URL; AIRFLOW_API_TOKEN or AIRFLOW_USERNAME/AIRFLOW_PASSWORD), or None when the pipeline is not
    scheduled on data."""
    from trainyard_contract.schema import AssetSchedule

    schedule = config.schedule
    if not isinstance(schedule, AssetSchedule):
        log.info("the pipeline is not scheduled on its data (schedule: %r): no asset event is registered",
                 schedule)
        return None
    from trainyard_contract.airflow_api import AirflowApi

    assert config.stream is not None and config.stream.land is not None
    url = config.stream.land.airflow_api_url

    def mark(extra: dict) -> object:
        return AirflowApi.from_env(url).mark_asset(schedule.uri, extra)

    return mark


def main(argv: list[str] | None = None) -> int:
    args = parse_args(parser(), argv)
    if isinstance(args, int):
        return args
    stop = drain_on_sigterm()
    config = load_config()
    if config.stream is None or (args.command == "land" and config.stream.land is None):
        section = "stream" if config.stream is None else "stream.land"
        print(f"trainyard_stream {args.command}: pipeline {config.name!r} has no `{section}:` section",
              file=sys.stderr)
        return EXIT_USAGE
    import redis

    from trainyard_stream.broker import BrokerDown, Stopped, consumer_name

    logging.getLogger("trainyard.stream").setLevel(logging.INFO)
    broker = connect(config)
    try:
        broker.ping()
    except BrokerDown as exc:
        print(f"trainyard_stream {args.command}: cannot reach the broker {exc}", file=sys.stderr)
        return EXIT_FAILED
    try:
        if args.command == "score":
            from trainyard_stream.scorer import Scorer
            from trainyard_stream.serving_client import ServingClient

            client = ServingClient(args.endpoint, config.model_name)
            Scorer(config, broker, client, consumer_name("score"), stop).run()
        else:
            from trainyard_stream.lander import Lander

            Lander(config, broker, args.volume, consumer_name("land"), stop, asset_marker(config)).run()
    except Stopped:
        log.info("stopped with a batch in hand: it stays pending for the next consumer")
    except redis.ResponseError as exc:  # e.g. a sink key that holds another type: the config names the wrong key
        print(f"trainyard_stream {args.command}: the broker refused: {exc}", file=sys.stderr)
        return EXIT_FAILED
    return EXIT_OK


if __name__ == "__main__":
    sys.exit(run_stage(lambda: main()))
