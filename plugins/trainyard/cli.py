"""`trainyard`: the verbs Airflow has no word for. `check` configs, `run` a pipeline end to end, write example `data`,
create the `pools` the configs name, `mark-data` for asset-scheduled pipelines, `new` to scaffold a pipeline,
`cleanup` the training jobs on a cluster whose launcher died.

Exit codes: 0 success, 1 invalid config or failed run, 2 usage error.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import sys
from pathlib import Path

from trainyard import settings
from trainyard.config_loader import (
    ConfigError,
    check_folder,
    find_pipeline_file,
    load_pipeline_file,
    pipeline_files,
)
from trainyard_contract import layout
from trainyard_contract.schema import PipelineConfig

EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2
EXIT_INTERRUPTED = 130  # 128 + SIGINT, as shells report Ctrl-C


def load_named(name: str) -> tuple[PipelineConfig, Path] | None:
    """The config of pipeline `name` from the pipelines folder and its path, or None after printing the errors."""
    try:
        path = find_pipeline_file(settings.pipelines_dir(), name)
        return load_pipeline_file(path), path
    except ConfigError as exc:
        print("\n".join(exc.lines), file=sys.stderr)
        return None


def cmd_check(args: argparse.Namespace) -> int:
    paths: list[Path] = []
    for given in args.paths or [settings.pipelines_dir()]:
        path = Path(given)
        if path.is_dir():
            paths.extend(pipeline_files(path))
        elif path.is_file():
            paths.append(path)
        else:
            print(f"trainyard check: {path}: no such file or folder", file=sys.stderr)
            return EXIT_USAGE
    if not paths:
        print("trainyard check: no pipeline configs (*.yaml) found", file=sys.stderr)
        return EXIT_FAILED
    configs, errors = check_folder(paths)
    from trainyard.scaffold import installed_models_dir, model_module_problem, pairing_problems

    by_name = {path.stem: path for path in paths}
    buildable = []
    failed: set[str] = set()
    models_here = settings.stage_python() == sys.executable
    if models_here and installed_models_dir() is None:
        print("trainyard check: note: model modules not checked: the trainer's package is not installed in this "
              "Airflow (it lives in the training image); set TRAINYARD_STAGE_PYTHON to an interpreter that has it "
              "to check them here")
        configs_to_check: list[PipelineConfig] = []
    else:
        configs_to_check = configs
    for config in configs_to_check:
        problem = model_module_problem(config.training.model.module) if models_here else None
        if problem is not None:
            errors.append(f"{module_location(by_name.get(config.name), config)}: training.model.module: {problem}")
            failed.add(config.name)
        else:
            buildable.append(config)
    if buildable and not args.no_build:
        built = model_build_problems(buildable, by_name)
        errors += [line for _, line in built]
        failed |= {name for name, _ in built}
    if not args.paths:  # the configured folder: each pipeline needs its DAG shim, and each shim its config
        errors += pairing_problems({c.name for c in configs}, dags_folder())
    for line in errors:
        print(line, file=sys.stderr)
    for config in configs:
        if config.name not in failed:
            print(f"ok  {config.name}{model_name_note(config)}")
    if errors:
        print(f"{len(errors)} error(s) in {len(paths)} file(s)", file=sys.stderr)
        return EXIT_FAILED
    return EXIT_OK


def module_location(path: Path | None, config: PipelineConfig) -> str:
    """`FILE:LINE:COL` of a pipeline's `training.model.module` (or of its file when the default is used)."""
    from trainyard.config_loader import display_path
    from trainyard.yaml_source import load_yaml_file

    if path is None:
        return config.name
    document = load_yaml_file(path, display_path(path))
    for loc in (("training", "model", "module"), ("training", "model"), ("training",)):
        mark = document.mark_for(loc)
        if mark is not None and loc in document.marks:
            return str(mark)
    return f"{display_path(path)}:1:1"


def model_build_problems(configs: list[PipelineConfig], paths: dict[str, Path]) -> list[tuple[str, str]]:
    """Build each model once on a schema made from its config, in one trainer process (TensorFlow never enters
    this one): a module that fails on the pipeline's features is an error at its config line."""
    import subprocess

    request = json.dumps([config.model_dump_json() for config in configs])
    try:
        done = subprocess.run([settings.stage_python(), "-m", "trainyard_trainer", "check-configs"], input=request,
                              capture_output=True, text=True, timeout=600, env={**os.environ,
                                                                               "TF_CPP_MIN_LOG_LEVEL": "3"})
    except subprocess.TimeoutExpired:
        return [("", "trainyard check: building the models took over 10 minutes (--no-build skips this step)")]
    results = {}
    for line in done.stdout.splitlines():
        if line.startswith("{"):
            entry = json.loads(line)
            results[entry["name"]] = entry
    problems = []
    for config in configs:
        entry = results.get(config.name)
        where = module_location(paths.get(config.name), config)
        if entry is None:
            tail = (done.stderr.strip().splitlines() or ["no output"])[-1]
            problems.append((config.name, f"{where}: training.model.module: the model check did not finish: {tail}"))
        elif entry["error"]:
            problems.append((config.name, f"{where}: training.model.module: {entry['error']}"))
    return problems


def dags_folder() -> Path:
    """The dags folder of this Airflow home (`[core] dags_folder`), where the DAG shims live."""
    from airflow.configuration import conf

    return Path(conf.get("core", "dags_folder"))


def cmd_new(args: argparse.Namespace) -> int:
    from trainyard.scaffold import ScaffoldError, new_pipeline

    try:
        written = new_pipeline(args.name, Path(args.sample) if args.sample else None, args.label,
                               pipelines=settings.pipelines_dir(), dags=dags_folder(), volume=settings.data_dir(),
                               force=args.force, task=args.task, serving_running=server_alive())
    except ScaffoldError as exc:
        print(f"trainyard new: {exc}", file=sys.stderr)
        return EXIT_USAGE
    print(f"trainyard new: config  {written.config}")
    print(f"trainyard new: shim    {written.shim}")
    if written.model is not None:
        print(f"trainyard new: model   {written.model} (training.model.module: "
              f"trainyard_trainer.models.{args.name})")
    if written.data is not None:
        print(f"trainyard new: data    {written.data} (the sample, as today's partition)")
    for note in written.notes:
        print(f"trainyard new: note: {note}")
    print(f"next: trainyard check && trainyard serve --background && trainyard run {args.name} && "
          f"trainyard predict {args.name}")
    return EXIT_OK


def model_name_note(config: PipelineConfig) -> str:
    """Say so when the served model's name is not the pipeline's own (the rule: a DNS label, `_` -> `-`)."""
    if config.deploy.model_name is None and config.model_name != config.name:
        return (f" (serves as model {config.model_name!r}: model names are DNS labels, so `_` becomes `-`; "
                "set deploy.model_name to choose it)")
    return ""


def cmd_run(args: argparse.Namespace) -> int:
    try:
        conf = json.loads(args.conf) if args.conf else {}
    except json.JSONDecodeError as exc:
        print(f"trainyard run: --conf is not valid JSON: {exc}", file=sys.stderr)
        return EXIT_USAGE
    if not isinstance(conf, dict):
        print("trainyard run: --conf must be a JSON object, e.g. '{\"steps\": 100}'", file=sys.stderr)
        return EXIT_USAGE
    loaded = load_named(args.pipeline)
    if loaded is None:
        return EXIT_FAILED
    config, path = loaded
    from trainyard.dag_factory import build_dag
    from trainyard_contract.layout import run_key

    dag = build_dag(config, str(path))
    unknown = sorted(set(conf) - set(dag.params.keys()))
    if unknown:
        print(f"trainyard run: unknown parameter(s) {unknown}; known: {sorted(dag.params.keys())}", file=sys.stderr)
        return EXIT_USAGE
    import signal
    import time

    from airflow.models.dagrun import DagRun
    from airflow.utils.types import DagRunType

    from trainyard import local_run

    notes: list[str] = []
    lock = None
    problem = local_run.airflow_home_problem() or local_run.shim_problem(config.name)
    if problem is None:
        problem, notes, lock = local_run.stale_run_problem(config.name)
    if problem is not None or lock is None:
        print(f"trainyard run: {problem.message}", file=sys.stderr)
        return EXIT_FAILED
    for note in notes:
        print(f"trainyard run: {note}")
    run_after = dt.datetime.now(dt.UTC)
    logical_date = run_after.replace(microsecond=0)
    run_id = DagRun.generate_run_id(run_type=DagRunType.MANUAL, logical_date=logical_date, run_after=run_after)
    log_path = run_log_path(config.name, logical_date)
    lock.take(run_id)
    previous = signal.signal(signal.SIGINT, local_run.interrupt_handler)
    state = "failed"
    dag_run = None
    run_dir = layout.runs_dir(settings.data_dir(), config.name) / run_key(run_id)
    clock = time.monotonic()
    try:
        with local_run.tee_output(log_path):
            dag_run = dag.test(logical_date=logical_date, run_after=run_after, run_conf=conf)
        state = str(getattr(dag_run.state, "value", dag_run.state))
    except KeyboardInterrupt:
        local_run.mark_failed(config.name, run_id)
    finally:
        signal.signal(signal.SIGINT, previous)
        lock.release()
    print(f"trainyard run: {config.name} run {run_id} finished: {state}")
    if local_run.INTERRUPTED:
        print("trainyard run: stopped by Ctrl-C: the running stage's processes were stopped and the run marked "
              f"failed; {local_run.publish_note(run_dir)}")
    elif state != "success" and dag_run is not None:
        for line in local_run.failure_summary(dag_run):
            print(f"trainyard run: {line}")
    if dag_run is not None:
        for line in local_run.skip_notes(dag_run):
            print(f"trainyard run: {line}")
        from trainyard.run_summary import summary_table, task_rows, training_rates

        for line in summary_table(task_rows(dag_run), training_rates(run_dir), time.monotonic() - clock):
            print(f"trainyard run: {line}")
    print(f"trainyard run: run folder: {run_dir}")
    print(f"trainyard run: log: {log_path}")
    if local_run.INTERRUPTED:
        return EXIT_INTERRUPTED
    return EXIT_OK if state == "success" else EXIT_FAILED



def run_log_path(pipeline: str, when: dt.datetime) -> Path:
    """Where `trainyard run` keeps the whole output of a run (the task logs dag.test prints)."""
    from airflow.configuration import conf

    folder = Path(conf.get("logging", "base_log_folder")) / "trainyard-run" / pipeline
    return folder / f"{when.strftime('%Y-%m-%dT%H-%M-%S')}.log"


DEFAULT_DAYS = {"digits": 5, "diabetes": 3, "churn": 3}


def cmd_data(args: argparse.Namespace) -> int:
    try:
        from trainyard_prep import example_data
    except ModuleNotFoundError:
        print("trainyard data: the example datasets come with the prep stage's package, which is not installed "
              "here (Trainyard's wheel leaves it in its image): run it in a checkout (`make data`)", file=sys.stderr)
        return EXIT_FAILED

    root = settings.data_dir()
    end = dt.date.fromisoformat(args.end_date) if args.end_date else None
    writers = {"digits": example_data.write_digits, "diabetes": example_data.write_diabetes,
               "churn": example_data.write_churn}
    if args.dataset in writers:
        target = layout.dataset_dir(root, args.name or args.dataset)
        if target.exists() and any(target.iterdir()) and not args.force:
            print(f"trainyard data: {target} already has data (use --force to rewrite)")
            return EXIT_OK
        paths = writers[args.dataset](target, days=args.days or DEFAULT_DAYS[args.dataset], end=end)
    else:
        target = layout.dataset_dir(root, args.name or "synthetic")
        paths = example_data.write_synthetic(target, rows=args.rows, features=args.features, days=args.days or 1,
                                             end=end, file_format=args.format)
    print(f"trainyard data: wrote {len(paths)} partition file(s) under {target}")
    return EXIT_OK


def serving_pid_file() -> Path:
    return settings.data_dir() / "serving.pid"


def cmd_serve(args: argparse.Namespace) -> int:
    """The local TF Serving API server over `<volume>/models` (foreground, or --background with a pid file)."""
    import os
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
    import os

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
    import os
    import signal
    import time

    if not server_alive():
        serving_pid_file().unlink(missing_ok=True)
        print("trainyard serve: no server was running")
        return EXIT_OK
    pid = int(serving_pid_file().read_text().strip())
    os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + wait_seconds
    while process_exists(pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    if process_exists(pid):
        os.kill(pid, signal.SIGKILL)
        while process_exists(pid) and time.monotonic() < deadline + 10:
            time.sleep(0.1)
        print(f"trainyard serve: the server (pid {pid}) did not stop within {wait_seconds:g} s of SIGTERM; killed it")
    serving_pid_file().unlink(missing_ok=True)
    print(f"trainyard serve: stopped (pid {pid})")
    return EXIT_OK


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


def cmd_render(args: argparse.Namespace) -> int:
    loaded = load_named(args.pipeline)
    if loaded is None:
        return EXIT_FAILED
    config = loaded[0]
    from trainyard.render import render_run, write_manifests

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
    from trainyard.pools import ensure_pools, required_pools

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
    from trainyard.backends.kubernetes import KubernetesLauncher

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
    from trainyard.airflow_api import AirflowApi, ApiError
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


def build_parser() -> argparse.ArgumentParser:
    root = argparse.ArgumentParser(prog="trainyard", description=__doc__)
    commands = root.add_subparsers(dest="command", required=True)
    check = commands.add_parser("check", help="validate pipeline configs (default: the pipelines folder)")
    check.add_argument("paths", nargs="*", help="config files or folders")
    check.add_argument("--no-build", action="store_true",
                       help="do not build each model on its config's features (that step imports TensorFlow, "
                            "in a subprocess: a few seconds)")
    check.set_defaults(func=cmd_check)
    run = commands.add_parser("run", help="run one pipeline end to end through Airflow (dag.test) on the local "
                              "backend, or on a cluster with TRAINYARD_BACKEND=kubernetes")
    run.add_argument("pipeline", help="pipeline name (the config's file name)")
    run.add_argument("--conf", help="JSON object of trigger parameters, e.g. '{\"steps\": 200}'")
    run.set_defaults(func=cmd_run)
    data = commands.add_parser("data", help="write an example dataset onto the local volume")
    data.add_argument("dataset", choices=["digits", "diabetes", "churn", "synthetic"],
                      help="digits (classification, CSV), diabetes (regression, CSV), churn (categorical and "
                           "numeric features, Parquet), synthetic (any size)")
    data.add_argument("--days", type=int, help="number of daily partitions (digits 5, diabetes and churn 3, "
                                                "synthetic 1)")
    data.add_argument("--format", choices=["csv", "parquet"], default="csv", help="synthetic: file format")
    data.add_argument("--end-date", help="date of the last partition (default: yesterday, UTC)")
    data.add_argument("--rows", type=int, default=100_000, help="synthetic: number of rows")
    data.add_argument("--features", type=int, default=16, help="synthetic: number of float features")
    data.add_argument("--name", help="dataset folder name under datasets/ (default: the dataset's name)")
    data.add_argument("--force", action="store_true", help="rewrite existing data (not synthetic: always written)")
    data.set_defaults(func=cmd_data)
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
    new = commands.add_parser("new", help="scaffold a pipeline: config (from a sample CSV or Parquet file), DAG shim, "
                              "model module")
    new.add_argument("name", help="the pipeline's name (lowercase, digits, '_')")
    new.add_argument("--from", dest="sample", help="a sample CSV or Parquet file: features, dtypes and ranges are "
                                                   "inferred from it, and it becomes the dataset's first partition")
    new.add_argument("--label", help="the column to predict (required with --from)")
    new.add_argument("--task", choices=["classification", "regression"],
                     help="what the label is (default: regression when its values are not all whole numbers)")
    new.add_argument("--force", action="store_true", help="overwrite files that exist")
    new.set_defaults(func=cmd_new)
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
