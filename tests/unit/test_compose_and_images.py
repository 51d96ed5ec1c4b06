"""docker-compose files against the Compose Specification schema, and the Dockerfiles' inputs and pins.

Docker cannot run here, so this checks what can be checked without it: the files are valid Compose, every build
context, Dockerfile and COPY source exists, every base image is pinned, and the defaults agree with the config.
The schema is the Compose Specification's compose_spec.json (Apache-2.0), vendored in tests/fixtures.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import jsonschema
import pytest
import yaml

from trainyard_contract.schema import DeployConfig, EvaluationConfig, PrepConfig, TrainingConfig

REPO = Path(__file__).resolve().parents[2]
SCHEMA = json.loads((REPO / "tests" / "fixtures" / "compose_spec.json").read_text())
COMPOSE_FILES = ["docker-compose.yaml", "docker-compose.kubernetes.yaml"]
STAGE_IMAGES = ["prep", "trainer", "evaluate", "serving", "airflow"]


def validate(document: dict) -> None:
    jsonschema.validators.validator_for(SCHEMA)(SCHEMA).validate(document)


@pytest.mark.parametrize("name", COMPOSE_FILES)
def test_compose_files_follow_the_compose_specification(name: str) -> None:
    validate(yaml.safe_load((REPO / name).read_text()))


def test_the_schema_rejects_what_compose_would_reject() -> None:
    document = yaml.safe_load((REPO / "docker-compose.yaml").read_text())
    document["services"]["airflow-scheduler"]["helthcheck"] = document["services"]["airflow-scheduler"].pop(
        "healthcheck")
    with pytest.raises(jsonschema.ValidationError, match="helthcheck"):
        validate(document)


def test_compose_has_the_official_airflow_structure_and_tf_serving() -> None:
    text = (REPO / "docker-compose.yaml").read_text()
    assert "x-airflow-common: &airflow-common" in text
    services = yaml.safe_load(text)["services"]
    assert {"postgres", "airflow-init", "airflow-apiserver", "airflow-scheduler", "airflow-dag-processor",
            "airflow-triggerer", "tf-serving"} <= set(services)
    for name, service in services.items():
        if name != "airflow-init":
            assert "healthcheck" in service, f"{name} has no healthcheck"
    init = services["airflow-init"]["command"][-1]
    assert init.startswith("airflow db migrate && trainyard pools && ")  # a task in a missing pool never runs
    serving = services["tf-serving"]
    assert serving["image"] == DeployConfig().image  # the same pinned TF Serving as the Kubernetes backend
    assert any(v.endswith(":ro") and "trainyard-data" in v for v in serving["volumes"])
    env = services["airflow-scheduler"]["environment"]
    assert env["TRAINYARD_SERVING_GRPC"] == "tf-serving:8500"


def test_the_kubernetes_override_mounts_a_kubeconfig_and_selects_the_backend() -> None:
    override = yaml.safe_load((REPO / "docker-compose.kubernetes.yaml").read_text())["services"]
    for name in ("airflow-scheduler", "airflow-triggerer"):
        assert override[name]["environment"]["TRAINYARD_BACKEND"] == "kubernetes"
        assert any(v.endswith(":/opt/airflow/.kube/config:ro") for v in override[name]["volumes"])
    connection = json.loads(override["airflow-scheduler"]["environment"]["AIRFLOW_CONN_KUBERNETES_DEFAULT"])
    assert connection["extra"]["kube_config_path"] == "/opt/airflow/.kube/config"


def test_every_build_context_and_dockerfile_exists() -> None:
    for name in COMPOSE_FILES:
        for service in yaml.safe_load((REPO / name).read_text()).get("services", {}).values():
            build = service.get("build")
            if build:
                context = REPO / build["context"]
                assert context.is_dir() and (context / build["dockerfile"]).is_file()


def dockerfile_instructions(path: Path) -> list[tuple[str, str]]:
    text = re.sub(r"\\\n\s*", " ", path.read_text())
    return [tuple(line.split(None, 1)) for line in text.splitlines() if line.strip() and not line.startswith("#")]


@pytest.mark.parametrize("stage", STAGE_IMAGES)
def test_each_image_is_pinned_and_copies_only_files_that_exist(stage: str) -> None:
    dockerfile = REPO / "images" / stage / "Dockerfile"
    instructions = dockerfile_instructions(dockerfile)
    bases = [arg for op, arg in instructions if op == "FROM"]
    assert bases and all(re.match(r"^[\w./-]+:[\w.-]+$", base) and not base.endswith(":latest") for base in bases)
    assert [op for op, _ in instructions].count("COPY") >= 1, f"{dockerfile} copies nothing"
    for op, arg in instructions:
        if op == "COPY":
            sources = [s for s in arg.split() if not s.startswith("--")][:-1]
            for source in sources:
                assert (REPO / source).exists(), f"{dockerfile}: COPY source {source} does not exist"
        if op == "RUN" and "pip install" in arg and "-e" not in arg.split():
            assert "-c " in arg or "==" in arg, f"{dockerfile}: unpinned pip install: {arg}"


def test_default_images_each_have_a_dockerfile() -> None:
    sections = (PrepConfig(), TrainingConfig(), EvaluationConfig(), DeployConfig())
    defaults = [section.runtime.image for section in sections]
    for image in defaults:
        folder = image.split("/", 1)[1].split(":", 1)[0]
        assert (REPO / "images" / folder / "Dockerfile").is_file(), image
    assert TrainingConfig().runtime.image != EvaluationConfig().runtime.image  # GPU base, CPU base
    assert "gpu" in dockerfile_instructions(REPO / "images" / "trainer" / "Dockerfile")[0][1]


def test_the_evaluate_image_is_the_trainer_s_on_a_cpu_base() -> None:
    """Line for line after FROM, so a builder whose two bases are one image (CI's) builds and stores it once."""
    trainer = dockerfile_instructions(REPO / "images" / "trainer" / "Dockerfile")
    evaluate = dockerfile_instructions(REPO / "images" / "evaluate" / "Dockerfile")
    assert (trainer[0][1], evaluate[0][1]) == ("tensorflow/tensorflow:2.21.0-gpu", "tensorflow/tensorflow:2.21.0")
    assert evaluate[1:] == trainer[1:]
    serving = dockerfile_instructions(REPO / "images" / "serving" / "Dockerfile")
    assert serving[:4] == evaluate[:4]  # the serving image shares the CPU base and the layers up to its pip line
