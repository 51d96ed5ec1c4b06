"""`trainyard run` (one pipeline end to end through Airflow's dag.test, with the run's table) and `trainyard data`
(example datasets on the local volume)."""

from __future__ import annotations

import argparse
import datetime as dt
import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trainyard import settings
from trainyard.commands.common import EXIT_FAILED, EXIT_INTERRUPTED, EXIT_OK, EXIT_USAGE, load_named
from trainyard_contract import layout


@dataclass
class LocalRun:
    """One `trainyard run`: where it writes, and how it ended (`dag_run` is None when it never started)."""

    run_id: str
    run_dir: Path
    log_path: Path
    state: str = "failed"
    dag_run: Any = None
    seconds: float = 0.0


def cmd_run(args: argparse.Namespace) -> int:
    conf = trigger_conf(args.conf)
    if isinstance(conf, int):
        return conf
    loaded = load_named(args.pipeline)
    if loaded is None:
        return EXIT_FAILED
    config, path = loaded
    from trainyard.dag.factory import build_dag

    dag = build_dag(config, str(path))
    unknown = sorted(set(conf) - set(dag.params.keys()))
    if unknown:
        print(f"trainyard run: unknown parameter(s) {unknown}; known: {sorted(dag.params.keys())}", file=sys.stderr)
        return EXIT_USAGE
    lock = run_lock(config.name)
    if lock is None:
        return EXIT_FAILED
    from trainyard.commands import local_run

    run = run_dag(dag, config.name, conf, lock)
    report_run(config.name, run)
    if local_run.INTERRUPTED:
        return EXIT_INTERRUPTED
    return EXIT_OK if run.state == "success" else EXIT_FAILED


def trigger_conf(text: str | None) -> dict[str, Any] | int:
    """`--conf` as a dict of trigger Params, or EXIT_USAGE after saying what is wrong with it."""
    try:
        conf = json.loads(text) if text else {}
    except json.JSONDecodeError as exc:
        print(f"trainyard run: --conf is not valid JSON: {exc}", file=sys.stderr)
        return EXIT_USAGE
    if not isinstance(conf, dict):
        print("trainyard run: --conf must be a JSON object, e.g. '{\"steps\": 100}'", file=sys.stderr)
        return EXIT_USAGE
    return conf


def run_lock(pipeline: str) -> Any:
    """The pipeline's local run lock, or None after printing why no run can start (an Airflow home or shim
    problem, or a run still going); notes about stale runs it cleared are printed too."""
    from trainyard.commands import local_run

    notes: list[str] = []
    lock = None
    problem = local_run.airflow_home_problem() or local_run.shim_problem(pipeline)
    if problem is None:
        problem, notes, lock = local_run.stale_run_problem(pipeline)
    if problem is not None or lock is None:
        print(f"trainyard run: {problem.message}", file=sys.stderr)
        return None
    for note in notes:
        print(f"trainyard run: {note}")
    return lock


def run_dag(dag: Any, pipeline: str, conf: dict[str, Any], lock: Any) -> LocalRun:
    """The DAG run through `dag.test` under the lock, its output teed to the run's log; Ctrl-C marks it failed."""
    import signal
    import time

    from airflow.models.dagrun import DagRun
    from airflow.utils.types import DagRunType

    from trainyard.commands import local_run
    from trainyard_contract.layout import run_key

    run_after = dt.datetime.now(dt.UTC)
    logical_date = run_after.replace(microsecond=0)
    run_id = DagRun.generate_run_id(run_type=DagRunType.MANUAL, logical_date=logical_date, run_after=run_after)
    run = LocalRun(run_id, layout.runs_dir(settings.data_dir(), pipeline) / run_key(run_id),
                   run_log_path(pipeline, logical_date))
    lock.take(run_id)
    previous = signal.signal(signal.SIGINT, local_run.interrupt_handler)
    clock = time.monotonic()
    try:
        with local_run.tee_output(run.log_path):
            run.dag_run = dag.test(logical_date=logical_date, run_after=run_after, run_conf=conf)
        run.state = str(getattr(run.dag_run.state, "value", run.dag_run.state))
    except KeyboardInterrupt:
        local_run.mark_failed(pipeline, run_id)
    finally:
        signal.signal(signal.SIGINT, previous)
        lock.release()
    run.seconds = time.monotonic() - clock
    return run


def report_run(pipeline: str, run: LocalRun) -> None:
    """How the run ended: its state, the failure's cause or the Ctrl-C, skip notes, the task table, where to look."""
    from trainyard.commands import local_run
    from trainyard.commands.run_summary import summary_table, task_rows, training_rates

    print(f"trainyard run: {pipeline} run {run.run_id} finished: {run.state}")
    if local_run.INTERRUPTED:
        print("trainyard run: stopped by Ctrl-C: the running stage's processes were stopped and the run marked "
              f"failed; {local_run.publish_note(run.run_dir)}")
    elif run.state != "success" and run.dag_run is not None:
        for line in local_run.failure_summary(run.dag_run):
            print(f"trainyard run: {line}")
    if run.dag_run is not None:
        for line in local_run.skip_notes(run.dag_run):
            print(f"trainyard run: {line}")
        for line in summary_table(task_rows(run.dag_run), training_rates(run.run_dir), run.seconds):
            print(f"trainyard run: {line}")
    print(f"trainyard run: run folder: {run.run_dir}")
    print(f"trainyard run: log: {run.log_path}")


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


def register(commands: argparse._SubParsersAction) -> None:
    """Add this module's sub-commands to `trainyard`'s parser."""
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
