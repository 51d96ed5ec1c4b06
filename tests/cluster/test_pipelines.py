"""The example pipelines end to end on a real cluster, through Airflow, as the namespace's ServiceAccount.

digits: mapped data pods, chief + PS + 2 worker pods, evaluate, decide, deploy to the TF Serving Deployment, then a
prediction through its Service (by the API server's service proxy, so any cluster answers it). churn: Parquet,
categoricals, two file groups (two validate and two prepare pods), the same path. After each run nothing of its
training job is left, and every pod of the run carried the small profile's requests.
"""

from __future__ import annotations

import csv
import json
import time
from pathlib import Path

from tests.cluster.conftest import NS, leftovers, trainyard
from tests.run_table import stage_times as ran_times
from trainyard_contract import layout


def stage_times(output: str) -> dict[str, float]:
    times = ran_times(output)
    assert times, output[-3000:]
    return times


def predict_through_service(admin, model: str, port_name: str, instance: dict) -> dict:  # noqa: ANN001
    """POST /v1/models/<model>:predict to the model's Service, through the API server's service proxy."""
    path = f"/api/v1/namespaces/{NS}/services/{model}:{port_name}/proxy/v1/models/{model}:predict"
    response = admin.call_api(path, "POST", header_params={"Content-Type": "application/json"},
                              body={"instances": [instance]}, auth_settings=["BearerToken"],
                              _preload_content=False, _request_timeout=30)
    response = response[0] if isinstance(response, tuple) else response  # (data, status, headers) in older clients
    assert response.status == 200, response.data[:2000]
    return json.loads(response.data)


def run_pipeline(pipeline: str, conf: dict, env: dict[str, str]) -> str:
    started = time.monotonic()
    done = trainyard("run", pipeline, "--conf", json.dumps(conf), env=env)
    output = done.stdout + done.stderr
    assert done.returncode == 0, output[-8000:]
    assert "finished: success" in output
    print(f"\n{pipeline} on the cluster: {time.monotonic() - started:.1f}s; stage times: {stage_times(output)}")
    return output


def test_digits_end_to_end_on_the_cluster(admin, core, apps, seeded: Path, run_env: dict[str, str]) -> None:
    # force_deploy and force_retrain: the volume may already hold a better champion, or one trained on these very
    # inputs with this config (it outlives clusters, as a PVC does), and this test is about the whole path: a run
    # that does not earn the deploy, or has nothing new to train on, would leave no Deployment here
    output = run_pipeline("digits", {"window_days": 5, "steps": 300, "force_deploy": True, "force_retrain": True},
                          run_env)

    times = stage_times(output)
    assert {"validate_data", "prepare_data", "train", "evaluate", "decide"} <= set(times)
    assert "[chief]" in output and "training job finished; worker restarts: 0" in output
    assert "deploy" in times and "skip_deploy" not in times
    assert leftovers(core, {"trainyard/pipeline": "digits", "trainyard/stage": "train"}) == []
    deployment = apps.read_namespaced_deployment(name="digits-serving", namespace=NS)
    assert deployment.status.available_replicas == deployment.spec.replicas == 1
    with (seeded / layout.DATASETS / "digits").glob("date=*/*.csv").__next__().open() as handle:
        row = next(csv.DictReader(handle))
    instance = {name: float(value) for name, value in row.items() if name.startswith("pixel_")}
    answer = predict_through_service(admin, "digits", "rest", instance)
    (prediction,) = answer["predictions"]
    probabilities = prediction["probabilities"]
    assert len(probabilities) == 10 and abs(sum(probabilities) - 1.0) < 1e-3, answer
    assert int(prediction["class_ids"]) == probabilities.index(max(probabilities)), answer


def test_churn_end_to_end_on_the_cluster(core, apps, seeded: Path, run_env: dict[str, str]) -> None:
    output = run_pipeline("churn", {"force_deploy": True, "force_retrain": True}, run_env)

    times = stage_times(output)
    assert {"validate_data [0]", "validate_data [1]", "prepare_data [0]", "prepare_data [1]", "merge_data",
            "train"} <= set(times), times
    assert leftovers(core, {"trainyard/pipeline": "churn", "trainyard/stage": "train"}) == []
    deployment = apps.read_namespaced_deployment(name="churn-serving", namespace=NS)
    assert deployment.status.available_replicas == 1
