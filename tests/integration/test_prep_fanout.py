"""Fan-out of the data stages (`prep.parallelism`): pin, one validate / prepare per file group, merge.

The stage entrypoints run as each mapped task's pod runs them (`python -m trainyard_prep <command> --group G`,
here called in-process), and the result must not depend on the number of groups: the same shard bytes, split,
statistics and schema for 1, 2 and 3 groups. A bad file fails its own group, named; a group's rerun (Airflow's
retry of one map index) touches nothing of the other groups. The run through Airflow is in test_pipeline_run.py
and test_tabular_tasks.py (churn fans out over two groups).
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import os
from pathlib import Path

import pytest

from tests.integration.test_pipeline_run import run_folder, trainyard
from trainyard.config.loader import load_pipeline_file
from trainyard.dag.stages import CONFIG_ENV
from trainyard_contract import layout
from trainyard_contract.runtime import EXIT_BAD_INPUT
from trainyard_contract.schema import PipelineConfig
from trainyard_prep.__main__ import main as prep_main
from trainyard_prep.example_data import churn_frame, write_churn, write_synthetic
from trainyard_prep.validate import GROUP_SUMMARY

pytestmark = pytest.mark.integration
END = dt.date(2026, 11, 30)
SAME = ("rows", "shards", "split", "inputs")  # of prepared/manifest.json (the rest: timing, the config's hash)


def numeric_table(volume: Path, days: int, file_format: str = "csv") -> PipelineConfig:
    """Five float features and a binary label, one file per day (few expectations: quick to validate)."""
    write_synthetic(volume / layout.DATASETS / "numbers", rows=600 * days, features=5, days=days, end=END,
                    file_format=file_format)
    return PipelineConfig.model_validate({
        "name": "numbers",
        "data": {"source": "datasets/numbers", "format": file_format, "label": {"name": "label", "classes": [0, 1]},
                 "features": [{"name": "f_{i}", "count": 5, "dtype": "float", "min": -100, "max": 100}],
                 "expectations": {"min_rows": 10}, "shards": {"train": 3, "eval": 2}},
    })


def with_prep(config: PipelineConfig, **changes: object) -> PipelineConfig:
    return config.model_copy(update={"prep": config.prep.model_copy(update=changes)})


class Stages:
    """The prep image's entrypoint for one run folder, as the pods of a run call it."""

    def __init__(self, volume: Path, run: str, config: PipelineConfig, monkeypatch: pytest.MonkeyPatch):
        self.volume, self.config = volume, config
        self.run_dir = volume / layout.RUNS / config.name / run
        monkeypatch.setenv(CONFIG_ENV, config.model_dump_json())

    def __call__(self, command: str, *extra: str) -> int:
        return prep_main([command, "--volume", str(self.volume), "--run-dir", str(self.run_dir), "--run-id", "r",
                          *extra])

    def fanned_out(self) -> int:
        """pin, then every group's validate, then every group's prepare, then merge: the mapped DAG's order."""
        assert self("pin") == 0
        groups = json.loads((self.run_dir / layout.INPUT_GROUPS).read_text())["groups"]
        for command in ("validate", "prepare"):
            for group in groups:
                assert self(command, "--group", str(group["index"])) == 0, (command, group)
        assert self("merge") == 0
        return len(groups)


def prepared_bytes(run_dir: Path) -> dict[str, str]:
    """sha256 of every prepared file but the manifest, and of the manifest's fields that describe the data."""
    found = {str(p.relative_to(run_dir)): hashlib.sha256(p.read_bytes()).hexdigest()
             for p in sorted((run_dir / layout.PREPARED).rglob("*"))
             if p.is_file() and p.name != layout.PREPARED_MANIFEST.name}
    manifest = json.loads((run_dir / layout.PREPARED_MANIFEST).read_text())
    found["manifest"] = json.dumps({key: manifest[key] for key in SAME}, sort_keys=True)
    return found


def validation_of(run_dir: Path) -> dict:
    results = json.loads((run_dir / layout.VALIDATION_RESULTS).read_text())
    pages = sorted((run_dir / layout.DATA_DOCS / "validations").rglob("*.html"))
    return {"success": results["success"], "rows": results["rows"], "files": results["files"],
            "label_counts": results["label_counts"], "pages": len(pages)}


@pytest.mark.parametrize("dataset", ["numbers", "churn"])
def test_one_two_and_three_groups_give_the_same_bytes(dataset: str, pipelines_dir: Path, data_dir: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """numbers: CSV, numeric features, five files of three chunks each; churn: Parquet with categorical, int and
    nullable features (vocabularies and imputation means fold across groups), three files."""
    if dataset == "numbers":
        config = numeric_table(data_dir, days=5)
    else:
        write_churn(data_dir / layout.DATASETS / "churn", rows=1800, days=3, end=END)
        config = load_pipeline_file(pipelines_dir / "churn.yaml")
    base = with_prep(config, chunk_rows=200)
    outputs, validations = {}, {}
    for parallelism in (1, 2, 3):
        stages = Stages(data_dir, f"n{parallelism}", with_prep(base, parallelism=parallelism), monkeypatch)
        if parallelism == 1:  # the one-pod stages, as the DAG without fan-out runs them
            assert stages("validate") == 0 and stages("prepare") == 0
        else:
            assert stages.fanned_out() == parallelism
        outputs[parallelism] = prepared_bytes(stages.run_dir)
        validations[parallelism] = validation_of(stages.run_dir)
        assert not (stages.run_dir / layout.PREPARED_PARTS).exists()  # merged, then removed: no second copy
        manifest = json.loads((stages.run_dir / layout.PREPARED_MANIFEST).read_text())
        assert len(manifest["groups"]) == parallelism
        assert sum(g["rows"] for g in manifest["groups"]) == sum(manifest["rows"].values())
    assert outputs[1] == outputs[2] == outputs[3]
    assert validations[1] == validations[2] == validations[3]
    assert validations[1]["success"] and validations[1]["pages"] == sum(f["chunks"] for f in validations[1]["files"])
    assert len(validations[1]["files"]) == (5 if dataset == "numbers" else 3)
    assert all(f["chunks"] == 3 for f in validations[1]["files"])
    assert len([name for name in outputs[1] if name.endswith(".tfrecord")]) == sum(base.data.shards.model_dump()
                                                                                   .values())


@pytest.fixture
def two_groups(data_dir: Path, monkeypatch: pytest.MonkeyPatch) -> Stages:
    config = with_prep(numeric_table(data_dir, days=4), parallelism=2)
    stages = Stages(data_dir, "r", config, monkeypatch)
    assert stages("pin") == 0
    return stages


def test_a_bad_file_fails_its_own_group_by_name_and_the_other_group_passes(two_groups: Stages,
                                                                           capfd: pytest.CaptureFixture) -> None:
    stages = two_groups
    groups = json.loads((stages.run_dir / layout.INPUT_GROUPS).read_text())["groups"]
    bad_source = groups[1]["files"][-1]
    snapshot = stages.run_dir / layout.INPUTS / Path(bad_source).parent.name / Path(bad_source).name
    snapshot.unlink()  # the pinned copy is a hardlink of the source: replace it, leave the dataset alone
    source = stages.volume / bad_source
    lines = source.read_text().splitlines(keepends=True)
    lines[3] = "zero," + lines[3].split(",", 1)[1]  # the first feature of line 4
    snapshot.write_text("".join(lines))

    assert stages("validate", "--group", "0") == 0
    assert stages("validate", "--group", "1") == EXIT_BAD_INPUT
    failure = capfd.readouterr().err.split("validate failed: ", 1)[1]  # the stage's log, as the task log shows it
    assert f"{bad_source}: f_0: 1 value(s) of the wrong type text" in failure
    assert "line 4: 'zero'" in failure
    part = stages.run_dir / layout.VALIDATION_PARTS / layout.group_name(1)
    assert f"Data Docs: {part / layout.DATA_DOCS_INDEX.name}" in failure
    assert (part / layout.DATA_DOCS_INDEX.name).is_file()  # the failed group's own report
    assert not (stages.run_dir / layout.VALIDATION).exists()  # nothing joined: merge_data never ran


def test_rerunning_one_group_leaves_the_other_groups_alone(two_groups: Stages) -> None:
    stages = two_groups
    for command in ("validate", "prepare"):
        for group in ("0", "1"):
            assert stages(command, "--group", group) == 0
    others = {p: (p.stat().st_ino, p.stat().st_mtime_ns)
              for folder in (layout.VALIDATION_PARTS, layout.PREPARED_PARTS)
              for p in (stages.run_dir / folder / layout.group_name(1)).rglob("*") if p.is_file()}
    before = {p: p.read_bytes() for p in (stages.run_dir / layout.PREPARED_PARTS / layout.group_name(0)).rglob(
        "*.tfrecord")}
    assert others and before

    assert stages("validate", "--group", "0") == 0 and stages("prepare", "--group", "0") == 0  # a retry of group 0

    assert {p: (p.stat().st_ino, p.stat().st_mtime_ns) for p in others} == others
    assert {p: p.read_bytes() for p in before} == before  # the rerun wrote the same bytes again
    assert stages("merge") == 0
    assert stages("merge") == 0  # merge_data cleared and run again: its parts are gone, its result stands
    assert json.loads((stages.run_dir / layout.VALIDATION_RESULTS).read_text())["groups"] == 2


def test_a_table_level_failure_in_merge_commits_no_shards_and_drops_the_parts(data_dir: Path,
                                                                             monkeypatch: pytest.MonkeyPatch,
                                                                             capfd: pytest.CaptureFixture) -> None:
    """Every group passes, but the table as a whole has too few rows: only merge_data can tell. It fails as bad
    input with the validation report and Data Docs written, prepared/ never appears, and the shard parts (a copy
    of every shard that no retry could use) are removed."""
    config = numeric_table(data_dir, days=4)
    config = config.model_copy(update={"data": config.data.model_copy(update={
        "expectations": config.data.expectations.model_copy(update={"min_rows": 5000})})})
    stages = Stages(data_dir, "r", with_prep(config, parallelism=2), monkeypatch)
    assert stages("pin") == 0
    for command in ("validate", "prepare"):
        for group in ("0", "1"):
            assert stages(command, "--group", group) == 0
    assert (stages.run_dir / layout.PREPARED_PARTS).is_dir()

    assert stages("merge") == EXIT_BAD_INPUT

    assert "2400 row(s) in total, fewer than data.expectations.min_rows=5000" in capfd.readouterr().err
    results = json.loads((stages.run_dir / layout.VALIDATION_RESULTS).read_text())
    assert results["success"] is False and results["groups"] == 2
    assert (stages.run_dir / layout.DATA_DOCS_INDEX).is_file()
    assert not (stages.run_dir / layout.PREPARED).exists() and not (stages.run_dir / layout.PREPARED_PARTS).exists()


def test_a_group_that_does_not_exist_is_a_clear_error(two_groups: Stages, capfd: pytest.CaptureFixture) -> None:
    assert two_groups("prepare", "--group", "2") == EXIT_BAD_INPUT
    assert "group 2 does not exist: the run's inputs are cut into 2 group(s)" in capfd.readouterr().err
    assert two_groups("validate", "--group", "-1") == 2  # a usage error, from argparse
    assert not os.path.exists(two_groups.run_dir / layout.PREPARED_PARTS / layout.group_name(2))


def test_a_failed_group_fails_the_run_through_airflow_naming_its_task_and_file(pipelines_dir: Path,
                                                                               data_dir: Path) -> None:
    """churn fans out over two groups (its example config): the newest partition has a bad row, so the mapped
    validate_data task of group 1 fails, without a retry, and the run's summary names the map index and the file;
    group 0 passed, and nothing after validate ran."""
    write_churn(data_dir / layout.DATASETS / "churn", rows=3000, days=2)
    newest = sorted((data_dir / layout.DATASETS / "churn").glob("date=*/part-0.parquet"))[-1]
    frame = churn_frame(1500, seed=5)
    frame["tenure_months"] = frame["tenure_months"].astype(str)  # text, as a careless export writes it
    frame.loc[4, "tenure_months"] = "long"
    frame.to_parquet(newest, index=False)

    done = trainyard("run", "churn")

    assert done.returncode == 1 and "finished: failed" in done.stdout, done.stdout[-3000:] + done.stderr[-3000:]
    summary = [line for line in done.stdout.splitlines() if line.startswith("trainyard run: ")]
    assert summary[1:3] == [
        "trainyard run: failed task: validate_data[1] (file group 1) (attempt 1)",
        "trainyard run: error: validate failed: data validation failed: 1 problem(s) in datasets/churn"], summary
    source = newest.relative_to(data_dir)
    assert f"{source}: tenure_months: 1 value(s) of the wrong type text" in done.stdout + done.stderr
    run_dir = run_folder(done.stdout)
    assert json.loads((run_dir / layout.INPUT_GROUPS).read_text())["groups"][1]["files"] == [str(source)]
    assert (run_dir / layout.VALIDATION_PARTS / layout.group_name(0) / GROUP_SUMMARY).is_file()  # group 0 passed
    assert not (run_dir / layout.PREPARED_PARTS).exists() and not (run_dir / layout.PREPARED).exists()
