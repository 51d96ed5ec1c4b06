"""validate_data and prepare_data on real files: pinning, Great Expectations, TFRecord, and every bad input."""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import tensorflow as tf

from trainyard.config.loader import load_pipeline_file
from trainyard.dag.stages import CONFIG_ENV
from trainyard_contract import layout
from trainyard_contract.runtime import StageError
from trainyard_contract.schema import PipelineConfig
from trainyard_prep.example_data import write_digits
from trainyard_prep.inputs import pin_inputs
from trainyard_prep.prepare import prepare
from trainyard_prep.validate import validate_inputs

pytestmark = pytest.mark.integration
END = dt.date(2026, 11, 30)


@pytest.fixture
def digits(pipelines_dir: Path, data_dir: Path) -> tuple[PipelineConfig, Path]:
    write_digits(data_dir / layout.DATASETS / "digits", days=3, end=END)
    return load_pipeline_file(pipelines_dir / "digits.yaml"), data_dir


def run_validate(config: PipelineConfig, volume: Path, run: str = "r1") -> dict:
    run_dir = volume / layout.RUNS / config.name / run
    manifest = pin_inputs(volume, run_dir, config.data, None)
    return validate_inputs(run_dir, config, manifest)


def first_file(volume: Path) -> Path:
    return sorted((volume / layout.DATASETS / "digits").glob("date=*/part-0.csv"))[0]


def test_validate_then_prepare_writes_the_run_folder(digits: tuple[PipelineConfig, Path]) -> None:
    config, volume = digits
    summary = run_validate(config, volume)
    run_dir = volume / layout.RUNS / "digits" / "r1"
    assert summary["success"] and summary["rows"] == 1797
    # inputs are pinned by hardlink (same inode, no bytes copied) and hashed
    manifest = json.loads((run_dir / layout.INPUTS_MANIFEST).read_text())
    assert len(manifest["files"]) == 3 and {f["pinned_by"] for f in manifest["files"]} == {"hardlink"}
    entry = manifest["files"][0]
    assert os.stat(volume / entry["source"]).st_ino == os.stat(run_dir / entry["snapshot"]).st_ino
    # Data Docs exist and load nothing from the network
    docs = run_dir / layout.DATA_DOCS
    pages = list(docs.rglob("*.html"))
    assert (run_dir / layout.DATA_DOCS_INDEX).is_file() and len(pages) >= 4
    for page in pages:
        html = page.read_text()
        assert 'src="http' not in html and 'rel="stylesheet" href="http' not in html
    assert "trainyard-vendor/bootstrap.min.css" in (run_dir / layout.DATA_DOCS_INDEX).read_text()

    out = prepare(run_dir, config, manifest)
    prepared = run_dir / layout.PREPARED
    assert out["rows"]["train"] + out["rows"]["eval"] == 1797
    assert 0.15 < out["rows"]["eval"] / 1797 < 0.25
    schema = json.loads((run_dir / layout.PREPARED_SCHEMA).read_text())
    assert len(schema["features"]) == 64 and schema["label"]["classes"] == list(range(10))
    stats = json.loads((run_dir / layout.PREPARED_STATS).read_text())
    assert stats["features"]["pixel_0"]["max"] == 0.0 and stats["features"]["pixel_10"]["max"] == 16.0
    spec = {f["name"]: tf.io.FixedLenFeature([], tf.float32) for f in schema["features"]}
    spec["digit"] = tf.io.FixedLenFeature([], tf.int64)
    files = sorted(str(p) for p in (prepared / "train").glob("*.tfrecord"))
    assert len(files) == 4
    rows = sum(1 for _ in tf.data.TFRecordDataset(files))
    assert rows == out["rows"]["train"]
    batch = next(iter(tf.data.TFRecordDataset(files).batch(2000).map(lambda r: tf.io.parse_example(r, spec))))
    assert set(batch["digit"].numpy().tolist()) == set(range(10))
    # the manifest's digests (taken as the shards were written) are those of the files on disk
    for shard in out["shards"]:
        assert shard["sha256"] == hashlib.sha256((prepared / shard["path"]).read_bytes()).hexdigest(), shard
    # deterministic: a second prepare (a retry) produces byte-identical shards, and replaces the folder atomically
    again = prepare(run_dir, config, manifest)
    assert [s["sha256"] for s in again["shards"]] == [s["sha256"] for s in out["shards"]]
    assert not [p for p in (run_dir).iterdir() if p.name.startswith(".")]  # no temp folders left behind


def test_a_run_keeps_its_pinned_inputs_when_new_partitions_land(digits: tuple[PipelineConfig, Path]) -> None:
    config, volume = digits
    run_dir = volume / layout.RUNS / "digits" / "r1"
    first = pin_inputs(volume, run_dir, config.data, None)
    write_digits(volume / layout.DATASETS / "digits", days=1, end=END + dt.timedelta(days=1))
    assert pin_inputs(volume, run_dir, config.data, None) == first
    later = pin_inputs(volume, volume / layout.RUNS / "digits" / "r2", config.data, None)
    assert len(later["files"]) == len(first["files"]) + 1


def link_an_outside_partition(volume: Path, outside: Path) -> Path:
    """Move the newest partition outside the volume and leave a symbolic link in its place."""
    newest = sorted((volume / layout.DATASETS / "digits").glob("date=*"))[-1]
    newest.rename(outside / newest.name)
    newest.symlink_to(outside / newest.name, target_is_directory=True)
    return outside / newest.name


def test_a_symlinked_partition_is_refused_with_its_path(digits: tuple[PipelineConfig, Path], tmp_path: Path) -> None:
    """Was: a partition symlinked from outside was trained on, "pinned" as a link whose target could change."""
    config, volume = digits
    link_an_outside_partition(volume, tmp_path)
    run_dir = volume / layout.RUNS / "digits" / "r1"
    with pytest.raises(StageError, match=r"date=2026-11-30 is a symbolic link \(to .*\): a dataset must stay inside"):
        pin_inputs(volume, run_dir, config.data, None)
    assert not (run_dir / layout.INPUTS).exists()
    one_file = first_file(volume)
    moved = tmp_path / "part.csv"
    one_file.rename(moved)
    one_file.symlink_to(moved)
    with pytest.raises(StageError, match=r"part-0.csv is a symbolic link"):
        pin_inputs(volume, run_dir, config.data, None)


def test_with_symlinks_copy_the_target_is_pinned_as_a_copy(digits: tuple[PipelineConfig, Path],
                                                           tmp_path: Path) -> None:
    config, volume = digits
    target = link_an_outside_partition(volume, tmp_path)
    data = config.data.model_copy(update={"symlinks": "copy"})
    run_dir = volume / layout.RUNS / "digits" / "r1"
    manifest = pin_inputs(volume, run_dir, data, None)
    linked = [f for f in manifest["files"] if f["partition"] == "2026-11-30"]
    assert linked and all(f["pinned_by"] == "copy" and f["symlink_target"].startswith(str(target)) for f in linked)
    assert all(f["pinned_by"] == "hardlink" and "symlink_target" not in f for f in manifest["files"] if f not in linked)
    outside_file = target / Path(linked[0]["snapshot"]).name
    pinned = run_dir / linked[0]["snapshot"]
    assert not pinned.is_symlink() and pinned.stat().st_ino != outside_file.stat().st_ino
    before = pinned.read_bytes()
    outside_file.write_text("edited outside the volume\n")
    assert pinned.read_bytes() == before  # the snapshot no longer changes with the link's target
    assert hashlib.sha256(before).hexdigest() == linked[0]["sha256"]


def corrupt(path: Path, how: str) -> None:
    lines = path.read_text().splitlines()
    if how == "missing column":
        header = lines[0].split(",")
        keep = [i for i, name in enumerate(header) if name != "pixel_5"]
        lines = [",".join(line.split(",")[i] for i in keep) for line in lines]
    elif how == "wrong type":
        cells = lines[3].split(",")
        cells[10] = "bright"
        lines[3] = ",".join(cells)
    elif how == "nan":
        cells = lines[5].split(",")
        cells[20] = "NaN"
        lines[5] = ",".join(cells)
    elif how == "truncated":
        lines[-1] = lines[-1][: len(lines[-1]) // 2].rstrip(",")
    elif how == "renamed column":
        lines[0] = lines[0].replace("pixel_5,", "pixl_5,", 1)
    elif how == "blank label":
        lines[3] = lines[3].rsplit(",", 1)[0] + ","
    elif how == "out of range":
        cells = lines[2].split(",")
        cells[7] = "99"
        lines[2] = ",".join(cells)
    path.write_text("\n".join(lines) + ("" if how == "truncated" else "\n"))


@pytest.mark.parametrize(
    ("how", "expected"),
    [
        ("missing column", "pixel_5: column is missing (the file has 64 columns)\n"),
        ("renamed column", "pixel_5: column is missing (the file has 65 columns); did you mean 'pixl_5'?"),
        ("wrong type", "pixel_10: 1 value(s) of the wrong type text (expected one of ['float64', 'float32', "
                       "'int64']...), line 4: 'bright'\n"),
        ("nan", "pixel_20: 1 missing value(s) (empty or NaN cells), at line 6"),
        ("blank label", "digit: 1 missing value(s) (empty or NaN cells), at line 4\n"),
        ("out of range", "pixel_7: 1 value(s) fail expect_column_values_to_be_between (min_value 0.0, max_value "
                         "16.0): line 3: 99.0"),
        ("truncated", "line 600 is truncated: only 33 of 65 fields have values"),
    ],
)
def test_bad_data_fails_with_the_file_and_problem(digits: tuple[PipelineConfig, Path], how: str, expected: str) -> None:
    config, volume = digits
    bad = first_file(volume)
    corrupt(bad, how)
    with pytest.raises(StageError) as info:
        run_validate(config, volume)
    message = str(info.value) + "\n"
    rel = str(bad.relative_to(volume))
    assert f"{rel}: {expected}" in message, message
    assert ": ? value" not in message and "e.g. []" not in message  # no half-filled lines
    assert len([line for line in message.splitlines() if line.startswith("  - ")]) == 1  # one problem, said once
    results = json.loads((layout.runs_dir(volume, "digits") / "r1" / layout.VALIDATION_RESULTS).read_text())
    assert results["success"] is False


def test_empty_file_is_named(digits: tuple[PipelineConfig, Path]) -> None:
    config, volume = digits
    bad = first_file(volume)
    bad.write_text("")
    with pytest.raises(StageError, match=f"{bad.relative_to(volume)}: part-0.csv: file is empty"):
        run_validate(config, volume)


def test_no_partitions_in_the_window(digits: tuple[PipelineConfig, Path]) -> None:
    config, volume = digits
    run_dir = volume / layout.RUNS / "digits" / "r1"
    expected = r"no partitions of datasets/digits in the run's window .* 3 partition\(s\) exist"
    with pytest.raises(StageError, match=expected):
        pin_inputs(volume, run_dir, config.data, dt.datetime(2026, 1, 1, tzinfo=dt.UTC))
    assert not (run_dir / layout.INPUTS).exists()


def test_too_few_rows_is_a_table_level_failure(digits: tuple[PipelineConfig, Path]) -> None:
    config, volume = digits
    strict = config.model_copy(update={"data": config.data.model_copy(
        update={"expectations": config.data.expectations.model_copy(update={"min_rows": 5000})})})
    with pytest.raises(StageError, match="1797 row\\(s\\) in total, fewer than data.expectations.min_rows=5000"):
        run_validate(strict, volume)


def test_entrypoint_exit_codes(digits: tuple[PipelineConfig, Path], tmp_path: Path) -> None:
    config, volume = digits
    corrupt(first_file(volume), "nan")
    env = {**os.environ, CONFIG_ENV: config.model_dump_json(), "TF_CPP_MIN_LOG_LEVEL": "2"}
    xcom = tmp_path / "return.json"
    args = [sys.executable, "-m", "trainyard_prep", "validate", "--volume", str(volume),
            "--run-dir", str(volume / "runs/digits/r9"), "--run-id", "r9", "--xcom", str(xcom)]
    done = subprocess.run(args, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 3, done.stderr[-2000:]
    assert "data validation failed" in done.stderr and not xcom.exists()
    usage = subprocess.run([sys.executable, "-m", "trainyard_prep", "validate"], env=env, capture_output=True,
                           text=True, timeout=120)
    assert usage.returncode == 2


WINE = """\
name: wine
start_date: 2026-01-01
data:
  source: datasets/wine
  format: {format}
  label: {{name: cultivar, source_column: "class (0-2)", classes: [0, 1, 2]}}
  features:
    - {{name: alcohol, dtype: float}}
    - {{name: color_intensity, dtype: float, source_column: "color intensity"}}
    - {{name: od280_od315, dtype: float, source_column: "od280/od315_of_diluted_wines"}}
  shards: {{train: 1, eval: 1}}
training: {{steps: 10}}
"""


@pytest.mark.parametrize("data_format", ["csv", "parquet"])
def test_source_columns_are_read_under_their_own_names_and_served_under_identifiers(
        data_format: str, data_dir: Path, tmp_path: Path) -> None:
    from sklearn.datasets import load_wine

    frame = load_wine(as_frame=True).frame[["alcohol", "color_intensity", "od280/od315_of_diluted_wines", "target"]]
    frame = frame.rename(columns={"color_intensity": "color intensity", "target": "class (0-2)"})
    (tmp_path / "wine.yaml").write_text(WINE.format(format=data_format))
    config = load_pipeline_file(tmp_path / "wine.yaml")
    for day, part in ((END, frame.iloc[:100]), (END - dt.timedelta(days=1), frame.iloc[100:])):
        folder = data_dir / layout.DATASETS / "wine" / f"date={day.isoformat()}"
        folder.mkdir(parents=True)
        path = folder / f"part-0.{data_format}"
        part.to_csv(path, index=False) if data_format == "csv" else part.to_parquet(path, index=False)
    run_dir = data_dir / layout.RUNS / "wine" / "r1"
    manifest = pin_inputs(data_dir, run_dir, config.data, None)
    assert validate_inputs(run_dir, config, manifest)["rows"] == 178
    out = prepare(run_dir, config, manifest)
    assert out["rows"]["train"] + out["rows"]["eval"] == 178
    schema = json.loads((run_dir / layout.PREPARED_SCHEMA).read_text())
    assert [f["name"] for f in schema["features"]] == ["alcohol", "color_intensity", "od280_od315"]
    assert schema["label"]["name"] == "cultivar"
    stats = json.loads((run_dir / layout.PREPARED_STATS).read_text())["features"]
    assert stats["od280_od315"]["max"] == pytest.approx(4.0) and stats["color_intensity"]["min"] == pytest.approx(1.28)

    # a file whose mapped column is missing (renamed to the served name) is refused, naming both names
    renamed = frame.iloc[:100].rename(columns={"od280/od315_of_diluted_wines": "od280_od315"})
    path = data_dir / layout.DATASETS / "wine" / f"date={END.isoformat()}" / f"part-0.{data_format}"
    renamed.to_csv(path, index=False) if data_format == "csv" else renamed.to_parquet(path, index=False)
    second = data_dir / layout.RUNS / "wine" / "r2"
    with pytest.raises(StageError) as info:
        validate_inputs(second, config, pin_inputs(data_dir, second, config.data, None))
    assert ("od280_od315: source column 'od280/od315_of_diluted_wines' is missing (the file has 4 columns)"
            in str(info.value)), str(info.value)


def _parquet_column(kind: str):  # noqa: ANN202 (a pyarrow array)
    import numpy as np
    import pandas as pd
    import pyarrow as pa

    n = 20
    return {"double": pa.array(np.linspace(0, 1, n)), "float": pa.array(np.linspace(0, 1, n, dtype=np.float32)),
            "int64": pa.array(np.arange(n)), "int8": pa.array(np.arange(n, dtype=np.int8)),
            "uint8": pa.array(np.arange(n, dtype=np.uint8)), "bool": pa.array([True, False] * (n // 2)),
            "timestamp": pa.array(pd.date_range("2026-01-01", periods=n)),
            "whole double": pa.array(np.arange(n, dtype=float)),
            "int64 with nulls": pa.array([1, None] * (n // 2), type=pa.int64()),
            "string": pa.array(["a", "b"] * (n // 2)), "large_string": pa.array(["a", "b"] * (n // 2),
                                                                                  type=pa.large_string()),
            "dictionary": pa.array(["a", "b"] * (n // 2)).dictionary_encode(),
            "text of numbers": pa.array(["1.5"] * n)}[kind]


@pytest.mark.parametrize(("declared", "stored", "accepted"), [
    ("float", "double", True), ("float", "float", True), ("float", "int64", True), ("float", "bool", False),
    ("float", "timestamp", False), ("float", "dictionary", False), ("float", "uint8", False),
    ("float", "text of numbers", False),
    ("int", "int64", True), ("int", "int8", True), ("int", "whole double", False), ("int", "uint8", False),
    ("int, nullable: true", "whole double", True), ("int, nullable: true", "int64 with nulls", True),
    ("string", "string", True), ("string", "large_string", True), ("string", "int64", False),
    ("string", "dictionary", False),
])
def test_parquet_column_types_are_matched_as_the_readme_says(declared: str, stored: str, accepted: bool,
                                                             data_dir: Path, tmp_path: Path) -> None:
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    (tmp_path / "c.yaml").write_text(
        "name: c\nstart_date: 2026-01-01\ndata:\n  source: datasets/c\n  format: parquet\n"
        f"  label: {{name: y, classes: [0, 1]}}\n  features: [{{name: x, dtype: {declared}}}, {{name: z}}]\n")
    config = load_pipeline_file(tmp_path / "c.yaml")
    folder = data_dir / layout.DATASETS / "c" / "date=2026-11-30"
    folder.mkdir(parents=True)
    pq.write_table(pa.table({"x": _parquet_column(stored), "z": pa.array(np.linspace(0, 1, 20)),
                             "y": pa.array([0, 1] * 10)}), folder / "part-0.parquet")
    run_dir = data_dir / layout.RUNS / "c" / "r1"
    manifest = pin_inputs(data_dir, run_dir, config.data, None)
    if accepted:
        assert validate_inputs(run_dir, config, manifest)["rows"] == 20
        return
    with pytest.raises(StageError) as info:
        validate_inputs(run_dir, config, manifest)
    assert "part-0.parquet: x: " in str(info.value) and "wrong type" in str(info.value), str(info.value)
