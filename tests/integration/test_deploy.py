"""deploy: monotonic versions under races, AVAILABLE wait, smoke test, rollback."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.integration.serving_helpers import Server, export_tiny_model, http, wait_for
from trainyard_contract import artifacts, layout
from trainyard_contract.artifacts import EvalMetrics, VersionRecord
from trainyard_contract.runtime import StageError
from trainyard_contract.schema import PipelineConfig
from trainyard_serving.deploy import DeployFailed, deploy
from trainyard_serving.publishing import publish

pytestmark = pytest.mark.integration

CONFIG = PipelineConfig.model_validate({
    "name": "tiny", "deploy": {"model_name": "tiny"},
    "data": {"source": "d", "label": {"name": "y", "classes": [0, 1]}, "features": [{"name": "a"}, {"name": "b"}]},
})
SMOKE = {"inputs": {"a": [2.0, 0.0], "b": [0.0, 2.0]}, "dtypes": {"a": "float", "b": "float"}, "class_ids": [0, 1]}


def decision_of(deploy: bool, *reasons: str) -> dict:
    """A decision.json as decide writes it (the first model of its name: no champion, nothing compared)."""
    return {"deploy": deploy, "forced": False, "reasons": list(reasons), "champion": None,
            "metrics": {"accuracy": 1.0}, "data_window_end": {}, "comparison": None, "signature": None}


def fake_run(volume: Path, name: str, smoke: dict, broken: bool = False, decision: dict | None = None) -> Path:
    """A run folder as evaluate and decide leave it (decide blessed the model unless `decision` says otherwise)."""
    run_dir = volume / layout.RUNS / "tiny" / name
    export_tiny_model(run_dir / layout.SAVED_MODEL)
    if broken:
        (run_dir / layout.SAVED_MODEL / layout.SAVED_MODEL_PB).write_bytes(b"corrupt")
    (run_dir / layout.EVAL).mkdir(parents=True)
    (run_dir / layout.SMOKE_SET).write_text(json.dumps(smoke))
    artifacts.write(run_dir / layout.METRICS, EvalMetrics(  # what evaluate writes for a first model
        run_id=name, task="classification", eval_rows=4, loss={"name": "sparse_categorical_crossentropy"},
        challenger={"accuracy": 1.0}, champion=None, signature={"challenger": {}, "champion": None},
        comparison=None))
    (run_dir / layout.DEPLOY).mkdir()
    blessing = decision_of(True, "accuracy 1.0 >= 0.5")
    (run_dir / layout.DECISION).write_text(json.dumps(decision if decision is not None else blessing))
    return run_dir


@pytest.fixture
def volume(tmp_path: Path):  # noqa: ANN201
    volume = tmp_path / "volume"
    (volume / layout.MODELS).mkdir(parents=True)
    server = Server(volume / layout.MODELS).start(tmp_path / "server.log")
    yield volume, server
    server.stop()


def test_deploy_publishes_waits_and_smoke_tests(volume: tuple[Path, Server]) -> None:
    root, server = volume
    run_dir = fake_run(root, "r1", {**SMOKE, "probabilities": expected_probabilities()})
    result = deploy(CONFIG, root, run_dir, "r1", server.grpc)
    assert result["deployed"] and result["version"] == 1
    meta = json.loads((root / layout.MODELS / "tiny" / "1" / layout.VERSION_METADATA).read_text())
    assert meta["run_id"] == "r1" and meta["metrics"] == {"accuracy": 1.0} and meta["published_by"] == "copy"
    assert http("GET", server.url("/v1/models/tiny"))[1]["model_version_status"][0]["version"] == "1"
    journal = json.loads((run_dir / layout.DEPLOY_RESULT).read_text())
    assert journal["state"] == "verified" and journal["verified"] is True
    assert not list((root / layout.MODELS / "tiny").glob(".unverified-*"))


def test_published_files_are_read_only_copies_shared_with_nothing(tmp_path: Path) -> None:
    """Was: every version published from one run hardlinked the run's export, so one edit changed them all."""
    saved = export_tiny_model(tmp_path / layout.SAVED_MODEL.name)
    models = tmp_path / layout.MODELS / "tiny"
    first, second = publish(models, saved, VersionRecord()), publish(models, saved, VersionRecord())
    source = saved / layout.SAVED_MODEL_PB
    inodes = {os.stat(models / str(v) / layout.SAVED_MODEL_PB).st_ino for v in (first, second)}
    assert len(inodes) == 2 and os.stat(source).st_ino not in inodes
    for path in (models / str(first)).rglob("*"):
        if path.is_file():
            assert path.stat().st_mode & 0o222 == 0, path  # no write bit for anyone
    source.write_bytes(b"edited in the run folder")
    assert (models / str(first) / layout.SAVED_MODEL_PB).read_bytes() != b"edited in the run folder"


def test_version_numbers_are_never_reused_after_a_rollback(tmp_path: Path) -> None:
    from trainyard_serving.publishing import unpublish

    saved = export_tiny_model(tmp_path / layout.SAVED_MODEL.name)
    models = tmp_path / layout.MODELS / "tiny"
    assert [publish(models, saved, VersionRecord()) for _ in range(3)] == [1, 2, 3]
    unpublish(models, 3)
    unpublish(models, 2)
    assert publish(models, saved, VersionRecord()) == 4  # was 2 again: "version 2" then named two different models


KILL_AFTER_RENAME = """
import os, signal, sys
from pathlib import Path
from trainyard_contract.schema import PipelineConfig
from trainyard_serving import deploy as stage
CONFIG = PipelineConfig.model_validate({
    "name": "tiny", "deploy": {"model_name": "tiny"},
    "data": {"source": "d", "label": {"name": "y", "classes": [0, 1]}, "features": [{"name": "a"}, {"name": "b"}]}})
how = sys.argv[4]
def available(*args, **kwargs):
    if how == "sigkill":
        os.kill(os.getpid(), signal.SIGKILL)
    raise KeyboardInterrupt
stage.wait_available = available
stage.deploy(CONFIG, Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[2], sys.argv[3])
"""


def kill_during_verification(root: Path, run_dir: Path, server: Server, how: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", KILL_AFTER_RENAME, str(root), str(run_dir), server.grpc, how],
                          capture_output=True, text=True, timeout=120, env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"})


def test_ctrl_c_after_publishing_is_recorded_and_withdrawn(volume: tuple[Path, Server]) -> None:
    """Was: Ctrl-C right after the rename left the version served, never verified, with no deploy/result.json."""
    root, server = volume
    run_dir = fake_run(root, "r1", {**SMOKE, "probabilities": expected_probabilities()})
    done = kill_during_verification(root, run_dir, server, "ctrl-c")
    assert done.returncode != 0 and "KeyboardInterrupt" in done.stderr
    journal = json.loads((run_dir / layout.DEPLOY_RESULT).read_text())
    assert journal["state"] == "interrupted" and journal["version"] == 1 and journal["rolled_back"] is True
    assert "interrupted by Ctrl-C after version 1 was published, before it was verified" in journal["reason"]
    models = root / layout.MODELS / "tiny"
    assert layout.published_versions(models) == [] and not list(models.glob(".unverified-*"))


def test_a_deploy_killed_after_publishing_is_verified_by_its_retry(volume: tuple[Path, Server]) -> None:
    """SIGKILL between the rename and the smoke test: the journal says published, not verified; the retry of the
    same run verifies that version instead of publishing the model a second time."""
    root, server = volume
    run_dir = fake_run(root, "r1", {**SMOKE, "probabilities": expected_probabilities()})
    assert kill_during_verification(root, run_dir, server, "sigkill").returncode == -9
    journal = json.loads((run_dir / layout.DEPLOY_RESULT).read_text())
    assert journal["state"] == "published" and journal["verified"] is False and journal["version"] == 1
    models = root / layout.MODELS / "tiny"
    assert (models / ".unverified-1").is_file()
    result = deploy(CONFIG, root, run_dir, "r1", server.grpc)
    assert result["deployed"] and result["version"] == 1 and layout.published_versions(models) == [1]
    assert not (models / ".unverified-1").exists()
    again = deploy(CONFIG, root, run_dir, "r1", server.grpc)  # a retry after success publishes nothing
    assert again["version"] == 1 and again["by_earlier_attempt"] and layout.published_versions(models) == [1]


def test_an_unverified_leftover_is_removed_by_another_deploy_and_by_a_server_start(volume: tuple[Path, Server],
                                                                                   tmp_path: Path) -> None:
    root, server = volume
    models = root / layout.MODELS / "tiny"
    good = fake_run(root, "good", {**SMOKE, "probabilities": expected_probabilities()})
    deploy(CONFIG, root, good, "good", server.grpc)
    killed = fake_run(root, "killed", {**SMOKE, "probabilities": expected_probabilities()})
    assert kill_during_verification(root, killed, server, "sigkill").returncode == -9
    assert layout.published_versions(models) == [1, 2]
    server.stop()
    restarted = Server(root / layout.MODELS).start(tmp_path / "restarted.log")
    try:
        assert layout.published_versions(models) == [1]  # removed before anything was served
        assert "whose deploy died before verifying it" in (tmp_path / "restarted.log").read_text()
        assert kill_during_verification(root, killed, restarted, "sigkill").returncode == -9  # version 3
        other = fake_run(root, "other", {**SMOKE, "probabilities": expected_probabilities()})
        result = deploy(CONFIG, root, other, "other", restarted.grpc)
        assert result["version"] == 4 and layout.published_versions(models) == [1, 4]
    finally:
        restarted.stop()


def test_deploy_without_decide_s_blessing_publishes_nothing(volume: tuple[Path, Server]) -> None:
    root, server = volume
    run_dir = fake_run(root, "skipped", {**SMOKE, "probabilities": expected_probabilities()},
                       decision=decision_of(False, "accuracy 0.61 < min 0.8"))
    result = deploy(CONFIG, root, run_dir, "skipped", server.grpc)
    assert result["deployed"] is False and "says SKIP (accuracy 0.61 < min 0.8)" in result["skipped"]
    assert "force_deploy" in result["skipped"]
    assert layout.published_versions(root / layout.MODELS / "tiny") == []
    assert not (run_dir / layout.DEPLOY_RESULT).exists()


@pytest.mark.parametrize(("decision", "says"), [
    ({**decision_of(True), "deploy": "yes"}, "deploy: Input should be a valid boolean"),
    ({"deploy": True, "reasons": []}, "forced: Field required"),
    (["not", "an", "object"], "(the whole file): Input should be an object"),
])
def test_a_decision_decide_would_not_write_is_bad_input_and_publishes_nothing(
        volume: tuple[Path, Server], decision: object, says: str) -> None:
    """A blessing is what decide wrote, or nothing: a hand-edited or truncated decision names its file and field."""
    root, server = volume
    run_dir = fake_run(root, "edited", {**SMOKE, "probabilities": expected_probabilities()}, decision=decision)
    with pytest.raises(StageError, match=f"is not what decide writes: {re.escape(says)}"):
        deploy(CONFIG, root, run_dir, "edited", server.grpc)
    assert layout.published_versions(root / layout.MODELS / "tiny") == []
    assert not (run_dir / layout.DEPLOY_RESULT).exists()


def test_deploy_without_a_decision_is_bad_input(volume: tuple[Path, Server]) -> None:
    root, server = volume
    run_dir = fake_run(root, "undecided", {**SMOKE, "probabilities": expected_probabilities()})
    (run_dir / layout.DECISION).unlink()
    with pytest.raises(StageError, match="decision.json is missing: decide must run before deploy"):
        deploy(CONFIG, root, run_dir, "undecided", server.grpc)
    (run_dir / layout.DECISION).write_text("{half")
    with pytest.raises(StageError, match="is not what decide writes: \\(the whole file\\): Invalid JSON"):
        deploy(CONFIG, root, run_dir, "undecided", server.grpc)
    assert layout.published_versions(root / layout.MODELS / "tiny") == []


def test_a_model_that_fails_the_smoke_test_is_rolled_back(volume: tuple[Path, Server]) -> None:
    root, server = volume
    good = fake_run(root, "good", {**SMOKE, "probabilities": expected_probabilities()})
    deploy(CONFIG, root, good, "good", server.grpc)
    wrong = fake_run(root, "wrong", {**SMOKE, "class_ids": [1, 1], "probabilities": expected_probabilities()})
    with pytest.raises(DeployFailed, match="the served version 2 answers differently from the evaluator: example 0: "
                                           "class id 0, the evaluator's 1"):
        deploy(CONFIG, root, wrong, "wrong", server.grpc)
    assert sorted(p.name for p in (root / layout.MODELS / "tiny").iterdir() if p.name.isdigit()) == ["1"]
    assert json.loads((wrong / layout.DEPLOY_RESULT).read_text())["rolled_back"] is True
    assert wait_for(lambda: http("GET", server.url("/v1/models/tiny"))[1]["model_version_status"][-1]["version"] == "1")


def test_a_model_that_cannot_load_is_rolled_back(volume: tuple[Path, Server]) -> None:
    root, server = volume
    broken = fake_run(root, "broken", {**SMOKE, "probabilities": expected_probabilities()}, broken=True)
    with pytest.raises(DeployFailed, match="serving could not load version 1"):
        deploy(CONFIG, root, broken, "broken", server.grpc)
    assert not [p for p in (root / layout.MODELS / "tiny").iterdir() if p.name.isdigit()]


def test_racing_deploys_get_distinct_versions(tmp_path: Path) -> None:
    saved = export_tiny_model(tmp_path / layout.SAVED_MODEL.name)
    models = tmp_path / layout.MODELS / "tiny"
    code = ("import sys; from pathlib import Path; from trainyard_serving.publishing import publish; "
            "from trainyard_contract.artifacts import VersionRecord; "
            "print(publish(Path(sys.argv[1]), Path(sys.argv[2]), VersionRecord(run_id=sys.argv[3])))")
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"}
    racers = [subprocess.Popen([sys.executable, "-c", code, str(models), str(saved), f"r{i}"], env=env,
                               stdout=subprocess.PIPE, text=True) for i in range(4)]
    got = sorted(int(p.communicate(timeout=120)[0].strip().splitlines()[-1]) for p in racers)
    assert got == [1, 2, 3, 4]
    assert publish(models, saved, VersionRecord()) == 5
    assert not [p for p in models.iterdir() if p.name.startswith(".tmp-")]


def test_a_publish_killed_midway_leaves_nothing_after_the_next_one(tmp_path: Path) -> None:
    """SIGKILL a publisher while it assembles its version; the next publish removes what it left, under the lock."""
    saved = export_tiny_model(tmp_path / layout.SAVED_MODEL.name)
    models = tmp_path / layout.MODELS / "tiny"
    code = ("import os, signal, sys; from pathlib import Path; from trainyard_serving import publishing\n"
            "real = publishing.fsync_tree\n"
            "def die(path): real(path); os.kill(os.getpid(), signal.SIGKILL)\n"
            "publishing.fsync_tree = die\n"
            "from trainyard_contract.artifacts import VersionRecord\n"
            "publishing.publish(Path(sys.argv[1]), Path(sys.argv[2]), VersionRecord())")
    killed = subprocess.run([sys.executable, "-c", code, str(models), str(saved)], timeout=120,
                            env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"})
    assert killed.returncode == -9
    leftovers = [p.name for p in models.iterdir() if p.name.startswith(".tmp-")]
    assert len(leftovers) == 1 and layout.published_versions(models) == []  # half a version, never visible
    (models / ".removed-7-deadbeef").mkdir()  # an unpublish that died while deleting
    assert publish(models, saved, VersionRecord()) == 1
    assert sorted(p.name for p in models.iterdir()) == [".last-version", ".publish.lock", "1"]


def test_a_version_is_on_disk_before_it_is_visible(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every staged file and folder is fsynced before the rename that publishes it, the model folder after."""
    import trainyard_contract.atomic as atomic
    import trainyard_serving.publishing as publishing_module

    saved = export_tiny_model(tmp_path / layout.SAVED_MODEL.name)
    models = tmp_path / layout.MODELS / "tiny"
    events: list[tuple[str, str]] = []
    real_fsync, real_rename = os.fsync, os.rename

    def fsync(fd: int) -> None:
        events.append(("fsync", os.readlink(f"/proc/self/fd/{fd}")))
        real_fsync(fd)

    def rename(src: object, dst: object) -> None:
        events.append(("rename", f"{src} -> {dst}"))
        real_rename(src, dst)

    monkeypatch.setattr(atomic.os, "fsync", fsync)
    monkeypatch.setattr(publishing_module.os, "rename", rename)
    assert publish(models, saved, VersionRecord(run_id="r")) == 1

    (at,) = [i for i, (kind, what) in enumerate(events) if kind == "rename" and what.endswith(f"{models}/1")]
    staged = events[at][1].split(" -> ")[0]
    synced_before = {what for kind, what in events[:at] if kind == "fsync"}
    files = {str(p).replace(str(models / "1"), staged) for p in (models / "1").rglob("*")} | {staged}
    assert files <= synced_before, files - synced_before  # each file and folder of the version, and the version
    assert ("fsync", str(models)) in events[at:]  # the rename itself


def test_deploy_refuses_a_server_that_serves_another_volume(tmp_path: Path) -> None:
    """Two checkouts on one machine: the endpoint belongs to the other one. Nothing is published, and it says so."""
    theirs = tmp_path / "theirs"
    export_tiny_model(theirs / layout.MODELS / "tiny" / "1")
    other = Server(theirs / layout.MODELS).start(tmp_path / "other.log")
    try:
        ours = tmp_path / "ours"
        run_dir = fake_run(ours, "r1", {**SMOKE, "probabilities": expected_probabilities()})
        started = time.monotonic()
        with pytest.raises(DeployFailed, match=r"serves version\(s\) \[1\] of tiny, which .*ours/models/tiny does "
                                               r"not hold \(it has \[\]\): it is serving another volume"):
            deploy(CONFIG, ours, run_dir, "r1", other.grpc)
        assert time.monotonic() - started < 30
        assert layout.published_versions(ours / layout.MODELS / "tiny") == []
        assert json.loads((run_dir / layout.DEPLOY_RESULT).read_text())["published"] is False
    finally:
        other.stop()


def expected_probabilities() -> list[list[float]]:
    import numpy as np

    logits = np.array([[2.0, -2.0], [-2.0, 2.0]])
    exp = np.exp(logits)
    return (exp / exp.sum(axis=1, keepdims=True)).tolist()


def test_the_smoke_test_says_where_the_predictions_differ() -> None:
    import numpy as np

    from trainyard_contract.artifacts import SmokeSet
    from trainyard_serving.deploy import first_difference

    smoke = SmokeSet(inputs={"a": [1.0, 2.0]}, dtypes={"a": "float"}, class_ids=[0, 1],
                     probabilities=[[0.9, 0.1], [0.2, 0.8]])
    assert first_difference([0, 1], np.array([[0.9, 0.1], [0.2, 0.8]]), smoke) is None
    assert first_difference([0, 1], np.array([[0.9, 0.1], [0.2003, 0.7997]]), smoke) == (
        "example 1: probability of class 0 is 0.200300, the evaluator's 0.200000 (tolerance 0.0001)")
    assert first_difference([0, 0], np.array([[0.9, 0.1], [0.6, 0.4]]), smoke) == (
        "example 1: class id 0, the evaluator's 1")
    assert first_difference([0], np.array([[0.9, 0.1]]), smoke) == "1 predictions for 2 examples"


def test_an_interrupt_between_the_rename_and_the_return_leaves_no_unverified_version(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import trainyard_serving.publishing as publishing

    saved = export_tiny_model(tmp_path / layout.SAVED_MODEL.name)
    models = tmp_path / layout.MODELS / "tiny"
    real, calls = publishing.fsync_dir, []

    def interrupted_once(path: Path) -> None:
        calls.append(path)
        if len(calls) == 1:  # the fsync right after the rename that made the version visible
            assert (models / "1").is_dir()
            raise KeyboardInterrupt
        real(path)

    monkeypatch.setattr(publishing, "fsync_dir", interrupted_once)
    with pytest.raises(KeyboardInterrupt):
        publishing.publish_unverified(models, saved, VersionRecord(), owner={"run_dir": "r"})
    assert layout.published_versions(models) == [] and not list(models.glob(".unverified-*"))
    monkeypatch.setattr(publishing, "fsync_dir", real)
    assert publish(models, saved, VersionRecord()) == 2  # and its number is not reused
