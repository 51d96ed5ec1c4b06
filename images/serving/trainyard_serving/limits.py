"""Every limit of the local server in one place, with the defaults `trainyard_serving serve` starts with.

Each limit answers with a clear 4xx (REST) or gRPC status and never a hang or a 5xx: a body over `max_body_bytes`
is 413; more than `max_batch` rows or `max_elements` values in one request is 400 / INVALID_ARGUMENT, checked from
the declared shapes before any tensor is allocated; JSON nested deeper than `max_json_depth` is 400; a request
whose headers do not arrive within `header_timeout` (also an idle keep-alive connection), or whose body does not
within `body_timeout`, is closed (408 when a response can still be sent); past `max_connections` open connections
a new one gets 503 at once. `listen_backlog` is the TCP accept queue (Python's default of 5 makes bursts wait).

On the way out: an answer must be taken by the client within `write_timeout` seconds, else the connection is
dropped and its thread and memory are returned; the kernel holds at most about `max_unsent_bytes` of an answer per
connection (its send buffer). `max_batch` also bounds an answer's size: at most that many rows come back, whatever a
request declares (a 3 KB gRPC request may declare many rows filled from one value).
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass, fields


@dataclass(frozen=True)
class Limits:
    max_body_bytes: int = 16 << 20
    max_batch: int = 10_000
    max_elements: int = 16 << 20
    max_json_depth: int = 64
    header_timeout: float = 10.0
    body_timeout: float = 30.0
    write_timeout: float = 30.0
    max_unsent_bytes: int = 1 << 20
    max_connections: int = 512
    listen_backlog: int = 128

    @classmethod
    def add_arguments(cls, parser: argparse.ArgumentParser) -> None:
        """One `--max-body-bytes`-style flag per limit, with the default shown."""
        for item in fields(cls):
            parser.add_argument(f"--{item.name.replace('_', '-')}", type=type(item.default), default=item.default,
                                help=f"(default {item.default})")

    @classmethod
    def from_arguments(cls, args: argparse.Namespace) -> Limits:
        limits = cls(**{item.name: getattr(args, item.name) for item in fields(cls)})
        for item in fields(cls):
            if getattr(limits, item.name) <= 0:
                raise ValueError(f"--{item.name.replace('_', '-')} must be positive")
        return limits
