"""Parse cost of generated DAGs vs hand-written ones (target: ratio <= 1.2x).

Builds two dags folders with N pipelines each: (a) N YAML configs + N Trainyard shims, (b) N hand-written DAG files
with the same DAG arguments, Params and two tasks. Each folder is parsed by a fresh process with Airflow's DagBag,
R times; the DagBag fill time (not interpreter start or `import airflow`) is compared by median.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

HAND_WRITTEN = '''"""Hand-written airflow DAG {i}: the same shape as a Trainyard DAG, without the config layer."""
import datetime as dt
from airflow.sdk import DAG, Param
from airflow.providers.standard.operators.bash import BashOperator

with DAG(
    dag_id="hand_{i}", description="hand written", schedule=None,
    start_date=dt.datetime(2026, 11, 1, tzinfo=dt.UTC), catchup=False, max_active_runs=1,
    tags=["example", "trainyard"], doc_md="### hand written\\nsame shape as the generated DAGs",
    default_args={{"owner": "ml-platform", "retries": 1, "retry_delay": dt.timedelta(seconds=15)}},
    params={{
        "steps": Param(300, type="integer", minimum=1), "learning_rate": Param(0.05, type="number"),
        "batch_size": Param(64, type="integer", minimum=1), "workers": Param(2, type="integer", maximum=4),
        "ps": Param(1, type="integer"), "window_days": Param(None, type=["null", "integer"]),
        "force_deploy": Param(False, type="boolean"),
    }},
) as dag:
    validate = BashOperator(task_id="validate_data", bash_command="echo validate")
    prepare = BashOperator(task_id="prepare_data", bash_command="echo prepare")
    validate >> prepare
'''

PARSE = """
import json, statistics, sys, time
from airflow.dag_processing.dagbag import DagBag
t = time.perf_counter()
bag = DagBag(dag_folder=sys.argv[1])
elapsed = time.perf_counter() - t
per_file = [s.duration.total_seconds() for s in bag.dagbag_stats]
print(json.dumps({"seconds": elapsed, "median_file": statistics.median(per_file), "first_file": max(per_file),
                  "dags": len(bag.dag_ids), "errors": len(bag.import_errors)}))
"""


def make_generated(folder: Path, n: int) -> Path:
    configs, dags = folder / "pipelines", folder / "dags"
    configs.mkdir()
    dags.mkdir()
    shutil.copy(REPO / "pipelines_config" / "_defaults.yaml", configs)
    template = (REPO / "pipelines_config" / "digits.yaml").read_text()
    for i in range(n):
        text = template.replace("\nname: digits", f"\nname: gen_{i}")
        (configs / f"gen_{i}.yaml").write_text(text.replace("model_name: digits", f"model_name: gen-{i}"))
        shim = '"""Airflow DAG shim."""\nfrom trainyard.dag_factory import dag_from_config\n\n'
        (dags / f"gen_{i}.py").write_text(f'{shim}dag = dag_from_config("gen_{i}")\n')
    return dags


def make_hand_written(folder: Path, n: int) -> Path:
    dags = folder / "hand"
    dags.mkdir()
    for i in range(n):
        (dags / f"hand_{i}.py").write_text(HAND_WRITTEN.format(i=i))
    return dags


def parse(dags: Path, env: dict[str, str]) -> dict[str, float]:
    out = subprocess.run([sys.executable, "-c", PARSE, str(dags)], capture_output=True, text=True, check=True, env=env)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--pipelines", type=int, default=50)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    import os

    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        generated, hand = make_generated(root, args.pipelines), make_hand_written(root, args.pipelines)
        env = {**os.environ, "TRAINYARD_PIPELINES_DIR": str(root / "pipelines")}
        results: dict[str, list[dict[str, float]]] = {"generated": [], "hand_written": []}
        for _ in range(args.repeats):
            for name, folder in (("generated", generated), ("hand_written", hand)):
                report = parse(folder, env)
                if report["dags"] != args.pipelines or report["errors"]:
                    raise SystemExit(f"{name}: parsed {report['dags']} DAGs with {report['errors']} import errors")
                results[name].append(report)

    def median(name: str, key: str) -> float:
        return statistics.median(r[key] for r in results[name])

    gen, hand_s = median("generated", "seconds"), median("hand_written", "seconds")
    gen_file, hand_file = median("generated", "median_file"), median("hand_written", "median_file")
    print(f"parse bench: {args.pipelines} DAGs, median of {args.repeats} fresh-process DagBag fills")
    print(f"  generated (YAML + factory): {gen:.3f} s total, {gen_file * 1000:.2f} ms median per file, "
          f"slowest (first) file {median('generated', 'first_file') * 1000:.0f} ms")
    print(f"  hand-written:               {hand_s:.3f} s total, {hand_file * 1000:.2f} ms median per file, "
          f"slowest (first) file {median('hand_written', 'first_file') * 1000:.0f} ms")
    print(f"  ratio, whole folder:        {gen / hand_s:.2f}x (target <= 1.20x)")
    print(f"  ratio, per file (steady):   {gen_file / hand_file:.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
