"""validate_data + prepare_data vs a plain read of the same files, side by side in one run, with peak memory.

For each format (CSV, Parquet), feature count (16, 64 float features + an int label) and size (R and 10R rows),
prints: the plain read rate of the file (pandas and pyarrow, each in its own process: the faster is the
reference), validate and prepare rows/s (the real stage entrypoints, `python -m trainyard_prep ...`, each in its
own process, as the local backend runs them; rows/s are the stages' own figures, from their first to their last
row, imports excluded; wall seconds beside them), the two together (one row through both stages), the ratio to
the faster read (target >= 0.5x), each stage's peak RSS and where its time goes in microseconds per row and
phase. The 10R file is the R file's rows repeated 10 times, so generating it costs one copy. Every process (the
stages and the plain reads) runs with the prep image's environment (`registry.PREP.env`).

Targets: validate+prepare >= 0.5x the faster plain read; peak RSS at 10R <= 1.3x the peak at R.

Fan-out: the same data stages over 1 and 2 file groups (`prep.parallelism`), each group's stages in processes
side by side as mapped tasks run, wall time from first start to last end (target: 2 groups >= 1.6x on 2 cores).

    python bench/prep_bench.py [--rows 1000000] [--features 16 64] [--formats csv parquet] [--fanout-rows N]
    python bench/prep_bench.py --only-fanout
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import TypeVar

from trainyard_contract import layout

T = TypeVar("T")

READ = """
import resource, sys, time
path, how = sys.argv[1], sys.argv[2]
if how == "pandas":
    import pandas as pd
    read = pd.read_parquet if path.endswith(".parquet") else pd.read_csv
    t = time.perf_counter(); rows = len(read(path))
else:
    import pyarrow.csv, pyarrow.parquet
    read = pyarrow.parquet.read_table if path.endswith(".parquet") else pyarrow.csv.read_csv
    t = time.perf_counter(); rows = read(path).num_rows
print(rows / (time.perf_counter() - t), resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)
"""


def config_for(features: int, file_format: str, parallelism: int = 1):  # noqa: ANN201 - PipelineConfig
    from trainyard_contract.schema import PipelineConfig

    return PipelineConfig.model_validate({
        "name": "bench",
        "data": {"source": "datasets/bench", "format": file_format, "label": {"name": "label", "classes": [0, 1]},
                 "features": [{"name": "f_{i}", "count": features, "dtype": "float", "min": -100, "max": 100}],
                 "shards": {"train": 4, "eval": 1}},
        "prep": {"parallelism": parallelism},
    })


def image_env() -> dict[str, str]:
    """This environment plus the prep image's own (registry.PREP.env: what every data-stage pod gets), for the
    stages and the plain reads alike: the reference runs under the same memory allocator settings."""
    from trainyard.dag.registry import PREP

    return {**os.environ, **dict(PREP.env)}


def launch(stage: str, volume: Path, run_dir: Path, config_json: str, *extra: str) -> subprocess.Popen:
    """The stage's entrypoint in its own process, as the local backend starts a pod."""
    env = {**image_env(), "TRAINYARD_CONFIG_JSON": config_json, "TF_CPP_MIN_LOG_LEVEL": "2"}
    return subprocess.Popen([sys.executable, "-m", "trainyard_prep", stage, "--volume", str(volume), "--run-dir",
                             str(run_dir), "--run-id", "bench", *extra], env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE)


def finish(child: subprocess.Popen, what: str) -> float:
    """Wait for `child`; its own peak RSS in MB (not the max over all children)."""
    _, status, usage = os.wait4(child.pid, 0)
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(f"{what} failed: {child.stderr.read().decode()[-3000:]}")
    return usage.ru_maxrss / 1024


def run_stage(stage: str, volume: Path, run_dir: Path, config_json: str) -> dict:
    t = time.perf_counter()
    peak = finish(launch(stage, volume, run_dir, config_json), stage)
    wall = time.perf_counter() - t
    out = run_dir / (layout.VALIDATION_RESULTS if stage == "validate" else layout.PREPARED_MANIFEST)
    throughput = json.loads(out.read_text())["throughput"]
    return {"wall": wall, "rows_per_second": throughput["rows_per_second"], "phases": throughput["us_per_row"],
            "peak_rss_mb": peak}


def plain_read(path: Path, how: str) -> tuple[float, float]:
    out = subprocess.run([sys.executable, "-c", READ, str(path), how], capture_output=True, text=True, check=True,
                         env=image_env())
    rate, rss = out.stdout.split()
    return float(rate), int(rss) / 1024


def in_fresh_process(function: Callable[..., T], *args: object, **kwargs: object) -> T:
    """`function(*args)` in a spawned process. Linux counts a child's peak RSS from before its exec, i.e. the
    memory of the process that started it: the tables are made elsewhere so this one stays small and the
    stages' peaks (os.wait4) are their own."""
    with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as pool:
        return pool.submit(function, *args, **kwargs).result()


def make_tables(root: Path, rows: int, features: int, file_format: str) -> dict[int, Path]:
    """Volumes holding the R-row file and the 10R-row file (the R file's rows ten times)."""
    import pyarrow.parquet as pq

    from trainyard_prep.example_data import write_synthetic

    small = root / f"{file_format}-{features}-1x"
    (path,) = write_synthetic(small / layout.DATASETS / "bench", rows=rows, features=features, classes=2,
                              file_format=file_format)
    large = root / f"{file_format}-{features}-10x"
    target = large / path.relative_to(small)
    target.parent.mkdir(parents=True)
    if file_format == "parquet":
        table = pq.read_table(path)
        with pq.ParquetWriter(target, table.schema) as writer:
            for _ in range(10):
                writer.write_table(table, row_group_size=200_000)
    else:
        with path.open("rb") as source, target.open("wb") as out:
            header = source.readline()
            body = source.read()
            out.write(header)
            for _ in range(10):
                out.write(body)
    return {rows: small, rows * 10: large}


def measure(volume: Path, rows: int, features: int, file_format: str) -> dict:
    config_json = config_for(features, file_format).model_dump_json()
    (path,) = (volume / layout.DATASETS / "bench").rglob(f"*.{file_format}")
    run_dir = volume / layout.RUNS / "bench" / "r"
    validate = run_stage("validate", volume, run_dir, config_json)
    prepare = run_stage("prepare", volume, run_dir, config_json)
    reads = {how: plain_read(path, how) for how in ("pandas", "pyarrow")}
    shutil.rmtree(volume / layout.RUNS)  # the shards: disk for the next size
    both = 1 / (1 / validate["rows_per_second"] + 1 / prepare["rows_per_second"])
    return {"rows": rows, "mb": path.stat().st_size / 1e6, "validate": validate, "prepare": prepare,
            "together": both, "reads": reads}


def phases(stage: dict) -> str:
    return ", ".join(f"{name} {us:.2f}" for name, us in stage["phases"].items())


def report(file_format: str, features: int, results: list[dict]) -> None:
    print(f"{file_format}, {features} float features + label:")
    for r in results:
        read_name, (read_rate, read_rss) = max(r["reads"].items(), key=lambda item: item[1][0])
        v, p = r["validate"], r["prepare"]
        print(f"  {r['rows']:>11,} rows ({r['mb']:,.0f} MB): read pandas {r['reads']['pandas'][0]:,.0f} / pyarrow "
              f"{r['reads']['pyarrow'][0]:,.0f} rows/s; validate {v['rows_per_second']:,.0f} rows/s "
              f"({v['wall']:.1f} s wall, peak {v['peak_rss_mb']:,.0f} MB); prepare {p['rows_per_second']:,.0f} "
              f"rows/s ({p['wall']:.1f} s wall, peak {p['peak_rss_mb']:,.0f} MB)")
        print(f"      validate+prepare {r['together']:,.0f} rows/s vs {read_name} read {read_rate:,.0f} rows/s "
              f"(peak {read_rss:,.0f} MB) -> {r['together'] / read_rate:.2f}x (target >= 0.5x); alone, validate "
              f"{v['rows_per_second'] / read_rate:.2f}x and prepare {p['rows_per_second'] / read_rate:.2f}x of the "
              f"read (each stage reads the file: together at most 0.5x unless a stage beats the read)")
        print(f"      us/row: validate [{phases(v)}]; prepare [{phases(p)}]")
    small, large = results
    growth = max(large["validate"]["peak_rss_mb"], large["prepare"]["peak_rss_mb"]) / max(
        small["validate"]["peak_rss_mb"], small["prepare"]["peak_rss_mb"])
    print(f"  peak RSS growth 1x -> 10x rows: {growth:.2f}x (target <= 1.3x)")


def fan_out(root: Path, rows: int, features: int, files: int) -> None:
    """The data stages as the DAG runs them, one group vs two: validate then prepare in one process each, against
    pin, two `validate --group` side by side, two `prepare --group` side by side, then merge. Wall seconds of each
    step and in all, from the first process's start to the last one's end (process starts included: each mapped
    task is a pod), the CPU seconds the steps used, and a check that both give the same shard bytes."""
    from trainyard_prep.example_data import write_synthetic

    in_fresh_process(write_synthetic, root / layout.DATASETS / "bench", rows=rows, features=features, days=files)
    walls, steps, shards, cpu = {}, {}, {}, {}
    for groups in (1, 2):
        config_json = config_for(features, "csv", groups).model_dump_json()
        run_dir = root / layout.RUNS / "bench" / f"groups-{groups}"
        plan = [("validate", [()]), ("prepare", [()])] if groups == 1 else [
            ("pin", [()]), ("validate", [("--group", str(g)) for g in range(groups)]),
            ("prepare", [("--group", str(g)) for g in range(groups)]), ("merge", [()])]
        steps[groups] = []
        before = os.times()
        for stage, calls in plan:
            t = time.perf_counter()
            children = [launch(stage, root, run_dir, config_json, *extra) for extra in calls]
            for child in children:
                finish(child, stage)
            steps[groups].append(f"{stage} {time.perf_counter() - t:.1f}")
        after = os.times()
        walls[groups] = sum(float(step.split()[-1]) for step in steps[groups])
        cpu[groups] = (after.children_user - before.children_user) + (after.children_system - before.children_system)
        shards[groups] = json.loads((run_dir / layout.PREPARED_MANIFEST).read_text())["shards"]
    same = "same shard bytes" if shards[1] == shards[2] else "DIFFERENT SHARD BYTES"
    shard_mb = sum(s["bytes"] for s in shards[1]) / 1e6
    print(f"fan-out, csv, {features} float features, {rows:,} rows in {files} files, {shard_mb:,.0f} MB of shards "
          f"({os.cpu_count()} cores):")
    for groups in (1, 2):
        print(f"  {groups} group(s): {walls[groups]:.1f} s wall [{', '.join(steps[groups])}], "
              f"{cpu[groups]:.1f} CPU s ({cpu[groups] / walls[groups]:.2f} cores busy)")
    print(f"  -> 2 mapped groups {walls[1] / walls[2]:.2f}x the speed of one (expected >= 1.6x on 2 cores); {same}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=1_000_000, help="R: the small table's rows (the large has 10R)")
    parser.add_argument("--features", type=int, nargs="+", default=[16, 64])
    parser.add_argument("--formats", nargs="+", choices=["csv", "parquet"], default=["csv", "parquet"])
    parser.add_argument("--tmp", type=Path, default=None, help="where the tables go (needs ~10 GB at the defaults)")
    parser.add_argument("--fanout-rows", type=int, default=4_000_000, help="rows of the 1 vs 2 groups table (0: skip)")
    parser.add_argument("--only-fanout", action="store_true", help="just the 1 vs 2 groups comparison")
    args = parser.parse_args()
    print(f"prep bench: {os.cpu_count()} cores; stage rows/s exclude imports; automatic chunk size")
    if args.fanout_rows:
        with tempfile.TemporaryDirectory(dir=args.tmp) as tmp:
            fan_out(Path(tmp), args.fanout_rows, features=16, files=4)
    if args.only_fanout:
        return 0
    for file_format in args.formats:
        for features in args.features:
            with tempfile.TemporaryDirectory(dir=args.tmp) as tmp:
                volumes = in_fresh_process(make_tables, Path(tmp), args.rows, features, file_format)
                results = [measure(volume, rows, features, file_format) for rows, volume in volumes.items()]
            report(file_format, features, results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
