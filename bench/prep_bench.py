"""validate_data + prepare_data throughput vs pandas.read_csv, and peak memory at 1x and 10x rows.

Targets: stage rows/s >= 0.5x the rows/s of `pandas.read_csv` on the same file; peak RSS growth from 1x to 10x rows
<= 1.3x. Each measurement runs the real stage entrypoint (`python -m trainyard_prep ...`) in its own process, as
the local backend does; rows/s are the stages' own figures (from their first to their last row, imports excluded),
and wall seconds are printed beside them.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "plugins"))
sys.path.insert(0, str(REPO / "images" / "prep"))
sys.path.insert(0, str(REPO / "contract"))

from trainyard_contract import layout  # noqa: E402

READ_CSV = """
import resource, sys, time
import pandas as pd
t = time.perf_counter()
rows = len(pd.read_csv(sys.argv[1]))
print(rows / (time.perf_counter() - t), resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)
"""


def config_for(features: int, chunk_rows: int):
    from trainyard_contract.schema import PipelineConfig

    return PipelineConfig.model_validate({
        "name": "bench",
        "data": {"source": "datasets/bench", "label": {"name": "label", "classes": [0, 1]},
                 "features": [{"name": "f_{i}", "count": features, "dtype": "float", "min": -100, "max": 100}],
                 "shards": {"train": 4, "eval": 1}},
        "prep": {"chunk_rows": chunk_rows},
    })


def run_stage(stage: str, volume: Path, run_dir: Path, config_json: str) -> dict:
    env = {**os.environ, "TRAINYARD_CONFIG_JSON": config_json, "TF_CPP_MIN_LOG_LEVEL": "2"}
    t = time.perf_counter()
    child = subprocess.Popen([sys.executable, "-m", "trainyard_prep", stage, "--volume", str(volume), "--run-dir",
                              str(run_dir), "--run-id", "bench"], env=env, stdout=subprocess.DEVNULL,
                             stderr=subprocess.DEVNULL)
    _, status, usage = os.wait4(child.pid, 0)  # this child's own peak RSS, not the max over all children
    child.returncode = os.waitstatus_to_exitcode(status)
    wall = time.perf_counter() - t
    if child.returncode != 0:
        raise SystemExit(f"{stage} failed with exit code {child.returncode}")
    out = run_dir / (layout.VALIDATION_RESULTS if stage == "validate" else layout.PREPARED_MANIFEST)
    return {"wall": wall, "rows_per_second": json.loads(out.read_text())["throughput"]["rows_per_second"],
            "peak_rss_mb": usage.ru_maxrss / 1024}


def measure(rows: int, features: int, root: Path, chunk_rows: int) -> dict:
    from trainyard_prep.example_data import write_synthetic

    volume = root / f"v{rows}"
    (path,) = write_synthetic(volume / layout.DATASETS / "bench", rows=rows, features=features, classes=2)
    config_json = config_for(features, chunk_rows).model_dump_json()
    run_dir = volume / layout.RUNS / "bench" / "r"
    validate = run_stage("validate", volume, run_dir, config_json)
    prepare = run_stage("prepare", volume, run_dir, config_json)
    read = subprocess.run([sys.executable, "-c", READ_CSV, str(path)], capture_output=True, text=True, check=True)
    read_rps, read_rss = read.stdout.split()
    both = 1 / (1 / validate["rows_per_second"] + 1 / prepare["rows_per_second"])
    return {"rows": rows, "mb": path.stat().st_size / 1e6, "validate": validate, "prepare": prepare,
            "stage_rows_per_second": both, "read_csv_rows_per_second": float(read_rps),
            "read_csv_peak_rss_mb": int(read_rss) / 1024}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rows", type=int, default=200_000)
    parser.add_argument("--features", type=int, default=16)
    parser.add_argument("--chunk-rows", type=int, default=50_000, help="prep.chunk_rows (bounds memory)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        small = measure(args.rows, args.features, Path(tmp), args.chunk_rows)
        large = measure(args.rows * 10, args.features, Path(tmp), args.chunk_rows)
    print(f"prep bench: {args.features} float features + label, chunk_rows={args.chunk_rows}")
    for r in (small, large):
        print(f"  {r['rows']:>9,} rows ({r['mb']:.0f} MB): validate {r['validate']['rows_per_second']:>9,.0f} rows/s "
              f"({r['validate']['wall']:.1f} s wall, peak {r['validate']['peak_rss_mb']:.0f} MB); "
              f"prepare {r['prepare']['rows_per_second']:>9,.0f} rows/s ({r['prepare']['wall']:.1f} s wall, "
              f"peak {r['prepare']['peak_rss_mb']:.0f} MB)")
        ratio = r["stage_rows_per_second"] / r["read_csv_rows_per_second"]
        print(f"            validate+prepare {r['stage_rows_per_second']:,.0f} rows/s vs pandas.read_csv "
              f"{r['read_csv_rows_per_second']:,.0f} rows/s -> {ratio:.2f}x "
              f"(target >= 0.5x); read_csv peak {r['read_csv_peak_rss_mb']:.0f} MB")
    growth = max(large["validate"]["peak_rss_mb"], large["prepare"]["peak_rss_mb"]) / max(
        small["validate"]["peak_rss_mb"], small["prepare"]["peak_rss_mb"])
    print(f"  peak RSS growth 1x -> 10x rows: {growth:.2f}x (target <= 1.3x)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
