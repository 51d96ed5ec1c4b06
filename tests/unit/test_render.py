"""Rendered manifests: valid against the Kubernetes OpenAPI schema, restricted Pod Security, DNS-based TF_CONFIG."""

from __future__ import annotations

import json
from pathlib import Path

import kubernetes_validate
import pytest
import yaml

from trainyard.cli import main as cli
from trainyard.config.loader import load_pipeline_file
from trainyard.launch.render import render_run

REPO = Path(__file__).resolve().parents[2]
K8S_VERSION = "1.37.0"
RUN_ID = "scheduled__2026-12-01T00:00:00+00:00"


def pod_specs(manifest: dict) -> list[dict]:
    if manifest["kind"] == "Pod":
        return [manifest["spec"]]
    if manifest["kind"] == "Deployment":
        return [manifest["spec"]["template"]["spec"]]
    return []


def assert_restricted(spec: dict, where: str) -> None:
    """The Pod Security Standards "restricted" profile, check by check."""
    pod = spec.get("securityContext", {})
    assert pod.get("runAsNonRoot") is True and pod["seccompProfile"]["type"] == "RuntimeDefault", where
    for volume in spec.get("volumes", []):
        assert set(volume) - {"name"} <= {"persistentVolumeClaim", "emptyDir", "configMap", "secret"}, where
    for container in spec["containers"]:
        sc = container["securityContext"]
        assert sc["allowPrivilegeEscalation"] is False and sc["runAsNonRoot"] is True, where
        assert sc["capabilities"]["drop"] == ["ALL"] and "add" not in sc["capabilities"], where
        assert sc["seccompProfile"]["type"] == "RuntimeDefault" and sc["readOnlyRootFilesystem"] is True, where
        assert "privileged" not in sc and "hostPort" not in json.dumps(container.get("ports", [])), where
    assert not spec.get("hostNetwork") and not spec.get("hostPID") and not spec.get("hostIPC"), where


@pytest.fixture
def manifests(pipelines_dir: Path) -> list[dict]:
    path = pipelines_dir / "digits.yaml"
    secret = "kubernetes:\n  secrets:\n    - {env: WANDB_API_KEY, secret: wandb, key: api-key}\n"
    path.write_text(path.read_text() + secret)
    return render_run(load_pipeline_file(path), RUN_ID)


def test_every_rendered_manifest_is_valid_kubernetes(manifests: list[dict]) -> None:
    kinds = sorted(m["kind"] for m in manifests)
    assert kinds == ["Deployment"] + ["Pod"] * 10 + ["Service"] * 2
    for manifest in manifests:
        kubernetes_validate.validate(manifest, K8S_VERSION, strict=True)


def test_every_pod_passes_the_restricted_profile(manifests: list[dict]) -> None:
    checked = [manifest for manifest in manifests if pod_specs(manifest)]
    # 5 single-pod stages + the model check + chief, PS and 2 workers + the serving Deployment
    assert len(checked) == 11
    for manifest in checked:
        for spec in pod_specs(manifest):
            assert_restricted(spec, f"{manifest['kind']}/{manifest['metadata']['name']}")


def test_mapped_data_stages_render_one_pod_per_file_group(pipelines_dir: Path) -> None:
    path = pipelines_dir / "churn.yaml"
    path.write_text(path.read_text().replace("parallelism: 2", "parallelism: 3"))
    manifests = render_run(load_pipeline_file(path), RUN_ID)
    prep = [m for m in manifests if m["kind"] == "Pod" and m["spec"]["containers"][0]["image"].startswith(
        "trainyard/prep")]
    stages = [(m["metadata"]["labels"]["trainyard/stage"], m["metadata"]["labels"].get("trainyard/index"))
              for m in prep]
    assert stages == [("pin", None), ("validate", "0"), ("validate", "1"), ("validate", "2"), ("prepare", "0"),
                      ("prepare", "1"), ("prepare", "2"), ("merge", None)]
    for manifest in prep:
        kubernetes_validate.validate(manifest, K8S_VERSION, strict=True)
        assert_restricted(manifest["spec"], manifest["metadata"]["name"])
        args = manifest["spec"]["containers"][0]["args"]
        index = manifest["metadata"]["labels"].get("trainyard/index")
        assert args[0] == manifest["metadata"]["labels"]["trainyard/stage"]
        assert (args[-2:] == ["--group", index]) if index is not None else "--group" not in args
        assert manifest["spec"]["nodeSelector"] == {"trainyard.io/cpu-pool": "true"}  # every group is a CPU pod
        assert manifest["spec"]["volumes"][0]["persistentVolumeClaim"]["claimName"] == "trainyard-data"
    names = [m["metadata"]["name"] for m in prep]
    assert len(set(names)) == len(names) and "-validate-g2-" in names[3]


def test_training_job_uses_the_headless_service_dns(manifests: list[dict]) -> None:
    (headless,) = [m for m in manifests if m["kind"] == "Service" and m["spec"].get("clusterIP") == "None"]
    job = headless["metadata"]["name"]
    chief = next(m for m in manifests if m["metadata"]["name"] == f"{job}-chief-0")
    env = {e["name"]: e.get("value") for e in chief["spec"]["containers"][0]["env"]}
    cluster = json.loads(env["TF_CONFIG"])["cluster"]
    assert cluster["worker"] == [f"{job}-worker-{i}.{job}.trainyard.svc:2222" for i in range(2)]
    assert chief["spec"]["subdomain"] == job and chief["spec"]["hostname"] == f"{job}-chief-0"
    assert set(headless["spec"]["selector"].items()) <= set(chief["metadata"]["labels"].items())


def test_serving_is_clusterip_and_reads_the_volume_read_only(manifests: list[dict]) -> None:
    (deployment,) = [m for m in manifests if m["kind"] == "Deployment"]
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    assert container["image"] == "tensorflow/serving:2.19.0"
    assert "--model_base_path=/data/models/digits" in container["args"]
    assert all(m["readOnly"] for m in container["volumeMounts"] if m["mountPath"] == "/data")
    assert container["readinessProbe"]["httpGet"]["path"] == "/v1/models/digits"
    service = next(m for m in manifests if m["kind"] == "Service" and m["metadata"]["name"] == "digits")
    assert service["spec"]["type"] == "ClusterIP" and [p["port"] for p in service["spec"]["ports"]] == [8500, 8501]
    deploy_pod = next(m for m in manifests if m["metadata"]["name"].startswith("digits-deploy-"))
    assert "digits.trainyard.svc:8500" in deploy_pod["spec"]["containers"][0]["args"]


def test_secrets_appear_only_as_references(manifests: list[dict]) -> None:
    pods = [m for m in manifests if m["kind"] == "Pod"]
    refs = [env for pod in pods for container in pod["spec"]["containers"] for env in container.get("env", [])
            if env["name"] == "WANDB_API_KEY"]
    assert len(pods) >= 9 and len(refs) == len(pods)  # every stage and replica pod gets the reference
    for env in refs:
        assert "value" not in env
        assert env["valueFrom"]["secretKeyRef"] == {"name": "wandb", "key": "api-key"}


def test_priority_high_picks_the_newest_tier(pipelines_dir: Path) -> None:
    path = pipelines_dir / "digits.yaml"
    path.write_text(path.read_text().replace("priority: low", "priority: high"))
    rendered = render_run(load_pipeline_file(path), RUN_ID)
    worker = next(m for m in rendered if m["metadata"]["name"].endswith("-worker-0"))
    assert worker["spec"]["nodeSelector"]["nvidia.com/gpu.product"] == "NVIDIA-H100-80GB-HBM3"
    assert worker["spec"]["priorityClassName"] == "trainyard-high"
    assert worker["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] == "1"


def test_cluster_manifests_in_k8s_are_valid() -> None:
    documents = [d for path in sorted((REPO / "k8s").glob("*.yaml")) for d in yaml.safe_load_all(path.read_text())]
    assert {d["kind"] for d in documents} >= {"Namespace", "PersistentVolumeClaim", "PriorityClass", "Role",
                                               "RoleBinding", "ServiceAccount", "ResourceQuota"}
    for document in documents:
        kubernetes_validate.validate(document, K8S_VERSION, strict=True)
    (pvc,) = [d for d in documents if d["kind"] == "PersistentVolumeClaim"]
    assert pvc["spec"]["accessModes"] == ["ReadWriteMany"]
    (role,) = [d for d in documents if d["kind"] == "Role"]
    assert role["metadata"]["namespace"] == "trainyard"  # namespaced, never a ClusterRole
    assert all("*" not in rule["verbs"] and "*" not in rule["resources"] for rule in role["rules"])


def test_the_config_registry_prefixes_every_trainyard_image_in_the_manifests(pipelines_dir: Path) -> None:
    path = pipelines_dir / "digits.yaml"
    path.write_text(path.read_text() + "kubernetes:\n  registry: registry.example.com/ml\n")
    rendered = render_run(load_pipeline_file(path), RUN_ID)
    images = {c["image"] for m in rendered for spec in pod_specs(m) for c in spec["containers"]}
    assert {"registry.example.com/ml/trainyard/prep:0.1.0", "registry.example.com/ml/trainyard/trainer:0.1.0",
            "registry.example.com/ml/trainyard/evaluate:0.1.0",
            "registry.example.com/ml/trainyard/serving:0.1.0"} <= images, images
    assert {image for image in images if not image.startswith("registry.example.com/ml/trainyard/")} == {
        "tensorflow/serving:2.19.0"}, images


def test_render_cli_writes_yaml(pipelines_dir: Path, tmp_path: Path) -> None:
    assert cli(["render", "digits", "--run-id", RUN_ID, "--out", str(tmp_path / "out")]) == 0
    files = sorted((tmp_path / "out").glob("*.yaml"))
    assert len(files) == 13
    assert yaml.safe_load(files[0].read_text())["apiVersion"] in ("v1", "apps/v1")
    assert cli(["render", "nope", "--out", str(tmp_path / "x")]) == 1
