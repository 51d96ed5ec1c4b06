"""One `runtime: {image, resources, env}` per stage section, what each stage's pods get from it, and the old
spellings (`prep.image`, `training.chief`, `deploy.client_image`, ...) still read with a notice that names the
line."""

from __future__ import annotations

from pathlib import Path

import pytest

from trainyard.cli import main as cli
from trainyard.config.loader import ConfigError, check_folder, load_pipeline_file
from trainyard.dag.registry import STAGES, runtime_of, stage_named
from trainyard.dag.stages import RunContext, role_resources, stage_container
from trainyard_contract.schema import PipelineConfig

MINIMAL = """\
name: p
data:
  source: datasets/x
  label: {name: y, classes: [0, 1]}
  features: [{name: a}]
"""


def write(folder: Path, text: str, name: str = "p.yaml") -> Path:
    path = folder / name
    path.write_text(text)
    return path


def test_each_stage_runs_in_its_sections_runtime(tmp_path: Path) -> None:
    path = write(tmp_path, MINIMAL + """\
prep:
  runtime: {image: registry.example.com/prep:2, env: {ARROW_NUM_THREADS: "2", TF_CPP_MIN_LOG_LEVEL: "0"}}
training:
  runtime: {resources: {cpu: "3", memory: 5Gi}, env: {MY_MODEL_FLAG: "on"}}
deploy:
  runtime: {image: my/serving:1}
""")
    config = load_pipeline_file(path)
    run = RunContext(pipeline="p", run_id="manual__1")
    validate = stage_container(config, run, stage_named("validate"))
    assert validate.image == "registry.example.com/prep:2"
    assert validate.env["ARROW_NUM_THREADS"] == "2" and validate.env["TF_CPP_MIN_LOG_LEVEL"] == "0"  # over ours
    assert validate.env["MALLOC_TRIM_THRESHOLD_"]  # the image's own defaults stay
    assert validate.resources.cpu == "1"  # prep's default: only the image was given
    train = stage_container(config, run, stage_named("train"))
    assert train.image == "trainyard/trainer:0.1.0" and train.env["MY_MODEL_FLAG"] == "on"
    assert "MY_MODEL_FLAG" not in validate.env and "ARROW_NUM_THREADS" not in train.env
    assert role_resources(config, "chief").memory == "5Gi" and role_resources(config, "worker").gpu == 1
    assert stage_container(config, run, stage_named("deploy")).image == "my/serving:1"
    assert config.deploy.image.startswith("tensorflow/serving:")  # TF Serving's own image is not the step's
    assert {s.task_id: s.runtime(config) for s in STAGES}["evaluate"] == config.evaluation.runtime


@pytest.mark.parametrize(("env", "says"), [
    ("{TRAINYARD_CONFIG_JSON: x}", "prep.runtime.env.TRAINYARD_CONFIG_JSON: set by Trainyard itself in every"),
    ("{TF_CONFIG: x}", "prep.runtime.env.TF_CONFIG: set by Trainyard itself in every stage process; choose another"),
    ("{1BAD: x}", "prep.runtime.env.1BAD.[key]: '1BAD' does not match the pattern"),
    ("{DB_PASSWORD: x}", "prep.runtime.env.DB_PASSWORD: also filled from a secret in kubernetes.secrets"),
])
def test_an_env_that_would_clash_is_refused_naming_the_line(tmp_path: Path, env: str, says: str) -> None:
    path = write(tmp_path, MINIMAL + f"prep:\n  runtime:\n    env: {env}\nkubernetes:\n  secrets: "
                 "[{env: DB_PASSWORD, secret: db, key: password}]\n")
    with pytest.raises(ConfigError) as info:
        load_pipeline_file(path)
    [line] = info.value.lines
    assert line.startswith(f"{path}:8:") and says in line


OLD = MINIMAL + """\
prep:
  image: my/prep:1
training:
  chief: {cpu: "2", memory: 3Gi}
evaluation:
  resources: {cpu: 250m}
deploy:
  client_image: my/serving:1
  client_resources: {memory: 1Gi}
"""


def test_the_old_spellings_are_read_where_the_new_ones_are_with_a_notice_per_line(tmp_path: Path) -> None:
    old = load_pipeline_file(path := write(tmp_path, OLD), notices=(notices := []))
    new = PipelineConfig.model_validate({
        **old.model_dump(exclude={"prep", "training", "evaluation", "deploy"}),
        "prep": {"runtime": {"image": "my/prep:1"}},
        "training": {"runtime": {"resources": {"cpu": "2", "memory": "3Gi"}}},
        "evaluation": {"runtime": {"resources": {"cpu": "250m"}}},
        "deploy": {"runtime": {"image": "my/serving:1", "resources": {"memory": "1Gi"}}}})
    assert old == new
    assert notices == [
        f"{path}:7:3: prep.image: deprecated spelling, read as prep.runtime.image; write `prep: {{runtime: "
        "{image: ...}}` instead",
        f"{path}:9:3: training.chief: deprecated spelling, read as training.runtime.resources; write `training: "
        "{runtime: {resources: ...}}` instead",
        f"{path}:11:3: evaluation.resources: deprecated spelling, read as evaluation.runtime.resources; write "
        "`evaluation: {runtime: {resources: ...}}` instead",
        f"{path}:13:3: deploy.client_image: deprecated spelling, read as deploy.runtime.image; write `deploy: "
        "{runtime: {image: ...}}` instead",
        f"{path}:14:3: deploy.client_resources: deprecated spelling, read as deploy.runtime.resources; write "
        "`deploy: {runtime: {resources: ...}}` instead"]
    assert stage_container(old, RunContext(pipeline="p", run_id="r"), stage_named("train")).resources.cpu == "2"


def test_an_old_spelling_in_the_defaults_merges_with_a_new_one_in_the_pipeline(tmp_path: Path) -> None:
    write(tmp_path, "prep:\n  resources: {cpu: '3'}\n  image: team/prep:7\n", "_defaults.yaml")
    config = load_pipeline_file(write(tmp_path, MINIMAL + "prep:\n  runtime: {image: mine/prep:1}\n"), notices=[])
    assert config.prep.runtime.image == "mine/prep:1" and config.prep.runtime.resources.cpu == "3"


def test_a_bad_value_under_an_old_spelling_points_at_its_line_and_both_spellings_at_once_are_refused(
        tmp_path: Path) -> None:
    path = write(tmp_path, MINIMAL + "training:\n  chief: {cpu: lots}\n")
    with pytest.raises(ConfigError) as info:
        load_pipeline_file(path, notices=[])
    assert info.value.lines[0].startswith(f"{path}:7:16: training.runtime.resources.cpu: ")
    path = write(tmp_path, MINIMAL + "prep:\n  image: a/b:1\n  runtime: {image: c/d:2}\n")
    with pytest.raises(ConfigError) as info:
        load_pipeline_file(path, notices=[])
    assert info.value.lines == [f"{path}:7:3: prep.image: also given as prep.runtime.image; keep prep.runtime.image "
                                "and remove prep.image"]


def test_check_warns_about_an_old_spelling_and_still_passes(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    path = write(tmp_path, OLD)
    notices: list[str] = []
    configs, errors = check_folder([path, path], notices)
    assert errors[0].endswith("defined twice (also " + str(path) + "); DAG ids must be unique") and len(notices) == 5
    assert cli(["check", "--no-build", str(path)]) == 0
    err = capsys.readouterr().err
    assert err.count("warning: ") == 5 and "training.chief: deprecated spelling" in err


def test_a_stage_takes_its_runtime_only_from_a_stage_section() -> None:
    with pytest.raises(ValueError, match="'kubernetes' is not a stage section"):
        runtime_of("kubernetes")
