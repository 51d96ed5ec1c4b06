"""Tabular figures, side by side in one run (ratios: this machine is shared and noisy).

1. prepare_data rows/s on Parquet vs CSV of the same table: a numeric one (synthetic, 16 float features) and the
   churn table (string, int-categorical, nullable and int columns), each read, split, hashed, encoded, written.
2. Training examples/s of the built-in MLP with the churn table's categorical features (vocabulary lookups in the
   input pipeline, one-hot / embeddings in the model) vs the same table with its numeric features only.

    python bench/tabular_bench.py [--rows 200000] [--steps 600]
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
REPO = Path(__file__).resolve().parents[1]


def write(frame, folder: Path, suffix: str) -> None:  # noqa: ANN001 - a DataFrame
    day = folder / "date=2026-11-30"
    day.mkdir(parents=True, exist_ok=True)
    if suffix == "parquet":
        frame.to_parquet(day / "part-0.parquet", index=False)
    else:
        frame.to_csv(day / "part-0.csv", index=False)


def prepare_rate(config, volume: Path, run: str) -> float:  # noqa: ANN001 - PipelineConfig
    from trainyard_contract import layout
    from trainyard_prep.inputs import pin_inputs
    from trainyard_prep.prepare import prepare

    run_dir = volume / layout.RUNS / config.name / run
    manifest = pin_inputs(volume, run_dir, config.data, None)
    started = time.perf_counter()
    out = prepare(run_dir, config, manifest)
    return (out["rows"]["train"] + out["rows"]["eval"]) / (time.perf_counter() - started)


def with_format(config, fmt: str, source: str, **data):  # noqa: ANN001, ANN201
    from trainyard_contract.schema import PipelineConfig

    dumped = config.model_dump()
    dumped["data"] = {**dumped["data"], "format": fmt, "source": source, **data}
    return PipelineConfig.model_validate(dumped)


def numeric_config(features: int):  # noqa: ANN201
    from trainyard_contract.schema import PipelineConfig

    return PipelineConfig.model_validate({
        "name": "synthetic", "data": {"source": "datasets/s", "label": {"name": "label", "classes": [0, 1]},
                                      "features": [{"name": "f_{i}", "count": features}]}})


def bench_prepare(root: Path, rows: int) -> dict[str, dict[str, float]]:
    import numpy as np
    import pandas as pd

    from trainyard.config.loader import load_pipeline_file
    from trainyard_contract import layout
    from trainyard_prep.example_data import churn_frame

    rng = np.random.default_rng(0)
    numeric = pd.DataFrame(rng.normal(size=(rows, 16)).round(4), columns=[f"f_{j}" for j in range(16)])
    numeric["label"] = (numeric["f_0"] + numeric["f_1"] > 0).astype(int)
    tables = {"numeric (16 float)": (numeric, numeric_config(16)),
              "churn (strings, categorical)": (churn_frame(rows // 4, seed=0),
                                               load_pipeline_file(REPO / "pipelines_config" / "churn.yaml"))}
    results: dict[str, dict[str, float]] = {}
    for name, (frame, config) in tables.items():
        rates: dict[str, list[float]] = {"csv": [], "parquet": []}
        for fmt in ("csv", "parquet"):
            write(frame, root / layout.DATASETS / f"{config.name}-{fmt}", fmt)
        for round_ in range(2):  # alternating rounds against drift
            for fmt in ("csv", "parquet"):
                cfg = with_format(config, fmt, f"{layout.DATASETS}/{config.name}-{fmt}")
                rates[fmt].append(prepare_rate(cfg, root, f"{fmt}-{round_}"))
        results[name] = {"rows": len(frame), "csv_rows_per_s": max(rates["csv"]),
                         "parquet_rows_per_s": max(rates["parquet"]),
                         "parquet_vs_csv": max(rates["parquet"]) / max(rates["csv"])}
    return results


def bench_training(root: Path, steps: int) -> dict[str, float]:
    from trainyard.config.loader import load_pipeline_file
    from trainyard_contract import layout
    from trainyard_prep.example_data import churn_frame
    from trainyard_prep.inputs import pin_inputs
    from trainyard_prep.prepare import prepare
    from trainyard_trainer.data import load_schema
    from trainyard_trainer.train import train

    base = load_pipeline_file(REPO / "pipelines_config" / "churn.yaml")
    write(churn_frame(20_000, seed=1), root / layout.DATASETS / "churn-train", "parquet")
    dumped = base.model_dump()
    numeric_only = [f for f in dumped["data"]["features"] if f["dtype"] != "string" and f.get("kind") != "categorical"]
    variants = {"categorical + numeric": {}, "numeric only": {"features": numeric_only}}
    rates: dict[str, list[float]] = {name: [] for name in variants}
    for name, changes in variants.items():
        config = with_format(base, "parquet", f"{layout.DATASETS}/churn-train", **changes)
        dumped_config = config.model_dump()
        dumped_config["training"] = {**dumped_config["training"], "strategy": "single", "steps": steps,
                                     "checkpoint_every_steps": steps // 2, "batch_size": 256,
                                     "ps": {"replicas": 0}, "workers": {"replicas": 0}}
        config = type(config).model_validate(dumped_config)
        run_dir = root / layout.RUNS / "churn" / name.replace(" ", "_").replace("+", "and")
        prepare(run_dir, config, pin_inputs(root, run_dir, config.data, None))
        for round_ in range(2):
            result, _ = train(config, run_dir, None, load_schema(run_dir), checkpoint_dir=run_dir / f"ckpt-{round_}")
            rates[name].append(result.examples_per_second)
    best = {name: max(values) for name, values in rates.items()}
    return {**{f"{name} examples/s": value for name, value in best.items()},
            "categorical_vs_numeric_only": best["categorical + numeric"] / best["numeric only"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rows", type=int, default=200_000)
    parser.add_argument("--steps", type=int, default=600)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="trainyard-tabular-bench-") as tmp:
        root = Path(tmp)
        figures = {"prepare": bench_prepare(root, args.rows), "training (single process, batch 256)":
                   bench_training(root, args.steps)}
    print(json.dumps(figures, indent=2))


if __name__ == "__main__":
    main()
