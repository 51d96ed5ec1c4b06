"""Parse cost of generated DAGs vs hand-written ones of the same shape (target: ratio <= 1.5x).

Builds two dags folders with N pipelines each: (a) N YAML configs + N Trainyard shims, (b) N hand-written DAG files
with the same DAG arguments, Params, doc, the same 8 tasks (operators from the standard provider, with pools,
retries and trigger rules as the factory sets them) and the same edges. Each folder is parsed the way Airflow 3's
dag-processor parses: a parent process with the dag-processor's own modules loaded pre-imports the `airflow.*`
modules each file names (`[dag_processor] parsing_pre_import_modules`, on by default), then forks one child per
file that fills a DagBag from that file alone and serializes its DAG, as the processor sends it to the API server.
Nothing else is shared between files: whatever a file imports beyond the pre-imported modules, each child imports
again. A child fails the bench if TensorFlow, Great Expectations, pandas, numpy or the kubernetes client was
imported. The sum of the per-file times (fork to child exit) is compared by median over R repeats.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

HAND_WRITTEN = '''"""Hand-written Airflow DAG {i}: the same shape as a Trainyard DAG, without the config layer."""
import datetime as dt
from airflow.sdk import DAG, Param
from airflow.providers.standard.operators.bash import BashOperator
from airflow.providers.standard.operators.empty import EmptyOperator
from airflow.providers.standard.operators.python import BranchPythonOperator

DOC = """### hand_{i}

A hand-written pipeline with the same eight tasks as a generated one.

| task | on | what it does | reads | writes |
|---|---|---|---|---|
| `validate_data` | CPU | pin the inputs and validate them | - | `validation/` |
| `prepare_data` | CPU | split and shard into TFRecord | `validation/` | `prepared/` |
| `train` | GPU | parameter servers + workers | `prepared/` | `model/` |
| `teardown_train` | - | delete the job's replicas | - | - |
| `evaluate` | CPU | metrics against the champion | `model/` | `eval/` |
| `decide` | CPU | deploy or skip | `eval/` | `deploy/decision.json` |
| `skip_deploy` | - | the run did not earn deploy | - | - |
| `deploy` | CPU | publish to TF Serving | `model/` | `deploy/` |
""" + "Trigger with parameters to override steps, learning rate, batch size or replicas. " * 12

with DAG(
    dag_id="hand_{i}", description="hand written pipeline {i}", schedule="@daily",
    start_date=dt.datetime(2026, 11, 1, tzinfo=dt.UTC), catchup=False, max_active_runs=1,
    tags=["example", "trainyard"], doc_md=DOC,
    default_args={{"owner": "ml-platform", "retries": 1, "retry_delay": dt.timedelta(seconds=15)}},
    params={{
        "steps": Param(300, type="integer", minimum=1, title="Training steps", description="steps to train"),
        "learning_rate": Param(0.05, type="number", exclusiveMinimum=0, title="Learning rate",
                               description="the optimizer's learning rate"),
        "batch_size": Param(64, type="integer", minimum=1, title="Batch size", description="examples per step"),
        "workers": Param(2, type="integer", minimum=1, maximum=4, title="Workers", description="worker replicas"),
        "ps": Param(1, type="integer", minimum=1, maximum=4, title="Parameter servers", description="PS replicas"),
        "window_days": Param(None, type=["null", "integer"], title="Window", description="days of data"),
        "force_deploy": Param(False, type="boolean", title="Force deploy", description="deploy regardless"),
    }},
) as dag:
    validate = BashOperator(task_id="validate_data", bash_command="python -m prep validate", doc_md="validate")
    prepare = BashOperator(task_id="prepare_data", bash_command="python -m prep prepare", doc_md="prepare")
    train = BashOperator(task_id="train", bash_command="python -m trainer train", pool="trainyard_training",
                         execution_timeout=dt.timedelta(hours=6), doc_md="train")
    teardown = BashOperator(task_id="teardown_train", bash_command="true", trigger_rule="all_done",
                            doc_md="teardown")
    evaluate = BashOperator(task_id="evaluate", bash_command="python -m trainer evaluate", doc_md="evaluate")
    decide = BranchPythonOperator(task_id="decide", python_callable=lambda: "deploy", doc_md="decide")
    skip = EmptyOperator(task_id="skip_deploy", doc_md="skip")
    deploy = BashOperator(task_id="deploy", bash_command="python -m serving deploy", pool="trainyard_deploy",
                          doc_md="deploy")
    validate >> prepare >> train >> evaluate >> decide >> deploy
    train >> teardown
    decide >> skip
'''

PARSE = """
import importlib, json, os, sys, time
from pathlib import Path
import airflow.dag_processing.manager, airflow.dag_processing.processor  # what the dag-processor has loaded
from airflow.dag_processing.dagbag import DagBag
from airflow.serialization.serialized_objects import DagSerialization
from airflow.utils.file import iter_airflow_imports

folder = Path(sys.argv[1])
HEAVY = ("tensorflow", "great_expectations", "pandas", "kubernetes", "numpy")
per_file = []
for path in sorted(folder.glob("*.py")):
    for module in iter_airflow_imports(str(path)):  # the dag-processor's pre-import, in the parent
        importlib.import_module(module)
    started = time.perf_counter()
    pid = os.fork()
    if pid == 0:  # the per-file child: parse, serialize, exit
        bag = DagBag(dag_folder=str(path), safe_mode=False)
        for dag in bag.dags.values():
            DagSerialization.to_dict(dag)
        heavy = [m for m in HEAVY if m in sys.modules]
        if heavy:
            print(f"{path.name} imported {heavy} at parse time", file=sys.stderr)
        os._exit(1 if len(bag.dags) != 1 or bag.import_errors else 2 if heavy else 0)
    _, status = os.waitpid(pid, 0)
    per_file.append(time.perf_counter() - started)
    code = os.waitstatus_to_exitcode(status)
    if code:
        raise SystemExit(f"{path}: " + ("did not parse into exactly one DAG" if code == 1 else "heavy imports"))
print(json.dumps({"seconds": sum(per_file), "median_file": sorted(per_file)[len(per_file) // 2],
                  "first_file": per_file[0], "files": len(per_file)}))
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
        shim = '"""Airflow DAG shim."""\nfrom trainyard.dag.factory import dag_from_config\n\n'
        (dags / f"gen_{i}.py").write_text(f'{shim}dag = dag_from_config("gen_{i}")\n')
    return dags


def make_hand_written(folder: Path, n: int) -> Path:
    dags = folder / "hand"
    dags.mkdir()
    for i in range(n):
        (dags / f"hand_{i}.py").write_text(HAND_WRITTEN.format(i=i))
    return dags


def parse(dags: Path, env: dict[str, str]) -> dict[str, float]:
    out = subprocess.run([sys.executable, "-c", PARSE, str(dags)], capture_output=True, text=True, env=env)
    if out.returncode != 0:
        raise SystemExit(f"parsing {dags} failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--pipelines", type=int, default=50)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        generated, hand = make_generated(root, args.pipelines), make_hand_written(root, args.pipelines)
        env = {**os.environ, "TRAINYARD_PIPELINES_DIR": str(root / "pipelines")}
        results: dict[str, list[dict[str, float]]] = {"generated": [], "hand_written": []}
        for _ in range(args.repeats):
            for name, folder in (("generated", generated), ("hand_written", hand)):
                report = parse(folder, env)
                if report["files"] != args.pipelines:
                    raise SystemExit(f"{name}: parsed {report['files']} files, expected {args.pipelines}")
                results[name].append(report)

    def median(name: str, key: str) -> float:
        return statistics.median(r[key] for r in results[name])

    gen, hand_s = median("generated", "seconds"), median("hand_written", "seconds")
    gen_file, hand_file = median("generated", "median_file"), median("hand_written", "median_file")
    print(f"parse bench: {args.pipelines} DAGs, one forked child per file after the airflow.* pre-import "
          f"(as Airflow's dag-processor), median of {args.repeats} repeats")
    print(f"  generated (YAML + factory): {gen:.3f} s total, {gen_file * 1000:.2f} ms median per file, "
          f"slowest (first) file {median('generated', 'first_file') * 1000:.0f} ms")
    print(f"  hand-written:               {hand_s:.3f} s total, {hand_file * 1000:.2f} ms median per file, "
          f"slowest (first) file {median('hand_written', 'first_file') * 1000:.0f} ms")
    print(f"  ratio, whole folder:        {gen / hand_s:.2f}x (target <= 1.50x)")
    print(f"  ratio, per file (steady):   {gen_file / hand_file:.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
