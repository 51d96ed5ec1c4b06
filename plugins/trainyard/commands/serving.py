"""`trainyard serve` (the local TF Serving API server, in the foreground or the background) and `trainyard
predict` (one REST prediction from a run's smoke set)."""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from trainyard import settings
from trainyard.commands.common import EXIT_FAILED, EXIT_OK, load_named
from trainyard_contract import layout


def serving_pid_file() -> Path:
    return settings.data_dir() / "serving.pid"


def cmd_serve(args: argparse.Namespace) -> int:
    """The local TF Serving API server over `<volume>/models` (foreground, or --background with a pid file)."""
    import subprocess

    models = settings.data_dir() / layout.MODELS
    models.mkdir(parents=True, exist_ok=True)
    python = settings.stage_python()
    argv = [python, "-m", "trainyard_serving", "serve", "--models-dir", str(models),
            "--grpc-port", str(args.grpc_port), "--rest-port", str(args.rest_port)]
    if args.stop:
        return stop_server()
    if not args.background:
        os.execv(python, argv)
    if server_alive():
        print(f"trainyard serve: already running (pid {serving_pid_file().read_text().strip()})")
        return EXIT_OK
    log_path = settings.data_dir() / "serving.log"
    ready = settings.data_dir() / "serving.ready"
    ready.unlink(missing_ok=True)
    with log_path.open("a") as log:
        process = subprocess.Popen([*argv, "--ready-file", str(ready)], stdout=log, stderr=subprocess.STDOUT,
                                   stdin=subprocess.DEVNULL, start_new_session=True)
    serving_pid_file().write_text(str(process.pid))
    import time

    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if process.poll() is not None:  # e.g. a port another server holds: its own message is in the log
            serving_pid_file().unlink(missing_ok=True)
            reason = last_error_line(log_path)
            print(f"trainyard serve: the server exited with code {process.returncode}"
                  f"{': ' + reason if reason else ''} (log {log_path})", file=sys.stderr)
            return EXIT_FAILED
        if ready.is_file() and ready.read_text().strip() == str(process.pid):
            break  # our own process bound both ports and loaded the models
        time.sleep(0.25)
    else:
        print(f"trainyard serve: the server (pid {process.pid}) did not get ready in 120 s; see {log_path}",
              file=sys.stderr)
        return EXIT_FAILED
    print(f"trainyard serve: serving {models} (pid {process.pid}): REST http://127.0.0.1:{args.rest_port}, "
          f"gRPC 127.0.0.1:{args.grpc_port}; log {log_path}")
    return EXIT_OK


def last_error_line(log_path: Path) -> str:
    """The server's own last ERROR line (`cannot listen for gRPC on 127.0.0.1:8500: ...`), if it wrote one."""
    lines = [line for line in log_path.read_text(errors="replace").splitlines() if " ERROR " in line]
    return lines[-1].split(" ERROR ", 1)[1].strip() if lines else ""


def server_alive() -> bool:

    path = serving_pid_file()
    if not path.is_file():
        return False
    try:
        os.kill(int(path.read_text().strip()), 0)
        return True
    except (OSError, ValueError):
        return False


def stop_server(wait_seconds: float = 30.0) -> int:
    """SIGTERM the background server and return once it is gone (SIGKILL after `wait_seconds`), so a port it
    held is free and its models closed when this prints "stopped"."""

    if not server_alive():
        serving_pid_file().unlink(missing_ok=True)
        print("trainyard serve: no server was running")
        return EXIT_OK
    pid = int(serving_pid_file().read_text().strip())
    if terminate(pid, wait_seconds):
        print(f"trainyard serve: the server (pid {pid}) did not stop within {wait_seconds:g} s of SIGTERM; killed it")
    serving_pid_file().unlink(missing_ok=True)
    print(f"trainyard serve: stopped (pid {pid})")
    return EXIT_OK


def terminate(pid: int, wait_seconds: float) -> bool:
    """SIGTERM `pid` and return once it is gone; SIGKILL it when it outlives `wait_seconds` (then True)."""
    import signal
    import time

    os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + wait_seconds
    while process_exists(pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    if not process_exists(pid):
        return False
    os.kill(pid, signal.SIGKILL)
    while process_exists(pid) and time.monotonic() < deadline + 10:
        time.sleep(0.1)
    return True


def process_exists(pid: int) -> bool:
    """True while `pid` runs (a zombie, already dead but not yet reaped, counts as gone)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state not in ("Z", "X")


def cmd_predict(args: argparse.Namespace) -> int:
    """POST one eval example of the pipeline's newest evaluated run to the REST API and print the answer."""
    import urllib.error
    import urllib.request

    loaded = load_named(args.pipeline)
    if loaded is None:
        return EXIT_FAILED
    config = loaded[0]
    runs = sorted(layout.runs_dir(settings.data_dir(), config.name).glob(f"*/{layout.SMOKE_SET}"),
                  key=lambda p: p.stat().st_mtime)
    if not runs:
        print(f"trainyard predict: no evaluated run of {config.name} yet (run `trainyard run {config.name}`)",
              file=sys.stderr)
        return EXIT_FAILED
    from trainyard_contract.artifacts import SmokeSet

    try:
        smoke = SmokeSet.model_validate_json(runs[-1].read_bytes())
    except ValueError as exc:  # left by another version, or edited: say which file, and how to get a good one
        print(f"trainyard predict: {runs[-1]} is not what evaluate writes ({exc.errors()[0]['msg']}); run "
              f"`trainyard run {config.name}` again", file=sys.stderr)
        return EXIT_FAILED
    instance = {name: values[0] for name, values in smoke.inputs.items()}
    port = args.rest_port or config.deploy.rest_port  # the port the pipeline deploys to, unless told otherwise
    url = f"http://127.0.0.1:{port}/v1/models/{config.model_name}:predict"
    request = urllib.request.Request(url, data=json.dumps({"instances": [instance]}).encode(),
                                     headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            answer = json.loads(response.read())
    except urllib.error.HTTPError as exc:
        print(f"trainyard predict: {url}: HTTP {exc.code}: {exc.read().decode()}", file=sys.stderr)
        return EXIT_FAILED
    except OSError as exc:
        print(f"trainyard predict: {url}: {exc}; is `trainyard serve` running?", file=sys.stderr)
        return EXIT_FAILED
    prediction = answer["predictions"][0]
    print(f"POST {url}")
    print(f"instance: {json.dumps(instance)}")
    if smoke.predictions is not None:  # regression: the one output is the prediction itself
        print(f"predicted {float(prediction):.6g}; the evaluator predicted {smoke.predictions[0]:.6g}")
        return EXIT_OK
    print(f"predicted class {prediction['classes']!r} (p={max(prediction['probabilities']):.3f}); "
          f"the evaluator expected class id {(smoke.class_ids or [None])[0]}")
    return EXIT_OK


def register(commands: argparse._SubParsersAction) -> None:
    """Add this module's sub-commands to `trainyard`'s parser."""
    serve = commands.add_parser("serve", help="the local TF Serving API server over the volume's models/")
    serve.add_argument("--grpc-port", type=int, default=8500)
    serve.add_argument("--rest-port", type=int, default=8501)
    serve.add_argument("--background", action="store_true", help="start it detached (pid in <volume>/serving.pid)")
    serve.add_argument("--stop", action="store_true", help="stop the background server")
    serve.set_defaults(func=cmd_serve)
    predict = commands.add_parser("predict", help="one prediction through the REST API, from a run's eval data")
    predict.add_argument("pipeline")
    predict.add_argument("--rest-port", type=int, help="the local server's REST port (default: deploy.rest_port)")
    predict.set_defaults(func=cmd_predict)
