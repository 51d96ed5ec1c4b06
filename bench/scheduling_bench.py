"""Scheduling overhead of the example pipeline on real Airflow services (PostgreSQL, LocalExecutor, 2 slots).

Triggers the `digits` example through the REST API (`--runs` times, one after the other) and reads every task
instance's start and end back from the API:

1. Gap: for each task that ran, its start minus the end of the last of its upstream tasks, i.e. how long the
   scheduler and executor took to start the next step. Target: median <= 2 s.
2. Overhead: the run's wall time (run start to run end) vs the sum of the durations of the tasks on its
   critical path (validate_data -> ... -> deploy or skip_deploy). Target: <= 15 %.

Usage: python bench/scheduling_bench.py [--runs 2] [--json bench/out/scheduling.json]
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tests.integration.airflow_services import running_pipelines  # noqa: E402

CHAIN = ("validate_data", "prepare_data", "train", "evaluate", "decide")


def instant(value: str | None) -> dt.datetime | None:
    return dt.datetime.fromisoformat(value) if value else None


def run_figures(tasks: list[dict[str, Any]], upstream: dict[str, list[str]], run: dict[str, Any]) -> dict[str, Any]:
    """Gaps and critical-path overhead of one finished run, from its task instances."""
    # a skipped task gets start and end dates when the branch skips it: only tasks that ran count
    by_id = {t["task_id"]: t for t in tasks if t["state"] == "success"}
    gaps = {}
    for task_id, parents in upstream.items():
        task = by_id.get(task_id)
        ends = [instant(by_id[p]["end_date"]) for p in parents if p in by_id and by_id[p]["end_date"]]
        if not task or not task["start_date"] or not parents or not ends:
            continue
        gaps[task_id] = (instant(task["start_date"]) - max(ends)).total_seconds()
    last = "deploy" if "deploy" in by_id else "skip_deploy"
    durations = {t: (instant(by_id[t]["end_date"]) - instant(by_id[t]["start_date"])).total_seconds()
                 for t in (*CHAIN, last)}
    wall = (instant(run["end_date"]) - instant(run["start_date"])).total_seconds()
    path = sum(durations.values())
    return {"run_id": run["dag_run_id"], "wall_seconds": round(wall, 2), "critical_path_seconds": round(path, 2),
            "overhead": round(wall / path - 1, 4), "gaps_seconds": {k: round(v, 2) for k, v in gaps.items()},
            "durations_seconds": {k: round(v, 2) for k, v in durations.items()}}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=2, help="example runs, one after the other (default 2)")
    parser.add_argument("--json", type=Path, default=REPO / "bench" / "out" / "scheduling.json")
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="trainyard-sched-bench-"))
    results = []
    started = time.monotonic()
    digits = (REPO / "pipelines_config" / "digits.yaml").read_text()
    with running_pipelines(root, {"digits": digits}, data_days=5) as (services, _volume, _server):
        print(f"deployment up in {time.monotonic() - started:.1f} s (example data, model server, PostgreSQL, "
              f"api-server, scheduler, dag-processor, triggerer; DAG parsed)", flush=True)
        api = services.api
        api.set_paused("digits", False)
        graph = api.call("GET", "/dags/digits/tasks")["tasks"]
        upstream: dict[str, list[str]] = {t["task_id"]: [] for t in graph}
        for task in graph:
            for child in task["downstream_task_ids"]:
                upstream[child].append(task["task_id"])
        for index in range(args.runs):
            run_id = f"bench-{index + 1}"
            api.trigger("digits", {}, run_id=run_id)
            run = services.wait_run("digits", run_id, timeout=1200)
            if run["state"] != "success":
                print(f"run {run_id} ended {run['state']}; see {services.home}", file=sys.stderr)
                return 1
            figures = run_figures(api.task_instances("digits", run_id), upstream, run)
            results.append(figures)
            print(f"{run_id}: wall {figures['wall_seconds']:.1f} s, critical path "
                  f"{figures['critical_path_seconds']:.1f} s, overhead {figures['overhead']:.1%}; gaps (s) "
                  + ", ".join(f"{k} {v:.2f}" for k, v in figures["gaps_seconds"].items()), flush=True)
    gaps = [g for r in results for g in r["gaps_seconds"].values()]
    overheads = [r["overhead"] for r in results]
    summary = {"runs": results, "median_gap_seconds": round(statistics.median(gaps), 2),
               "max_gap_seconds": round(max(gaps), 2), "median_overhead": round(statistics.median(overheads), 4),
               "targets": {"median_gap_seconds": 2.0, "overhead": 0.15}}
    print(f"median gap between a task's end and the next one's start: {summary['median_gap_seconds']:.2f} s "
          f"(max {summary['max_gap_seconds']:.2f} s, {len(gaps)} gaps; target <= 2 s) "
          f"{'OK' if summary['median_gap_seconds'] <= 2 else 'MISSED'}")
    print(f"end-to-end overhead vs the critical path's task durations: median {summary['median_overhead']:.1%} "
          f"(target <= 15%) {'OK' if summary['median_overhead'] <= 0.15 else 'MISSED'}")
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(summary, indent=2))
    shutil.rmtree(root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
