"""The `stream:` section: schema errors that name the file, line and field; the scorer's and lander's Deployments as
the deploy step applies them; an event's checks before it reaches the model or the files."""

from __future__ import annotations

import json
import re
from pathlib import Path
from unittest.mock import call, create_autospec

import kubernetes_validate
import pytest
from kubernetes.client import AppsV1Api
from kubernetes.client.exceptions import ApiException

from tests.unit.k8s_fakes import FakeCluster
from tests.unit.test_kubernetes_backend import LOG, NS, launcher
from tests.unit.test_render import K8S_VERSION, RUN_ID, assert_restricted
from trainyard.cli import main as cli
from trainyard.config.loader import ConfigError, load_pipeline_file
from trainyard.launch.render import render_run
from trainyard.launch.stream_spec import build_stream_deployments
from trainyard_stream.records import EventSchema, Refused

STREAM = """
stream:
  broker: redis://redis.streams.svc:6379/0
  password: {env: REDIS_PASSWORD, secret: redis, key: password}
  source: churn:events
  sink: churn:scores
  dead_letter: churn:dead
  replicas: 3
  land:
    source: churn:labelled
    dead_letter: churn:labelled-dead
    max_rows: 10000
"""


def churn_with(pipelines_dir: Path, section: str) -> Path:
    path = pipelines_dir / "churn.yaml"
    path.write_text(path.read_text() + section)
    return path


def error_lines(path: Path) -> list[str]:
    with pytest.raises(ConfigError) as info:
        load_pipeline_file(path)
    return info.value.lines


def test_a_stream_section_loads(pipelines_dir: Path) -> None:
    config = load_pipeline_file(churn_with(pipelines_dir, STREAM))
    assert config.stream is not None and config.stream.land is not None
    assert config.stream.group == "trainyard-score" and config.stream.batch.max_records == 64
    assert config.stream.land.max_rows == 10000 and config.stream.land.group == "trainyard-land"


@pytest.mark.parametrize(("change", "field", "words"), [
    (("redis://redis.streams.svc:6379/0", "redis://user:secret@redis:6379/0"), "stream.broker",
     "must not carry credentials"),
    (("redis://redis.streams.svc:6379/0", "kafka://broker:9092"), "stream.broker", "must be redis://host"),
    (("sink: churn:scores", "sink: churn:events"), "stream.sink", "is also source"),
    (("replicas: 3", "replicas: 0"), "stream.replicas", "must be ≥ 1 (got 0)"),
    (("max_rows: 10000", "max_rows: 10000\n    flush: 5"), "stream.land.flush",
     "unknown field; known fields: airflow_api_url"),
    (("dead_letter: churn:labelled-dead", "dead_letter: churn:dead\n    source2: x"), "stream.land.source2", ""),
])
def test_a_bad_stream_section_names_the_file_line_and_field(pipelines_dir: Path, change: tuple[str, str],
                                                            field: str, words: str) -> None:
    path = churn_with(pipelines_dir, STREAM.replace(*change))
    lines = error_lines(path)
    assert len(lines) == 1, lines
    line_number = next(i for i, text in enumerate(path.read_text().splitlines(), 1)
                       if text.strip().startswith(field.rsplit(".", 1)[1] + ":"))
    assert lines[0].startswith(f"{path.name}:{line_number}:") or f"churn.yaml:{line_number}:" in lines[0], lines
    assert f" {field}: " in lines[0] and words in lines[0], lines


def test_the_deploy_step_renders_a_scorer_and_a_lander_deployment(pipelines_dir: Path) -> None:
    config = load_pipeline_file(churn_with(pipelines_dir, STREAM))
    manifests = render_run(config, RUN_ID)
    deployments = {m["metadata"]["name"]: m for m in manifests if m["kind"] == "Deployment"}
    assert sorted(deployments) == ["churn-serving", "churn-stream-land", "churn-stream-score"]
    for name in ("churn-stream-land", "churn-stream-score"):
        kubernetes_validate.validate(deployments[name], K8S_VERSION, strict=True)
        assert_restricted(deployments[name]["spec"]["template"]["spec"], name)
    score = deployments["churn-stream-score"]
    pod = score["spec"]["template"]["spec"]
    container = pod["containers"][0]
    assert score["spec"]["replicas"] == 3 and container["image"] == "trainyard/stream:0.1.0"
    assert container["args"] == ["score", "--endpoint", "churn.trainyard.svc:8500"]
    assert pod["nodeSelector"] == {"trainyard.io/cpu-pool": "true"}
    env = {e["name"]: e for e in container["env"]}
    assert env["REDIS_PASSWORD"] == {"name": "REDIS_PASSWORD", "valueFrom": {"secretKeyRef": {
        "name": "redis", "key": "password"}}}
    assert json.loads(env["TRAINYARD_CONFIG_JSON"]["value"])["stream"]["source"] == "churn:events"
    assert [v["name"] for v in pod["volumes"]] == ["scratch"]  # the scorer has no volume
    land = deployments["churn-stream-land"]
    assert land["spec"]["replicas"] == 1 and land["spec"]["strategy"] == {"type": "Recreate"}
    land_container = land["spec"]["template"]["spec"]["containers"][0]
    assert land_container["args"] == ["land", "--volume", "/data"]
    data = next(m for m in land_container["volumeMounts"] if m["mountPath"] == "/data")
    assert not data.get("readOnly")


def test_no_stream_section_no_stream_deployment(pipelines_dir: Path) -> None:
    assert build_stream_deployments(load_pipeline_file(pipelines_dir / "churn.yaml")) == []


def test_the_deploy_step_creates_the_stream_deployments_beside_serving(pipelines_dir: Path) -> None:
    config = load_pipeline_file(churn_with(pipelines_dir, STREAM))
    fake = FakeCluster()
    apps = create_autospec(AppsV1Api, instance=True)
    apps.read_namespaced_deployment.side_effect = ApiException(status=404, reason="NotFound")
    fake.core.read_namespaced_service.side_effect = ApiException(status=404, reason="NotFound")
    launcher(config, fake, apps).ensure_serving(config, LOG)
    created = [c.kwargs["body"].metadata.name for c in apps.create_namespaced_deployment.call_args_list]
    assert created == ["churn-serving", "churn-stream-score", "churn-stream-land"]
    scorer = build_stream_deployments(config)[0]
    assert call(namespace=NS, body=scorer) in apps.create_namespaced_deployment.call_args_list


def test_trainyard_stream_refuses_a_pipeline_without_a_stream_section(pipelines_dir: Path,
                                                                      capsys: pytest.CaptureFixture[str]) -> None:
    assert cli(["stream", "churn"]) == 2
    assert "has no `stream:` section" in capsys.readouterr().err


@pytest.fixture
def scorer_schema(pipelines_dir: Path) -> EventSchema:
    return EventSchema(load_pipeline_file(churn_with(pipelines_dir, STREAM)), "key", labelled=False)


GOOD = {"key": 7, "plan": "pro", "country": "NZ", "device": 2, "tenure_months": 12, "support_calls": 0,
        "monthly_spend": None}


def fields(event: object) -> dict[str, str]:
    return {"data": event if isinstance(event, str) else json.dumps(event)}


def test_a_good_event_is_parsed_with_its_key_as_text(scorer_schema: EventSchema) -> None:
    event = scorer_schema.parse(fields({**GOOD, "extra": "ignored"}))
    assert event.key == "7" and event.values["monthly_spend"] is None and "extra" not in event.values
    assert scorer_schema.parse(fields({**GOOD, "tenure_months": 12.0})).values["tenure_months"] == 12


@pytest.mark.parametrize(("event", "reason"), [
    ("[1]", "not a JSON object but list"),
    ("{", "not JSON"),
    ({**GOOD, "key": ""}, "no key"),
    ({**GOOD, "key": [1]}, "no key"),
    ({k: v for k, v in GOOD.items() if k != "plan"}, "feature 'plan' is missing"),
    ({**GOOD, "plan": 3}, "feature 'plan' must be text"),
    ({**GOOD, "device": "2"}, "feature 'device' must be a number (int)"),
    ({**GOOD, "device": 2.5}, "feature 'device' must be an integer"),
    ({**GOOD, "tenure_months": True}, "feature 'tenure_months' must be a number"),
    ({**GOOD, "tenure_months": None}, "feature 'tenure_months' is null"),
    ('{"key": 1, "plan": "pro", "country": "NZ", "device": 1, "tenure_months": 1, "support_calls": 0, '
     '"monthly_spend": Infinity}', "not JSON"),  # strict JSON has no Infinity or NaN
    ({**GOOD, "monthly_spend": 1e400}, "not JSON"),  # json.dumps writes Infinity for it
])
def test_an_event_that_cannot_be_scored_is_refused_with_the_reason(scorer_schema: EventSchema, event: object,
                                                                   reason: str) -> None:
    with pytest.raises(Refused, match=re.escape(reason)):
        scorer_schema.parse(fields(event))


def test_an_entry_without_the_data_field_is_refused(scorer_schema: EventSchema) -> None:
    with pytest.raises(Refused, match="has no 'data' field"):
        scorer_schema.parse({"payload": "{}"})


def test_the_scorer_leaves_ranges_to_the_model_and_the_lander_does_not(pipelines_dir: Path) -> None:
    config = load_pipeline_file(churn_with(pipelines_dir, STREAM))
    unseen = {**GOOD, "plan": "platinum", "tenure_months": 900, "churned": "stay"}
    assert EventSchema(config, "key", labelled=False).parse(fields(unseen)).values["plan"] == "platinum"
    lander = EventSchema(config, "key", labelled=True)
    with pytest.raises(Refused, match="'platinum' is not one of the allowed values"):
        lander.parse(fields(unseen))
    with pytest.raises(Refused, match="900 is above its max 600"):
        lander.parse(fields({**unseen, "plan": "pro"}))
    with pytest.raises(Refused, match="label 'churned' is missing"):
        lander.parse(fields(GOOD))
    with pytest.raises(Refused, match="'maybe' is not one of the classes"):
        lander.parse(fields({**GOOD, "churned": "maybe"}))
    assert lander.parse(fields({**GOOD, "churned": "churn"})).values["churned"] == "churn"
    with pytest.raises(Refused, match="1 is not one of the classes"):
        lander.parse(fields({**GOOD, "churned": 1}))  # a string label's classes are text


def test_an_int_label_takes_a_whole_float_and_refuses_text(pipelines_dir: Path) -> None:
    config = load_pipeline_file(pipelines_dir / "digits.yaml")
    document = json.loads(config.model_dump_json())
    document["stream"] = {"broker": "redis://127.0.0.1:6379/0", "source": "s", "sink": "r", "dead_letter": "d"}
    lander = EventSchema(type(config).model_validate(document), "key", labelled=True)
    row = {"key": "k", **{f"pixel_{i}": 0.0 for i in range(64)}}
    assert lander.parse(fields({**row, "digit": 3.0})).values["digit"] == 3
    with pytest.raises(Refused, match="'3' is not one of the classes"):
        lander.parse(fields({**row, "digit": "3"}))
