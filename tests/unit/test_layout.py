"""The shared-volume layout (the contract's layout module), and the rule that run-folder names have one home.

This file is the layout's specification, so it alone spells the expected paths. The rule is checked in every other
Python file of the repo (stage images, Airflow side, CLI, tests, benches): a string that is an
artifact's file name or path (`"metrics.json"`, `"eval/metrics.json"`, `f"inputs/{...}"`), and a run or volume
folder name joined onto a path (`run_dir / "eval"`, `volume / "models"`).
"""

from __future__ import annotations

import ast
from pathlib import Path, PurePosixPath

import pytest

from trainyard_contract import layout
from trainyard_contract.layout import RunLayout, run_key

REPO = Path(__file__).resolve().parents[2]
EXEMPT = {REPO / "contract" / "trainyard_contract" / "layout.py", Path(__file__).resolve()}
SOURCES = sorted(p for folder in ("contract", "plugins", "images", "dags", "tests", "bench")
                 for p in (REPO / folder).rglob("*.py")
                 if not any(part == "build" or part.endswith(".egg-info") for part in p.parts))

FILE_NAMES = {a.name.rsplit("/", 1)[-1] for a in layout.RUN_ARTIFACTS if "." in a.name} | set(layout.PUBLISHED_NAMES)
RELPATHS = {a.relpath for a in layout.RUN_ARTIFACTS}
FOLDERS = set(layout.RUN_SUBDIRS) | {layout.RUNS, layout.MODELS, layout.DATASETS, layout.SAVED_MODEL.name,
                                     layout.DATA_DOCS.name}


def test_run_key_is_folder_safe_and_unique() -> None:
    assert run_key("scheduled__2026-12-01") == "scheduled__2026-12-01"
    a, b = run_key("manual__2026-12-02T10:00:00+00:00"), run_key("manual__2026-12-02T10-00-00-00-00")
    assert a != b and all(ch.isalnum() or ch in "._-" for ch in a)
    assert run_key("a:b") != run_key("a+b")
    with pytest.raises(ValueError):
        run_key("")


def test_a_local_folder_s_layout_gives_paths_that_can_be_created(tmp_path: Path) -> None:
    """Was: every root became a PurePosixPath, so the local backend's `mkdir` of a run folder raised
    AttributeError (every local training job failed); a mount path given as text stays pure."""
    logs = RunLayout.for_run(tmp_path, "digits", "r1").path(layout.CLUSTER_LOGS)
    logs.mkdir(parents=True)
    assert logs.is_dir() and logs == tmp_path / "runs" / "digits" / "r1" / layout.CLUSTER_LOGS
    assert type(RunLayout.for_run("/data", "digits", "r1").run_dir) is PurePosixPath


def test_layout_paths() -> None:
    run = RunLayout.for_run("/data", "digits", "r1")
    assert str(run.run_dir) == "/data/runs/digits/r1"
    assert str(run.path(layout.PREPARED)) == "/data/runs/digits/r1/prepared"
    assert str(run.path(layout.METRICS)) == "/data/runs/digits/r1/eval/metrics.json"
    assert str(Path("/v") / layout.DECISION) == "/v/deploy/decision.json"  # an artifact is a path-like
    assert layout.METRICS.name == "metrics.json" and layout.METRICS.folder == "eval"
    assert str(layout.models_dir(PurePosixPath("/data"), "digits")) == "/data/models/digits"
    assert layout.shard_name(3, 12) == "part-00003-of-00012.tfrecord"


def test_every_run_artifact_lives_in_a_known_run_subfolder() -> None:
    assert len({a.relpath for a in layout.RUN_ARTIFACTS}) == len(layout.RUN_ARTIFACTS)
    for artifact in layout.RUN_ARTIFACTS:
        assert artifact.folder in layout.RUN_SUBDIRS, artifact


def spelled_names(tree: ast.AST) -> list[tuple[int, str]]:
    """(line, text) of every run-folder name spelled as a literal in `tree`."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            text = node.value
            if (text in FILE_NAMES or text in RELPATHS or any(text.endswith("/" + n) for n in FILE_NAMES)
                    or any(text.startswith(f + "/") for f in layout.RUN_SUBDIRS)):
                found.append((node.lineno, text))
        elif isinstance(node, ast.BinOp) and isinstance(node.op, ast.Div):
            right = node.right
            if isinstance(right, ast.Constant) and isinstance(right.value, str) and right.value in FOLDERS:
                found.append((node.lineno, f"... / {right.value!r}"))
    return found


def test_the_check_finds_each_kind_of_spelling() -> None:
    sample = ast.parse('a = run / "eval"\nb = "metrics.json"\nc = "model/training.json"\nd = f"inputs/{x}"\n'
                       'e = volume / "models"\nf = "see eval/metrics.json for details"\n')
    assert sorted(line for line, _ in spelled_names(sample)) == [1, 2, 3, 4, 5]


def test_the_sources_are_found() -> None:
    names = {p.relative_to(REPO).as_posix() for p in SOURCES}
    assert {"images/prep/trainyard_prep/validate.py", "plugins/trainyard/commands/running.py",
            "tests/integration/test_pipeline_run.py", "bench/prep_bench.py"} <= names


@pytest.mark.parametrize("path", [p for p in SOURCES if p not in EXEMPT], ids=lambda p: p.relative_to(REPO).as_posix())
def test_no_run_folder_name_is_spelled_outside_the_layout_module(path: Path) -> None:
    found = spelled_names(ast.parse(path.read_text(), filename=str(path)))
    where = path.relative_to(REPO)
    assert not found, "use the names in trainyard_contract.layout instead of: " + ", ".join(
        f"{where}:{line} {text}" for line, text in found)
