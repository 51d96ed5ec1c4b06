"""Pod specs (pure V1Pod objects) and the image -> local command mapping."""

from __future__ import annotations

import datetime as dt
import sys
from pathlib import Path

import pytest

from trainyard.config.loader import load_pipeline_file
from trainyard.dag.registry import images, stage_named
from trainyard.dag.stages import RunContext, stage_container
from trainyard.launch.images import image_repository, local_command
from trainyard.launch.podspec import build_stage_pod, dns_label, label_value
from trainyard_contract.layout import run_key

RUN = RunContext(pipeline="digits", run_id="manual__2026-12-02T10:00:00+00:00",
                 data_interval_end=dt.datetime(2026, 12, 2, 10, tzinfo=dt.UTC))


def test_label_and_dns_helpers_stay_valid_and_distinct() -> None:
    long = "x" * 100
    assert len(label_value(long)) <= 63 and label_value(long) != label_value(long + "y")
    name = dns_label("Digits_Prepare manual__2026")
    assert name == name.lower() and len(name) <= 63 and "_" not in name


def test_stage_pod_is_restricted_and_carries_identity(pipelines_dir: Path) -> None:
    config = load_pipeline_file(pipelines_dir / "digits.yaml")
    pod = build_stage_pod(config, RUN, stage_container(config, RUN, stage_named("validate")))
    meta, spec = pod.metadata, pod.spec
    assert meta.namespace == "trainyard"
    assert meta.labels["trainyard/pipeline"] == "digits"
    assert meta.labels["trainyard/stage"] == "validate"
    assert meta.labels["trainyard/run"] == run_key(RUN.run_id)
    assert spec.restart_policy == "Never" and spec.node_selector == {"trainyard.io/cpu-pool": "true"}
    (container,) = spec.containers
    assert container.image == "trainyard/prep:0.1.0"
    assert container.command == ["python", "-m", "trainyard_prep"]
    run_dir = f"/data/runs/digits/{run_key(RUN.run_id)}"
    assert container.args[:5] == ["validate", "--volume", "/data", "--run-dir", run_dir]
    assert "--window-end" in container.args
    sc = container.security_context
    assert (sc.run_as_non_root, sc.allow_privilege_escalation, sc.read_only_root_filesystem) == (True, False, True)
    assert sc.capabilities.drop == ["ALL"] and sc.seccomp_profile.type == "RuntimeDefault"
    assert container.resources.requests == {"cpu": "1", "memory": "2Gi"}
    mounts = {m.mount_path: m for m in container.volume_mounts}
    assert set(mounts) == {"/data", "/tmp", "/airflow/xcom"}
    claim = next(v for v in spec.volumes if v.persistent_volume_claim)
    assert claim.persistent_volume_claim.claim_name == "trainyard-data"
    env = {e.name: e.value for e in container.env}
    assert '"name":"digits"' in env["TRAINYARD_CONFIG_JSON"]


def test_secrets_are_injected_by_reference_only(pipelines_dir: Path) -> None:
    path = pipelines_dir / "digits.yaml"
    path.write_text(path.read_text() + "kubernetes:\n  secrets:\n    - {env: DB_PASSWORD, secret: db, key: password}\n")
    config = load_pipeline_file(path)
    pod = build_stage_pod(config, RUN, stage_container(config, RUN, stage_named("prepare")))
    (secret_env,) = [e for e in pod.spec.containers[0].env if e.name == "DB_PASSWORD"]
    assert secret_env.value is None
    assert (secret_env.value_from.secret_key_ref.name, secret_env.value_from.secret_key_ref.key) == ("db", "password")


def test_unknown_stage_is_refused(pipelines_dir: Path) -> None:
    config = load_pipeline_file(pipelines_dir / "digits.yaml")
    with pytest.raises(ValueError, match="unknown stage 'nope'; known: pin, validate, prepare, merge, train"):
        stage_named("nope")
    with pytest.raises(ValueError, match="stage 'validate' declares no check command"):
        stage_container(config, RUN, stage_named("validate"), check=True)


@pytest.mark.parametrize(
    ("image", "repository"),
    [("trainyard/prep:0.1.0", "trainyard/prep"), ("registry.local:5000/trainyard/prep:1", "trainyard/prep"),
     ("trainyard/prep@sha256:abc", "trainyard/prep"), ("localhost/trainyard/prep", "trainyard/prep")],
)
def test_image_repository(image: str, repository: str) -> None:
    assert image_repository(image) == repository


def test_local_command_mapping_comes_from_the_registry() -> None:
    table = images()
    assert table == {"trainyard/prep": "trainyard_prep", "trainyard/trainer": "trainyard_trainer",
                     "trainyard/evaluate": "trainyard_trainer", "trainyard/serving": "trainyard_serving"}
    assert local_command("trainyard/prep:0.1.0", ["python", "-m", "trainyard_prep"], table) == [
        sys.executable, "-m", "trainyard_prep"]
    # pushed under a registry prefix (kubernetes.registry), the same image runs the same module locally
    assert local_command("registry.example.com/ml/trainyard/prep:0.1.0", ["python", "-m", "trainyard_prep"],
                         table) == [sys.executable, "-m", "trainyard_prep"]
    with pytest.raises(ValueError, match="has no local equivalent"):
        local_command("acme/custom:1", ["python", "-m", "x"], table)
    with pytest.raises(ValueError, match="has no local equivalent"):
        local_command("registry.example.com/ml/not-trainyard/prep:0.1.0", ["python", "-m", "x"], table)
    with pytest.raises(ValueError, match="runs \\['python', '-m', 'trainyard_prep'\\] locally"):
        local_command("trainyard/prep:0.1.0", ["bash", "-c", "rm -rf /"], table)


def test_how_a_run_was_started_travels_to_every_stage(pipelines_dir: Path) -> None:
    import json
    from types import SimpleNamespace

    from airflow.utils.types import DagRunType

    from trainyard.dag.operators import run_context
    from trainyard_contract.runtime import RUN_ENV

    config = load_pipeline_file(pipelines_dir / "digits.yaml")
    assert RUN_ENV not in stage_container(config, RUN, stage_named("validate")).env  # a bare context records nothing

    dag_run = SimpleNamespace(run_id="manual__x", run_type=DagRunType.MANUAL, run_after=None)
    context = {"dag_run": dag_run, "params": {"steps": 40, "force_deploy": True},
               "data_interval_end": dt.datetime(2026, 12, 2, tzinfo=dt.UTC)}
    run = run_context(context, "digits")
    assert run.trigger() == {"run_type": "manual", "params": {"steps": 40, "force_deploy": True}}
    for stage in ("validate", "train", "deploy"):
        env = stage_container(config, run, stage_named(stage)).env
        assert json.loads(env[RUN_ENV]) == {"params": {"force_deploy": True, "steps": 40}, "run_type": "manual"}


def test_an_images_environment_reaches_its_pods_on_both_backends(pipelines_dir: Path) -> None:
    """The prep image keeps freed memory (glibc's thresholds, registry.KEEP_FREED_MEMORY): every data-stage pod
    carries it, the local process gets it, and the other images' pods do not."""
    from trainyard.launch.local import PathMapper, _env_for

    config = load_pipeline_file(pipelines_dir / "digits.yaml")
    for stage in ("validate", "prepare", "pin", "merge"):
        spec = stage_container(config, RUN, stage_named(stage))
        (container,) = build_stage_pod(config, RUN, spec).spec.containers
        env = {var.name: var.value for var in container.env}
        assert env["MALLOC_MMAP_THRESHOLD_"] == env["MALLOC_TRIM_THRESHOLD_"] == "4294967296", stage
        assert _env_for(spec, PathMapper({}))["MALLOC_TRIM_THRESHOLD_"] == "4294967296"
    for stage in ("train", "evaluate", "deploy"):
        assert "MALLOC_TRIM_THRESHOLD_" not in stage_container(config, RUN, stage_named(stage)).env, stage
