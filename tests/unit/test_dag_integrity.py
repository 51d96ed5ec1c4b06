"""The dags folder: every config is one DAG, nothing heavy is imported at parse time, bad configs stay isolated."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from airflow.dag_processing.dagbag import DagBag

from trainyard.config.loader import pipeline_files

REPO = Path(__file__).resolve().parents[2]
HEAVY = ("tensorflow", "great_expectations", "pandas", "numpy", "keras", "kubernetes", "sklearn")

PARSE_IN_FRESH_PROCESS = """
import json, sys
from airflow.dag_processing.dagbag import DagBag
bag = DagBag(dag_folder=sys.argv[1])
print(json.dumps({"errors": {k: str(v) for k, v in bag.import_errors.items()}, "dags": sorted(bag.dag_ids),
                  "heavy": [m for m in sys.argv[2:] if m in sys.modules]}))
"""


def test_parsing_the_dags_folder_imports_nothing_heavy() -> None:
    out = subprocess.run([sys.executable, "-c", PARSE_IN_FRESH_PROCESS, str(REPO / "dags"), *HEAVY],
                         capture_output=True, text=True, check=True, cwd=REPO)
    report = json.loads(out.stdout.strip().splitlines()[-1])
    assert report["errors"] == {}
    assert report["dags"] == sorted(p.stem for p in pipeline_files(REPO / "pipelines_config"))
    assert report["heavy"] == []


LOAD_PLUGINS_IN_FRESH_PROCESS = """
import json, sys
from airflow import plugins_manager
plugins_manager.ensure_plugins_loaded()
import kubernetes.client  # what KubernetesPodOperator needs after Airflow has loaded its plugins
loaded_again = [name for name, module in list(sys.modules.items()) if not name.startswith("trainyard")
                and (getattr(module, "__file__", None) or "").startswith(sys.argv[1])]
print(json.dumps({"errors": plugins_manager.get_import_errors(), "kubernetes": kubernetes.client.__name__,
                  "top_level": sorted(loaded_again)}))
"""


def test_airflow_s_plugin_loader_leaves_the_trainyard_package_alone(tmp_path: Path) -> None:
    """Was: Airflow executed every file under plugins/ again as a top-level module named after the file, so
    backends/kubernetes.py became `sys.modules["kubernetes"]` and `import kubernetes.client` failed after it."""
    env = {**os.environ, "AIRFLOW_HOME": str(tmp_path), "AIRFLOW__CORE__PLUGINS_FOLDER": str(REPO / "plugins"),
           "AIRFLOW__CORE__LOAD_EXAMPLES": "False"}
    out = subprocess.run([sys.executable, "-c", LOAD_PLUGINS_IN_FRESH_PROCESS, str(REPO / "plugins" / "trainyard")],
                         capture_output=True, text=True, cwd=tmp_path, env=env, timeout=120)
    assert out.returncode == 0, out.stderr[-3000:]
    report = json.loads(out.stdout.strip().splitlines()[-1])
    assert report == {"errors": {}, "kubernetes": "kubernetes.client", "top_level": []}


def test_every_config_has_a_shim_and_every_shim_a_config() -> None:
    configs = {p.stem for p in pipeline_files(REPO / "pipelines_config")}
    shims = {p.stem for p in (REPO / "dags").glob("*.py") if not p.name.startswith("_")}
    assert configs == shims
    for name in shims:
        text = (REPO / "dags" / f"{name}.py").read_text()
        assert f'dag_from_config("{name}")' in text
        assert "airflow" in text.lower() and "dag" in text.lower()  # Airflow's safe-mode parse heuristics


def test_dag_carries_params_docs_tags_owner(pipelines_dir: Path) -> None:
    from trainyard.dag.factory import dag_from_config

    dag = dag_from_config("digits")
    assert dag.dag_id == "digits"
    assert [t.task_id for t in dag.tasks] == ["validate_data", "prepare_data", "train", "teardown_train",
                                              "evaluate", "decide", "skip_deploy", "deploy"]
    assert dag.get_task("train").upstream_task_ids == {"prepare_data"}
    assert dag.get_task("train").downstream_task_ids == {"evaluate", "teardown_train"}
    assert dag.get_task("teardown_train").trigger_rule == "all_done"
    assert dag.get_task("decide").downstream_task_ids == {"deploy", "skip_deploy"}
    assert dag.get_task("prepare_data").upstream_task_ids == {"validate_data"}
    assert {"trainyard", "example", "vision"} <= set(dag.tags)
    assert dag.default_args["owner"] == "ml-platform" and dag.default_args["retries"] == 1
    assert {"steps", "learning_rate", "batch_size", "workers", "ps", "window_days", "force_deploy"} <= set(dag.params)
    assert "datasets/digits" in dag.doc_md and "validate_data" in dag.doc_md
    # the task table comes from the stage declarations: hardware, what each stage reads and writes
    assert "| `deploy` | CPU | Only with decide's blessing" in dag.doc_md
    assert "| `decide` | CPU | Thresholds met and better than the champion (or forced): deploy, else skip; reasons " \
           "logged. | `eval/metrics.json`, `inputs/manifest.json` | `deploy/decision.json` |" in dag.doc_md
    assert "| `teardown_train` | - |" in dag.doc_md and "| `skip_deploy` | - |" in dag.doc_md


def test_prep_parallelism_maps_validate_and_prepare_over_file_groups(pipelines_dir: Path) -> None:
    from airflow.serialization.serialized_objects import DagSerialization

    from trainyard.dag.factory import dag_from_config

    path = pipelines_dir / "digits.yaml"
    path.write_text(path.read_text().replace("  shards: {train: 4, eval: 1}\n",
                                             "  shards: {train: 4, eval: 1}\nprep: {parallelism: 3}\n"))
    dag = dag_from_config("digits")
    assert [t.task_id for t in dag.tasks] == ["pin_inputs", "validate_data", "prepare_data", "merge_data", "train",
                                              "teardown_train", "evaluate", "decide", "skip_deploy", "deploy"]
    for task_id in ("validate_data", "prepare_data"):
        mapped = dag.get_task(task_id)
        assert type(mapped).__name__ == "MappedOperator"
        (arg,) = mapped.expand_input.value.values()  # each group is one task: --group <item of pin's result>
        assert list(mapped.expand_input.value) == ["group"] and arg.operator.task_id == "pin_inputs"
    assert dag.get_task("validate_data").upstream_task_ids == {"pin_inputs"}
    assert dag.get_task("prepare_data").upstream_task_ids == {"pin_inputs", "validate_data"}  # its groups, too
    assert dag.get_task("merge_data").upstream_task_ids == {"prepare_data"}
    assert dag.get_task("train").upstream_task_ids == {"merge_data"}
    assert "up to 3 CPU pods" in dag.doc_md and "One task (and pod) per file group." in dag.doc_md
    assert "| `merge_data` | CPU |" in dag.doc_md
    serialized = DagSerialization.to_dict(dag)  # what the dag-processor sends to the API server
    assert {t["__var"]["task_id"] for t in serialized["dag"]["tasks"]} == set(dag.task_ids)


def test_a_bad_config_is_an_import_error_for_its_own_dag_only(
    pipelines_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    bad = pipelines_dir / "broken.yaml"
    bad.write_text((pipelines_dir / "digits.yaml").read_text().replace("name: digits", "name: broken")
                   .replace("steps: 300", "steps: -5"))
    dags = tmp_path / "dags"
    dags.mkdir()
    for name in ("digits", "broken"):
        (dags / f"{name}.py").write_text(
            f'"""airflow dag shim"""\nfrom trainyard.dag.factory import dag_from_config\n'
            f'dag = dag_from_config("{name}")\n'
        )
    bag = DagBag(dag_folder=str(dags))
    assert sorted(bag.dag_ids) == ["digits"]
    (error,) = bag.import_errors.values()
    line = next(n for n, text in enumerate(bad.read_text().splitlines(), 1) if "steps: -5" in text)
    assert f"broken.yaml:{line}:10: training.steps: must be ≥ 1 (got -5)" in error


def test_train_and_deploy_run_in_their_pools_and_the_doc_says_so(pipelines_dir: Path) -> None:
    from trainyard.dag.factory import dag_from_config

    dag = dag_from_config("digits")
    pools = {t.task_id: t.pool for t in dag.tasks}
    assert pools["train"] == "trainyard_training" and pools["deploy"] == "trainyard_deploy"
    assert {pools[t] for t in ("validate_data", "prepare_data", "evaluate", "decide", "teardown_train")} == {
        "default_pool"}
    assert "*schedule:* manual" in dag.doc_md and "`trainyard_training` (train)" in dag.doc_md


def test_an_asset_schedule_becomes_an_airflow_asset(pipelines_dir: Path) -> None:
    from airflow.sdk import Asset

    from trainyard.config.loader import load_pipeline_file
    from trainyard.dag.factory import dag_from_config
    from trainyard.dag.pools import required_pools

    text = (pipelines_dir / "digits.yaml").read_text()
    (pipelines_dir / "ondata.yaml").write_text(
        text.replace("name: digits", "name: ondata").replace("schedule: null", "schedule: {asset: datasets/digits}"))
    dag = dag_from_config("ondata")
    (asset,) = dag.timetable.asset_condition.objects
    assert isinstance(asset, Asset) and asset.uri == "trainyard://volume/datasets/digits"
    assert "on new data (Asset `trainyard://volume/datasets/digits`)" in dag.doc_md
    configs = [load_pipeline_file(pipelines_dir / f"{n}.yaml") for n in ("digits", "ondata")]
    assert required_pools(configs) == {"trainyard_deploy": "Trainyard: digits.deploy, ondata.deploy",
                                       "trainyard_training": "Trainyard: digits.train, ondata.train"}


def test_mark_data_refuses_a_pipeline_that_is_not_scheduled_on_data(
    pipelines_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from trainyard.cli import main

    assert main(["mark-data", "digits"]) == 2
    assert "not scheduled on data (schedule: None); set `schedule: {asset: datasets/digits}`" in capsys.readouterr().err


def test_a_shim_written_before_the_split_still_builds_its_dag(pipelines_dir: Path) -> None:
    """DAG shims in teams' folders import `trainyard.dag_factory`; the package split must not break them."""
    from trainyard.dag_factory import dag_from_config

    assert dag_from_config("digits", pipelines_dir).dag_id == "digits"
