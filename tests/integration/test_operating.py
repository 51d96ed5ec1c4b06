"""Operating pipelines on real Airflow services (PostgreSQL, api-server, scheduler, dag-processor, triggerer):
a scheduled run, a REST trigger with overrides, refused overrides, a 3-day CLI backfill, data-aware scheduling,
and the trigger form in a real browser. Every run is the real pipeline on the local backend.

The tests share one set of services (module scope) and run in file order: the scheduled run deploys the first
model, the forced REST trigger the second, and the backfill's older windows must then leave both in place.
"""

from __future__ import annotations

import datetime as dt
import json
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.integration.airflow_services import AirflowServices, running_pipelines, wait_for
from tests.integration.serving_helpers import Server
from tests.integration.stream_helpers import RedisServer, produce
from trainyard_contract import layout
from trainyard_contract.airflow_api import ApiError
from trainyard_contract.layout import published_versions, run_key

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
TODAY = dt.datetime.now(dt.UTC).date()
MIDNIGHT = dt.datetime.combine(TODAY, dt.time(), tzinfo=dt.UTC)
ARTIFACTS = REPO / "test-artifacts"

# A fast retraining pipeline: single-process training on a two-day window, daily schedule.
RETRAIN = f"""
name: retrain
description: Daily retraining on the last two days of digits (integration test).
schedule: "@daily"
start_date: {TODAY - dt.timedelta(days=10)}
catchup: false
max_active_runs: 1
retries: 0
data:
  source: datasets/digits
  window: {{days: 2}}
  label: {{name: digit, classes: [0, 1, 2, 3, 4, 5, 6, 7, 8, 9]}}
  features: [{{name: "pixel_{{i}}", count: 64, min: 0, max: 16}}]
  expectations: {{min_rows: 100}}
  shards: {{train: 2, eval: 1}}
training:
  strategy: single
  ps: {{replicas: 0}}
  workers: {{replicas: 0}}
  steps: 60
  learning_rate: 0.05
evaluation:
  metrics: [accuracy, loss]
  thresholds: {{accuracy: {{min: 0.3}}}}
  change_threshold: {{metric: accuracy, min_delta: 0.0}}
"""
# The same model trained whenever new data is registered for the dataset (an Airflow Asset), its data stages
# fanned out over two groups (mapped tasks under the real scheduler and LocalExecutor). An asset-triggered run's
# window ends when it is triggered, so three days hold two whole daily files: one per group.
ONDATA = RETRAIN.replace("name: retrain", "name: ondata").replace(
    'schedule: "@daily"', "schedule: {asset: datasets/digits}").replace(
    "window: {days: 2}", "window: {days: 3}") + "prep: {parallelism: 2}\n"


class Deployment:
    """What the tests see: the services, the volume and the model server."""

    def __init__(self, services: AirflowServices, volume: Path, server: Server):
        self.services, self.volume, self.server = services, volume, server
        self.api = services.api

    def run_dir(self, dag_id: str, run_id: str) -> Path:
        return self.volume / layout.RUNS / dag_id / run_key(run_id)

    def read(self, dag_id: str, run_id: str, relative: str) -> Any:
        return json.loads((self.run_dir(dag_id, run_id) / relative).read_text())

    def assert_success(self, dag_id: str, run: dict[str, Any]) -> None:
        if run["state"] != "success":
            failed = [ti["task_id"] for ti in self.api.task_instances(dag_id, run["dag_run_id"])
                      if ti["state"] not in ("success", "skipped")]
            logs = "\n".join(self.services.task_log(dag_id, run["dag_run_id"], t)[-4000:] for t in failed)
            pytest.fail(f"run {run['dag_run_id']} of {dag_id} ended {run['state']}; failed tasks {failed}:\n{logs}")


def ondata_stream(broker: str) -> str:
    """ondata's stream section: labelled digits events landed as today's partition of datasets/digits."""
    return f"""
stream:
  broker: {broker}
  source: ondata:events
  sink: ondata:scores
  dead_letter: ondata:dead
  land: {{source: ondata:labelled, dead_letter: ondata:labelled-dead, max_rows: 1000, max_seconds: 1}}
"""


@pytest.fixture(scope="module")
def deployment(tmp_path_factory: pytest.TempPathFactory, redis_server: RedisServer) -> Iterator[Deployment]:
    configs = {"digits": (REPO / "pipelines_config" / "digits.yaml").read_text(), "retrain": RETRAIN,
               "ondata": ONDATA + ondata_stream(redis_server.url)}
    # eight daily partitions ending yesterday: every backfill day below has its own two-day window
    with running_pipelines(tmp_path_factory.mktemp("operating"), configs, data_days=8) as (services, volume, server):
        yield Deployment(services, volume, server)


def test_pools_exist_for_the_train_and_deploy_steps(deployment: Deployment) -> None:
    pools = {p["name"]: p for p in deployment.api.call("GET", "/pools")["pools"]}
    assert pools["trainyard_training"]["slots"] == 1 and pools["trainyard_deploy"]["slots"] == 1
    assert pools["trainyard_training"]["description"] == "Trainyard: digits.train, ondata.train, retrain.train"
    tasks = {t["task_id"]: t for t in deployment.api.call("GET", "/dags/retrain/tasks")["tasks"]}
    assert tasks["train"]["pool"] == "trainyard_training" and tasks["deploy"]["pool"] == "trainyard_deploy"
    assert tasks["validate_data"]["pool"] == "default_pool"


def test_a_scheduled_run_fires_when_the_dag_is_unpaused(deployment: Deployment) -> None:
    api = deployment.api
    api.set_paused("retrain", False)
    run = wait_for("the scheduler to create the scheduled run", lambda: api.dag_runs("retrain"), 120, every=1.0)[0]
    assert run["run_type"] == "scheduled"
    assert run["data_interval_end"].startswith(TODAY.isoformat())  # catchup off: only the latest interval
    run = deployment.services.wait_run("retrain", run["dag_run_id"])
    deployment.assert_success("retrain", run)
    inputs = deployment.read("retrain", run["dag_run_id"], layout.INPUTS_MANIFEST)
    assert dt.datetime.fromisoformat(inputs["window_end"]) == MIDNIGHT
    assert inputs["partitions"] == [(TODAY - dt.timedelta(days=d)).isoformat() for d in (2, 1)]
    assert inputs["trigger"]["run_type"] == "scheduled" and inputs["trigger"]["params"]["steps"] == 60
    decision = deployment.read("retrain", run["dag_run_id"], layout.DECISION)
    assert decision["deploy"] is True and decision["champion"] is None
    assert published_versions(deployment.volume / layout.MODELS / "retrain") == [1]


def test_a_trigger_with_overrides_through_the_rest_api(deployment: Deployment) -> None:
    api = deployment.api
    conf = {"steps": 25, "learning_rate": 0.1, "batch_size": 32, "force_deploy": True}
    run = api.trigger("retrain", conf, run_id="api-override-1")
    assert run["state"] == "queued" and run["conf"] == conf
    run = deployment.services.wait_run("retrain", "api-override-1")
    deployment.assert_success("retrain", run)
    training = deployment.read("retrain", "api-override-1", layout.TRAINING_RECORD)
    assert (training["steps"], training["batch_size"]) == (25, 32)
    trigger = deployment.read("retrain", "api-override-1", layout.INPUTS_MANIFEST)["trigger"]
    assert trigger["run_type"] == "manual"
    assert {k: trigger["params"][k] for k in conf} == conf
    decision = deployment.read("retrain", "api-override-1", layout.DECISION)
    assert decision["deploy"] is True and decision["forced"] is True
    # version 2 carries the overrides in its lineage
    published = json.loads((deployment.volume / layout.MODELS / "retrain" / "2" / layout.VERSION_METADATA).read_text())
    assert published["run_id"] == "api-override-1" and published["trigger"]["params"]["steps"] == 25


@pytest.mark.parametrize(("conf", "names"), [
    ({"steps": 0}, "steps"),
    ({"learning_rate": -1}, "learning_rate"),
    ({"workers": 2}, "workers"),   # single-process training: the config allows 0 workers
    ({"batch_size": "many"}, "batch_size"),
])
def test_invalid_overrides_are_refused_with_a_message(deployment: Deployment, conf: dict, names: str) -> None:
    before = len(deployment.api.dag_runs("retrain"))
    with pytest.raises(ApiError) as refused:
        deployment.api.trigger("retrain", conf)
    assert refused.value.status == 400
    assert f"Invalid input for param {names}" in str(refused.value.detail)
    assert len(deployment.api.dag_runs("retrain")) == before


def test_a_failed_run_leaves_nothing_behind_for_the_next_ones(deployment: Deployment) -> None:
    # a run for a day before any data exists (but after start_date, or Airflow schedules no task in it):
    # validate_data fails as bad input, and is not retried
    api = deployment.api
    served = published_versions(deployment.volume / layout.MODELS / "retrain")
    api.trigger("retrain", {}, run_id="before-the-data", logical_date=f"{TODAY - dt.timedelta(days=9)}T00:00:00Z")
    run = deployment.services.wait_run("retrain", "before-the-data")
    assert run["state"] == "failed"
    tasks = {t["task_id"]: t for t in api.task_instances("retrain", "before-the-data")}
    assert tasks["validate_data"]["state"] == "failed" and tasks["validate_data"]["try_number"] == 1
    assert tasks["train"]["state"] == "upstream_failed"
    log = deployment.services.task_log("retrain", "before-the-data", "validate_data")
    assert "no partitions of datasets/digits in the run's window" in log
    # nothing half-written: no pinned inputs, no model, and the served versions are untouched
    run_dir = deployment.run_dir("retrain", "before-the-data")
    assert not (run_dir / layout.INPUTS_MANIFEST).exists() and not (run_dir / layout.MODEL).exists()
    assert published_versions(deployment.volume / layout.MODELS / "retrain") == served


def test_a_three_day_backfill_never_replaces_the_newer_model(deployment: Deployment) -> None:
    first, last = TODAY - dt.timedelta(days=5), TODAY - dt.timedelta(days=3)
    done = deployment.services.airflow("backfill", "create", "--dag-id", "retrain", "--from-date", first.isoformat(),
                                       "--to-date", last.isoformat())
    assert "backfill" in (done.stdout + done.stderr).lower()
    api = deployment.api

    def backfill_runs() -> list[dict[str, Any]]:
        runs = [r for r in api.dag_runs("retrain") if r["run_type"] == "backfill"]
        return runs if len(runs) == 3 and all(r["state"] in ("success", "failed") for r in runs) else []

    runs = wait_for("the three backfill runs to end", backfill_runs, 900, every=2.0,
                    logs=[deployment.services.log("scheduler")])
    for run in runs:
        deployment.assert_success("retrain", run)
    by_day = {dt.datetime.fromisoformat(r["logical_date"]).date(): r["dag_run_id"] for r in runs}
    assert sorted(by_day) == [first, first + dt.timedelta(days=1), last]
    for day, run_id in by_day.items():
        # each run trained on its own window: the two days before its data interval end, which Airflow 3's
        # cron schedules (CronTriggerTimetable) put at the logical date
        inputs = deployment.read("retrain", run_id, layout.INPUTS_MANIFEST)
        assert dt.datetime.fromisoformat(inputs["window_end"]).date() == day
        assert inputs["partitions"] == [(day - dt.timedelta(days=d)).isoformat() for d in (2, 1)]
        decision = deployment.read("retrain", run_id, layout.DECISION)
        assert decision["deploy"] is False and decision["data_window_end"]["older_than_champion"] is True
        assert "older than champion v2" in decision["reasons"][0]
        tasks = {t["task_id"]: t["state"] for t in api.task_instances("retrain", run_id)}
        assert tasks["skip_deploy"] == "success" and tasks["deploy"] == "skipped"
    assert published_versions(deployment.volume / layout.MODELS / "retrain") == [1, 2]
    # backfill runs may run side by side (the backfill's own max_active_runs), but the training pool (one slot)
    # admitted one training job at a time
    trains = sorted((dt.datetime.fromisoformat(t["start_date"]), dt.datetime.fromisoformat(t["end_date"]))
                    for r in runs for t in api.task_instances("retrain", r["dag_run_id"]) if t["task_id"] == "train")
    assert all(later[0] >= earlier[1] for earlier, later in zip(trains, trains[1:], strict=False))


def test_registering_new_data_starts_the_asset_scheduled_pipeline(deployment: Deployment) -> None:
    api = deployment.api
    api.set_paused("ondata", False)
    assert api.dag_runs("ondata") == []  # no schedule fires without data
    marked = deployment.services.trainyard("mark-data", "ondata", "--partition", TODAY.isoformat())
    assert marked.returncode == 0, marked.stderr
    assert "trainyard://volume/datasets/digits" in marked.stdout
    run = wait_for("the asset-triggered run", lambda: api.dag_runs("ondata"), 120, every=1.0)[0]
    assert run["run_type"] == "asset_triggered"
    run = deployment.services.wait_run("ondata", run["dag_run_id"])
    deployment.assert_success("ondata", run)
    assert published_versions(deployment.volume / layout.MODELS / "ondata") == [1]
    data_tasks = sorted((t["task_id"], t["map_index"], t["rendered_map_index"], t["state"]) for t in api.task_instances(
        "ondata", run["dag_run_id"]) if t["task_id"] in ("pin_inputs", "validate_data", "prepare_data", "merge_data"))
    assert len(deployment.read("ondata", run["dag_run_id"], layout.INPUTS_MANIFEST)["files"]) == 2
    assert data_tasks == [("merge_data", -1, None, "success"), ("pin_inputs", -1, None, "success"),
                          ("prepare_data", 0, "file group 0", "success"),
                          ("prepare_data", 1, "file group 1", "success"),
                          ("validate_data", 0, "file group 0", "success"),
                          ("validate_data", 1, "file group 1", "success")]


def test_a_landed_stream_partition_starts_the_asset_scheduled_pipeline(deployment: Deployment,
                                                                       redis_server: RedisServer) -> None:
    """The lander (started by `trainyard stream`) writes today's partition from labelled events and registers
    ondata's asset event: Airflow starts a run, and that run reads the landed file. The scorer beside it scores
    events through the model the first ondata run deployed."""
    import csv

    api = deployment.api
    before = {run["dag_run_id"] for run in api.dag_runs("ondata")}
    assert before, "test_registering_new_data_starts_the_asset_scheduled_pipeline runs first (ondata is served)"
    yesterday = deployment.volume / layout.DATASETS / "digits" / f"date={TODAY - dt.timedelta(days=1)}"
    with next(yesterday.glob("*.csv")).open() as handle:  # a day of digits: about 220 rows
        rows = [{name: float(value) if name != "digit" else int(value) for name, value in row.items()}
                for row in csv.DictReader(handle)]
    assert len(rows) > 100
    client = redis_server.client()
    produce(client, "ondata:labelled", [{**row, "key": f"d{index}"} for index, row in enumerate(rows)])
    produce(client, "ondata:events", [{**{k: v for k, v in row.items() if k != "digit"}, "key": f"s{index}"}
                                      for index, row in enumerate(rows[:50])])
    started = deployment.services.trainyard("stream", "ondata", "--background")
    assert started.returncode == 0, started.stdout + started.stderr
    try:
        run = wait_for("the run the landed partition starts",
                       lambda: [r for r in api.dag_runs("ondata") if r["dag_run_id"] not in before], 120,
                       every=1.0)[0]
        assert run["run_type"] == "asset_triggered"
        wait_for("50 scores", lambda: client.xlen("ondata:scores") == 50, 60, every=0.5)
    finally:
        stopped = deployment.services.trainyard("stream", "ondata", "--stop")
    assert stopped.returncode == 0 and "ondata land stopped" in stopped.stdout, stopped.stdout + stopped.stderr
    landed = sorted((deployment.volume / layout.DATASETS / "digits" / f"date={TODAY}").glob("part-*.csv"))
    assert len(landed) == 1, landed
    run = deployment.services.wait_run("ondata", run["dag_run_id"])
    deployment.assert_success("ondata", run)
    files = deployment.read("ondata", run["dag_run_id"], layout.INPUTS_MANIFEST)["files"]
    assert any(landed[0].name in json.dumps(entry) for entry in files), files
    scores = [json.loads(fields["data"]) for _, fields in client.xrange("ondata:scores")]
    assert {s["model"] for s in scores} == {"ondata"} and all(s["version"] >= 1 for s in scores)
    events = api.call("GET", "/assets/events", limit=100)["asset_events"]
    assert any(e["extra"].get("source") == "trainyard stream land" and e["extra"].get("rows") == len(rows)
               for e in events), events


def test_mark_data_refuses_a_pipeline_not_scheduled_on_data(deployment: Deployment) -> None:
    refused = deployment.services.trainyard("mark-data", "retrain")
    assert refused.returncode == 2
    assert "not scheduled on data" in refused.stderr and "schedule: {asset: datasets/digits}" in refused.stderr


CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync"]


def test_the_trigger_form_in_a_real_browser_bounds_values_and_starts_a_run(deployment: Deployment) -> None:
    """Debian's Chromium, headless, driven by Playwright: the example DAG's trigger form, one Param set."""
    from playwright.sync_api import expect, sync_playwright

    ARTIFACTS.mkdir(exist_ok=True)
    api = deployment.api
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=shutil.which("chromium") or "/usr/bin/chromium",
                                             args=CHROMIUM_ARGS, headless=True)
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 1100})
            page.goto(f"{deployment.services.base_url}/dags/digits", wait_until="networkidle")
            page.get_by_role("button", name="Trigger").first.click()
            dialog = page.get_by_role("dialog")
            expect(dialog.get_by_text("Trigger Dag - digits")).to_be_visible()
            # one field per Param, titled and described from the config
            for title in ("Training steps", "Learning rate", "Batch size (per worker)", "Worker replicas",
                          "Parameter server replicas", "Data window (days)"):
                expect(dialog.get_by_role("spinbutton", name=title)).to_be_visible()
            expect(dialog.get_by_role("checkbox", name="Force deploy")).to_be_visible()
            expect(dialog.get_by_text("Up to workers.max_replicas (4) from the config.")).to_be_visible()
            steps = dialog.get_by_role("spinbutton", name="Training steps")
            expect(steps).to_have_value("300")  # the config's value is the default
            # more workers than the config's max_replicas: the form clamps the value to the Param's maximum (a
            # value outside the schema never leaves the form; the API refuses one sent directly, tested above)
            workers = dialog.get_by_role("spinbutton", name="Worker replicas")
            workers.fill("9")
            workers.press("Tab")
            expect(workers).to_have_value("4")
            page.screenshot(path=str(ARTIFACTS / "trigger-form-clamped.png"), full_page=True)
            assert api.dag_runs("digits") == []
            workers.fill("2")
            steps.fill("40")
            steps.press("Tab")
            dialog.screenshot(path=str(ARTIFACTS / "trigger-form-filled.png"))
            dialog.get_by_role("button", name="Trigger").click()
            # the UI may render its toast twice for a moment (two equal elements): any one of them will do
            expect(page.get_by_text("Dag Run Triggered").first).to_be_visible(timeout=15_000)
            page.screenshot(path=str(ARTIFACTS / "trigger-form-triggered.png"), full_page=True)
        finally:
            browser.close()
    runs = wait_for("the run started from the form", lambda: api.dag_runs("digits"), 30)
    assert len(runs) == 1 and runs[0]["conf"]["steps"] == 40 and runs[0]["run_type"] == "manual"
    run = deployment.services.wait_run("digits", runs[0]["dag_run_id"])
    deployment.assert_success("digits", run)
    # the value set in the form reached the training job (parameter servers and two workers)
    training = deployment.read("digits", run["dag_run_id"], layout.TRAINING_RECORD)
    assert (training["steps"], training["workers"], training["strategy"]) == (40, 2, "parameter_server")
    assert all((ARTIFACTS / f"trigger-form-{n}.png").stat().st_size > 10_000 for n in ("clamped", "filled",
                                                                                      "triggered"))
