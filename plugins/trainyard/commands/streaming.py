"""`trainyard stream PIPELINE [--background|--stop]`: the pipeline's stream scorer (and its lander, when the config
has `stream.land`) as local processes, the way `trainyard serve` runs the local server. On Kubernetes the same
image runs as a Deployment that the deploy step applies (see `trainyard render`)."""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from trainyard import settings
from trainyard.commands.common import EXIT_FAILED, EXIT_OK, EXIT_USAGE, load_named
from trainyard.commands.serving import process_exists, terminate
from trainyard_contract.runtime import CONFIG_ENV
from trainyard_contract.schema import PipelineConfig

READY_LINES = {"score": " scoring ", "land": " landing "}  # each role's first line once its loop has started
STOP_SECONDS = 30.0


def roles(config: PipelineConfig) -> list[str]:
    assert config.stream is not None
    return ["score", "land"] if config.stream.land is not None else ["score"]


def argv_for(config: PipelineConfig, role: str) -> list[str]:
    python = settings.stage_python()
    if role == "score":
        return [python, "-m", "trainyard_stream", "score", "--endpoint",
                settings.local_serving_grpc(config.deploy.grpc_port)]
    return [python, "-m", "trainyard_stream", "land", "--volume", str(settings.data_dir())]


def environment(config: PipelineConfig, role: str) -> dict[str, str]:
    return {**os.environ, CONFIG_ENV: config.model_dump_json(), "PYTHONUNBUFFERED": "1",
            "TF_CPP_MIN_LOG_LEVEL": os.environ.get("TF_CPP_MIN_LOG_LEVEL", "2"),
            "TRAINYARD_CONSUMER": os.environ.get("TRAINYARD_CONSUMER") or f"{role}-local-{config.name}"}


def files(config: PipelineConfig, role: str) -> tuple[Path, Path]:
    """(pid file, log file) of one background process."""
    folder = settings.data_dir() / "streams"
    return folder / f"{config.name}.{role}.pid", folder / f"{config.name}.{role}.log"


def running_pid(pid_file: Path) -> int | None:
    try:
        pid = int(pid_file.read_text().strip())
    except (OSError, ValueError):
        return None
    return pid if process_exists(pid) else None


def cmd_stream(args: argparse.Namespace) -> int:
    loaded = load_named(args.pipeline)
    if loaded is None:
        return EXIT_FAILED
    config, path = loaded
    if config.stream is None:
        print(f"trainyard stream: {path} has no `stream:` section (README: Streams)", file=sys.stderr)
        return EXIT_USAGE
    if args.stop:
        return stop(config)
    if args.background:
        return start_background(config)
    return run_foreground(config)


def run_foreground(config: PipelineConfig) -> int:
    """Each role as a child; Ctrl-C or SIGTERM is passed on as SIGTERM, so each drains the batch in hand."""
    children = [subprocess.Popen(argv_for(config, role), env=environment(config, role)) for role in roles(config)]

    def forward(signum: int, frame: object) -> None:
        for child in children:
            if child.poll() is None:
                child.send_signal(signal.SIGTERM)

    signal.signal(signal.SIGTERM, forward)
    signal.signal(signal.SIGINT, forward)
    codes = [child.wait() for child in children]
    return next((code for code in codes if code), EXIT_OK)


def start_background(config: PipelineConfig) -> int:
    started: list[tuple[str, subprocess.Popen[bytes], Path]] = []
    for role in roles(config):
        pid_file, log_file = files(config, role)
        pid = running_pid(pid_file)
        if pid is not None:
            print(f"trainyard stream: {config.name} {role} already running (pid {pid})")
            continue
        pid_file.parent.mkdir(parents=True, exist_ok=True)
        offset = log_file.stat().st_size if log_file.exists() else 0
        with log_file.open("ab") as log:
            process = subprocess.Popen(argv_for(config, role), env=environment(config, role), stdout=log,
                                       stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
        pid_file.write_text(str(process.pid))
        started.append((role, process, log_file))
        if not wait_started(role, process, log_file, offset):
            pid_file.unlink(missing_ok=True)
            stop(config)
            return EXIT_FAILED
        print(f"trainyard stream: {config.name} {role} running (pid {process.pid}); log {log_file}")
    return EXIT_OK


def wait_started(role: str, process: subprocess.Popen[bytes], log_file: Path, offset: int,
                 seconds: float = 120.0) -> bool:
    """True once the process logged that its loop started; False (and why) when it exited or hung first."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        text = log_file.read_bytes()[offset:].decode(errors="replace")
        if READY_LINES[role] in text:
            return True
        if process.poll() is not None:
            last = [line for line in text.splitlines() if line.strip()][-1:] or ["(no output)"]
            print(f"trainyard stream: the {role} process exited with code {process.returncode}: {last[0]} "
                  f"(log {log_file})", file=sys.stderr)
            return False
        time.sleep(0.2)
    print(f"trainyard stream: the {role} process (pid {process.pid}) did not start in {seconds:g} s; see {log_file}",
          file=sys.stderr)
    return False


def stop(config: PipelineConfig) -> int:
    """SIGTERM each background process and return once it is gone (SIGKILL after STOP_SECONDS)."""
    stopped = 0
    for role in ["score", "land"]:
        pid_file, _ = files(config, role)
        pid = running_pid(pid_file)
        pid_file.unlink(missing_ok=True)
        if pid is None:
            continue
        if terminate(pid, STOP_SECONDS):
            print(f"trainyard stream: {role} (pid {pid}) did not stop within {STOP_SECONDS:g} s; killed it")
        print(f"trainyard stream: {config.name} {role} stopped (pid {pid})")
        stopped += 1
    if not stopped:
        print(f"trainyard stream: no stream process of {config.name} was running")
    return EXIT_OK


def register(commands: argparse._SubParsersAction) -> None:
    stream = commands.add_parser("stream", help="the pipeline's stream scorer (and lander) as local processes")
    stream.add_argument("pipeline")
    mode = stream.add_mutually_exclusive_group()
    mode.add_argument("--background", action="store_true",
                      help="start detached (pid and log in <volume>/streams/)")
    mode.add_argument("--stop", action="store_true", help="stop the background processes (drains their batches)")
    stream.set_defaults(func=cmd_stream)
