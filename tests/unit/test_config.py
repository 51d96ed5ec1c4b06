"""The config schema and its error lines: FILE:LINE:COL: dotted.field: message."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from pydantic import ValidationError

from trainyard.cli import main as cli
from trainyard.config.loader import ConfigError, check_folder, load_pipeline_file, pipeline_files
from trainyard_contract.schema import PipelineConfig

MINIMAL = """\
name: {name}
data:
  source: datasets/x
  label: {{name: y, classes: [0, 1]}}
  features:
    - {{name: a, min: 0, max: 1}}
"""


def write(folder: Path, name: str, text: str) -> Path:
    path = folder / name
    path.write_text(text)
    return path


REPO = Path(__file__).resolve().parents[2]


def errors_of(path: Path) -> list[str]:
    with pytest.raises(ConfigError) as info:
        load_pipeline_file(path)
    return info.value.lines


def test_example_pipelines_are_valid(pipelines_dir: Path) -> None:
    configs, errors = check_folder(pipeline_files(pipelines_dir))
    assert errors == []
    digits = next(c for c in configs if c.name == "digits")
    assert len(digits.data.columns()) == 64
    assert digits.data.columns()[63].name == "pixel_63"
    assert digits.kubernetes.namespace == "trainyard"  # from _defaults.yaml
    assert digits.kubernetes.gpu_tiers["newest"].priority_class == "trainyard-high"


def test_config_is_frozen(pipelines_dir: Path) -> None:
    config = load_pipeline_file(pipelines_dir / "digits.yaml")
    with pytest.raises(ValidationError, match="frozen"):
        config.training.steps = 5  # type: ignore[misc]


def test_value_error_names_file_line_column_and_field(tmp_path: Path) -> None:
    path = write(tmp_path, "p.yaml", MINIMAL.format(name="p") + "training:\n  workers:\n    replicas: 0\n")
    assert errors_of(path) == [
        f"{path}:9:15: training.workers.replicas: must be ≥ 1 for parameter_server training (got 0)"
    ]
    path = write(tmp_path, "q.yaml", MINIMAL.format(name="q") + "training:\n  steps: 0\n")
    assert errors_of(path) == [f"{path}:8:10: training.steps: must be ≥ 1 (got 0)"]


def test_unknown_key_suggests_the_close_field(tmp_path: Path) -> None:
    path = write(tmp_path, "p.yaml", MINIMAL.format(name="p") + "training:\n  batchsize: 32\n")
    assert errors_of(path) == [f"{path}:8:3: training.batchsize: unknown field; did you mean 'batch_size'?"]


def test_nested_unknown_key_in_a_list_item(tmp_path: Path) -> None:
    text = MINIMAL.format(name="p").replace("{name: a, min: 0, max: 1}", "{name: a, minimum: 0}")
    path = write(tmp_path, "p.yaml", text)
    assert errors_of(path) == [f"{path}:6:17: data.features.0.minimum: unknown field; did you mean 'min'?"]


def test_missing_required_field_points_at_the_parent(tmp_path: Path) -> None:
    path = write(tmp_path, "p.yaml", "name: p\ndata:\n  source: datasets/x\n  features: [{name: a}]\n")
    assert errors_of(path) == [f"{path}:2:1: data.label: required field is missing"]


def test_yaml_syntax_error_uses_the_parser_mark(tmp_path: Path) -> None:
    path = write(tmp_path, "p.yaml", "name: p\ndata: [unclosed\n")
    (line,) = errors_of(path)
    assert line.startswith(f"{path}:3:1: YAML syntax error")


def test_duplicate_keys_are_errors(tmp_path: Path) -> None:
    path = write(tmp_path, "p.yaml", MINIMAL.format(name="p") + "name: p\n")
    assert errors_of(path) == [f"{path}:7:1: name: duplicate key (first defined at line 1)"]


@pytest.mark.parametrize(
    ("source", "message"),
    [
        ("/etc/passwd", "must be a path relative to the shared volume root"),
        ("datasets/../../secrets", "'..' is not allowed"),
    ],
)
def test_paths_must_stay_inside_the_volume(tmp_path: Path, source: str, message: str) -> None:
    path = write(tmp_path, "p.yaml", MINIMAL.format(name="p").replace("datasets/x", source))
    (line,) = errors_of(path)
    assert line.startswith(f"{path}:3:11: data.source: ") and message in line


def test_name_must_match_the_file(tmp_path: Path) -> None:
    path = write(tmp_path, "p.yaml", MINIMAL.format(name="other"))
    assert errors_of(path) == [f"{path}:1:7: name: 'other' must match the file name 'p' (one file, one DAG id)"]


def test_two_configs_with_the_same_name_are_an_error(tmp_path: Path) -> None:
    write(tmp_path, "p.yaml", MINIMAL.format(name="p"))
    write(tmp_path, "p.yml", MINIMAL.format(name="p"))
    configs, errors = check_folder(pipeline_files(tmp_path))
    assert [c.name for c in configs] == ["p"]
    assert errors == [f"{tmp_path / 'p.yml'}:1:1: name: pipeline 'p' is defined twice "
                      f"(also {tmp_path / 'p.yaml'}); DAG ids must be unique"]


def test_error_in_a_default_points_at_the_defaults_file(tmp_path: Path) -> None:
    write(tmp_path, "_defaults.yaml", "kubernetes:\n  namespace: Not_A_DNS_Name\n")
    path = write(tmp_path, "p.yaml", MINIMAL.format(name="p"))
    (line,) = errors_of(path)
    assert line.startswith(f"{tmp_path / '_defaults.yaml'}:2:14: kubernetes.namespace: ")


def test_pipeline_values_override_defaults(tmp_path: Path) -> None:
    write(tmp_path, "_defaults.yaml", "kubernetes:\n  namespace: team-a\n  service_account: runner\n")
    path = write(tmp_path, "p.yaml", MINIMAL.format(name="p") + "kubernetes:\n  namespace: team-b\n")
    config = load_pipeline_file(path)
    assert (config.kubernetes.namespace, config.kubernetes.service_account) == ("team-b", "runner")


def test_a_profile_layers_between_the_defaults_and_the_pipeline(tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    write(tmp_path, "_defaults.yaml", "kubernetes:\n  namespace: team-a\n  startup_timeout_seconds: 600\n")
    write(tmp_path, "_profile-tiny.yaml", "kubernetes:\n  startup_timeout_seconds: 60\n"
                                          "training:\n  workers: {resources: {cpu: 100m, gpu: 0}}\n")
    path = write(tmp_path, "p.yaml", MINIMAL.format(name="p") + "training:\n  workers: {replicas: 3}\n")
    without = load_pipeline_file(path)
    assert (without.kubernetes.startup_timeout_seconds, without.training.workers.resources.gpu) == (600, 1)
    monkeypatch.setenv("TRAINYARD_PROFILE", "tiny")
    config = load_pipeline_file(path)
    assert config.kubernetes.namespace == "team-a"  # the defaults still apply
    assert config.kubernetes.startup_timeout_seconds == 60  # the profile over the defaults
    assert (config.training.workers.resources.cpu, config.training.workers.resources.gpu) == ("100m", 0)
    assert config.training.workers.replicas == 3  # the pipeline over both


def test_an_error_in_a_profile_points_at_the_profile_and_a_missing_one_is_named(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    write(tmp_path, "_profile-tiny.yaml", "kubernetes:\n  startup_timeout_seconds: 1\n")
    path = write(tmp_path, "p.yaml", MINIMAL.format(name="p"))
    monkeypatch.setenv("TRAINYARD_PROFILE", "tiny")
    (line,) = errors_of(path)
    assert line.startswith(f"{tmp_path / '_profile-tiny.yaml'}:2:28: kubernetes.startup_timeout_seconds: "), line
    monkeypatch.setenv("TRAINYARD_PROFILE", "huge")
    (line,) = errors_of(path)
    assert line == (f"{tmp_path}: TRAINYARD_PROFILE='huge' but there is no _profile-huge.yaml there "
                    "(profiles: tiny); unset it or add the file")


def test_the_shipped_small_profile_fits_one_two_cpu_node_without_gpus(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every example pipeline under TRAINYARD_PROFILE=small: no GPU anywhere, and a whole training job plus one
    stage pod and the serving pod request under 2 CPUs."""
    from trainyard.dag.cluster_spec import kubernetes_hosts
    from trainyard.dag.registry import stage_named
    from trainyard.dag.stages import RunContext, train_containers, train_replicas
    from trainyard.launch.podspec import build_job_pods

    monkeypatch.setenv("TRAINYARD_PROFILE", "small")
    configs, errors = check_folder(pipeline_files(REPO / "pipelines_config"))
    assert errors == [] and configs
    for config in configs:
        run = RunContext(pipeline=config.name, run_id="manual__2026-12-03T00:00:00+00:00")
        hosts = kubernetes_hosts("job", "ns", 2222, train_replicas(config))
        pods = build_job_pods(config, run, train_containers(config, run, stage_named("train"), hosts), "job")
        requests = [pod.spec.containers[0].resources.requests for pod in pods]
        assert all("nvidia.com/gpu" not in r for r in requests), config.name
        millicores = sum(int(r["cpu"].rstrip("m")) if r["cpu"].endswith("m") else int(r["cpu"]) * 1000
                         for r in requests)
        assert millicores + 250 + 250 <= 2000, (config.name, millicores)
        assert all(pod.spec.node_selector == config.kubernetes.node_pools.cpu for pod in pods), config.name


def test_schedule_must_be_cron_preset_or_null() -> None:
    base = PipelineConfig.model_validate(
        {"name": "p", "data": {"source": "d", "label": {"name": "y", "classes": [0, 1]}, "features": [{"name": "a"}]}}
    ).model_dump()
    for good in (None, "@daily", "0 3 * * 1-5"):
        PipelineConfig.model_validate({**base, "schedule": good})
    with pytest.raises(Exception, match="5-field cron"):
        PipelineConfig.model_validate({**base, "schedule": "every day"})


def test_feature_count_expands_and_duplicates_are_refused(tmp_path: Path) -> None:
    features = "- {name: 'a_{i}', count: 3}\n    - {name: a_1}"
    text = MINIMAL.format(name="p").replace("- {name: a, min: 0, max: 1}", features)
    (line,) = errors_of(write(tmp_path, "p.yaml", text))
    assert "data: column 'a_1' is defined twice" in line


def test_check_cli_exit_codes(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    good = write(tmp_path, "good.yaml", MINIMAL.format(name="good"))
    bad = write(tmp_path, "bad.yaml", MINIMAL.format(name="bad") + "retries: -1\n")
    assert cli(["check", str(good)]) == 0
    assert "ok  good" in capsys.readouterr().out
    assert cli(["check", str(tmp_path)]) == 1
    err = capsys.readouterr().err
    assert f"{bad}:7:10: retries: must be ≥ 0 (got -1)" in err
    assert cli(["check", str(tmp_path / "nope.yaml")]) == 2
    assert cli(["check", "--bogus-flag"]) == 2


def test_check_says_when_the_served_model_name_differs_from_the_pipeline_name(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    derived = write(tmp_path, "breast_cancer.yaml", MINIMAL.format(name="breast_cancer"))
    assert cli(["check", str(derived)]) == 0
    assert ("ok  breast_cancer (serves as model 'breast-cancer': model names are DNS labels, so `_` becomes `-`; "
            "set deploy.model_name to choose it)") in capsys.readouterr().out
    same = write(tmp_path, "plain.yaml", MINIMAL.format(name="plain"))
    assert cli(["check", str(same)]) == 0
    assert capsys.readouterr().out.strip() == "ok  plain"


def test_schedule_on_new_data_names_an_asset_on_the_volume(tmp_path: Path) -> None:
    path = write(tmp_path, "p.yaml", MINIMAL.format(name="p") + "schedule: {asset: datasets/x}\n")
    config = load_pipeline_file(path)
    assert config.schedule.uri == "trainyard://volume/datasets/x"
    bad = write(tmp_path, "q.yaml", MINIMAL.format(name="q") + "schedule: {asset: /srv/x}\n")
    (line,) = errors_of(bad)
    assert line.startswith(f"{bad}:7:") and "schedule.asset: " in line and "relative to the shared volume" in line
    typo = write(tmp_path, "r.yaml", MINIMAL.format(name="r") + "schedule: {assets: datasets/x}\n")
    assert any("schedule.assets: unknown field" in line for line in errors_of(typo))


def test_pools_default_and_are_validated(tmp_path: Path) -> None:
    config = load_pipeline_file(write(tmp_path, "p.yaml", MINIMAL.format(name="p")))
    assert (config.training.pool, config.deploy.pool) == ("trainyard_training", "trainyard_deploy")
    bad = write(tmp_path, "q.yaml", MINIMAL.format(name="q") + "training: {pool: 'gpu pool'}\n")
    (line,) = errors_of(bad)
    assert "training.pool: " in line


def _pipeline(label: dict, evaluation: dict | None = None, features: list | None = None) -> dict:
    return {"name": "t", "data": {"source": "d", "label": label, "features": features or [{"name": "a"}]},
            "evaluation": evaluation or {}}


@pytest.mark.parametrize(("label", "task", "dtype"), [
    ({"name": "y", "classes": [0, 1]}, "classification", "int"),
    ({"name": "y", "classes": ["no", "yes"], "dtype": "string"}, "classification", "string"),
    ({"name": "y", "task": "regression"}, "regression", "float"),
    ({"name": "y", "dtype": "float"}, "regression", "float"),
    ({"name": "y", "task": "regression", "dtype": "int", "min": 0}, "regression", "int"),
])
def test_the_task_follows_from_the_label(label: dict, task: str, dtype: str) -> None:
    from trainyard_contract.schema import PipelineConfig

    parsed = PipelineConfig.model_validate(_pipeline(label)).data.label
    assert (parsed.task, parsed.dtype) == (task, dtype)


@pytest.mark.parametrize(("label", "features", "evaluation", "message"), [
    ({"name": "y"}, None, None, "say what is predicted"),
    ({"name": "y", "task": "regression", "classes": [0, 1]}, None, None, "a regression label has no classes"),
    ({"name": "y", "classes": [0, 1], "dtype": "float"}, None, None, "a classification label is int or string"),
    ({"name": "y", "classes": ["a", "b"]}, None, None, "an int label's classes are integers"),
    ({"name": "y", "classes": [1, 1]}, None, None, "a class is listed twice"),
    ({"name": "y", "classes": [0, 1]}, [{"name": "a", "dtype": "float", "kind": "categorical"}], None,
     "a float feature cannot be categorical"),
    ({"name": "y", "classes": [0, 1]}, [{"name": "a", "vocabulary": {"min_count": 2}}], None,
     "only a categorical feature has a vocabulary"),
    ({"name": "y", "classes": [0, 1]}, None, {"metrics": ["accuracy", "rmse"]}, "'rmse' is a regression metric"),
    ({"name": "y", "task": "regression"}, None, {"thresholds": {"accuracy": {"min": 0.9}}},
     "'accuracy' is a classification metric"),
    ({"name": "y", "classes": [0, 1]}, None, {"thresholds": {"acuracy": {"min": 0.9}}}, "did you mean 'accuracy'?"),
    ({"name": "y", "classes": [0, 1]}, None, {"thresholds": {"f1": {"min": 0.5}}}, "'f1' is not computed"),
    ({"name": "y", "classes": [0, 1]}, None, {"metrics": ["accuracy"], "thresholds": {"accuracy": {"min": 90}}},
     "accuracy is at most 1: min 90 can never hold"),
    ({"name": "y", "task": "regression"}, None, {"metrics": ["rmse"], "thresholds": {"rmse": {"max": -1}}},
     "rmse is at least 0: max -1 can never hold"),
    ({"name": "y", "classes": [0, 1]}, None, {"change_threshold": {"metric": "auc"}}, "'auc' is not computed"),
])
def test_a_label_feature_or_metric_that_cannot_work_is_refused(label: dict, features: list | None,
                                                               evaluation: dict | None, message: str) -> None:
    from pydantic import ValidationError

    from trainyard_contract.schema import PipelineConfig

    with pytest.raises(ValidationError, match=re.escape(message)):
        PipelineConfig.model_validate(_pipeline(label, evaluation, features))


@pytest.mark.parametrize(("features", "label", "message"), [
    ([{"name": "p_{i}", "count": 2, "source_column": "p"}], {}, "a feature with `count` expands to several columns"),
    ([{"name": "a", "source_column": "x"}, {"name": "b", "source_column": "x"}], {},
     "source column 'x' is read twice (by 'a' and 'b')"),
    ([{"name": "a", "source_column": "b"}, {"name": "b"}], {}, "source column 'b' is read twice (by 'a' and 'b')"),
    ([{"name": "a"}], {"source_column": "a"}, "source column 'a' is read twice (by 'a' and 'y')"),
    ([{"name": "a", "source_column": "x,y"}], {}, "source_column"),
    ([{"name": "a", "source_column": "   "}], {}, "source_column"),
    ([{"name": "a", "source_column": "x\ty"}], {}, "source_column"),
    ([{"name": "a/b"}], {}, "features.0.name"),
])
def test_source_columns_map_a_file_name_to_one_identifier(features: list, label: dict, message: str) -> None:
    from pydantic import ValidationError

    from trainyard_contract.schema import PipelineConfig

    with pytest.raises(ValidationError, match=re.escape(message)):
        PipelineConfig.model_validate(_pipeline({"name": "y", "classes": [0, 1], **label}, None, features))
    fine = PipelineConfig.model_validate(_pipeline(
        {"name": "y", "classes": [0, 1], "source_column": "Outcome (1 = yes)"}, None,
        [{"name": "od280_od315", "source_column": "od280/od315_of_diluted_wines"},
         {"name": "b", "source_column": " b"}]))
    assert fine.data.source_columns() == {"od280_od315": "od280/od315_of_diluted_wines", "b": " b",
                                          "y": "Outcome (1 = yes)"}


def test_the_registry_prefixes_trainyards_own_images_only() -> None:
    from pydantic import ValidationError

    from trainyard_contract.schema import PipelineConfig

    config = PipelineConfig.model_validate({**_pipeline({"name": "y", "classes": [0, 1]}),
                                            "kubernetes": {"registry": "registry.example.com:5000/ml"}})
    assert config.kubernetes.image("trainyard/prep:0.1.0") == "registry.example.com:5000/ml/trainyard/prep:0.1.0"
    assert config.kubernetes.image("tensorflow/serving:2.19.0") == "tensorflow/serving:2.19.0"
    assert config.kubernetes.image("acme/trainyard/x:1") == "acme/trainyard/x:1"
    plain = PipelineConfig.model_validate(_pipeline({"name": "y", "classes": [0, 1]}))
    assert plain.kubernetes.image("trainyard/prep:0.1.0") == "trainyard/prep:0.1.0"
    for bad in ("https://registry.example.com", "Registry.example.com", "registry.example.com/ml/"):
        with pytest.raises(ValidationError, match="kubernetes.registry"):
            PipelineConfig.model_validate({**_pipeline({"name": "y", "classes": [0, 1]}),
                                           "kubernetes": {"registry": bad}})


def test_a_metric_error_is_placed_on_its_line(tmp_path: Path) -> None:
    from trainyard.config.loader import ConfigError, load_pipeline_file

    path = tmp_path / "t.yaml"
    path.write_text("name: t\ndata:\n  source: d\n  label: {name: y, classes: [0, 1]}\n  features: [{name: a}]\n"
                    "evaluation:\n  metrics: [accuracy, mse]\n  thresholds:\n    acuracy: {min: 0.9}\n")
    with pytest.raises(ConfigError) as info:
        load_pipeline_file(path)
    assert info.value.lines[0].startswith(f"{path}:7:23: evaluation.metrics.1: 'mse' is a regression metric")


def test_chunk_rows_default_to_a_cell_budget_within_bounds() -> None:
    from trainyard_contract.schema import PrepConfig

    auto = PrepConfig()
    assert auto.chunk_rows is None
    assert auto.rows_per_chunk(17) == 470_588  # 16 features + label: about 8M cells
    assert auto.rows_per_chunk(5) == 1_000_000  # at most 1M rows
    assert auto.rows_per_chunk(65) == 200_000  # at least 200k rows, whatever the columns
    assert PrepConfig(chunk_rows=1234).rows_per_chunk(17) == 1234
    # validate's chunks are larger: one GE validation each, with a fixed cost per validation
    assert auto.rows_per_validation(17) == 500_000  # at most 500k rows
    assert auto.rows_per_validation(65) == 492_307  # about 32M cells, where prepare reads 200k rows
    assert auto.rows_per_validation(257) == 200_000
    assert PrepConfig(chunk_rows=1234).rows_per_validation(17) == 1234
    with pytest.raises(ValidationError, match="greater than or equal to 100"):
        PrepConfig(chunk_rows=10)
