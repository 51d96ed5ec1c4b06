"""The cluster suite's shared pieces: the admin client, Airflow's ServiceAccount kubeconfig, the seeded volume.

Runs only when asked (`TRAINYARD_KUBE_TEST=1 KUBECONFIG=... make cluster-test`), against a cluster prepared as the
README's "Run on your cluster" says: images loaded, nodes labelled, `k8s/` applied. `KUBECONFIG` is an admin's:
the suite uses it only to seed data, to look and to break things (delete pods, `kubectl auth can-i`). Every pipeline
run goes through Airflow (`trainyard run`, i.e. `dag.test()`) authenticated as the namespace's ServiceAccount
`trainyard-airflow`, with a token from the TokenRequest API, so the Role in k8s/30-rbac.yaml is what is tested.
The pods ask for what `TRAINYARD_PROFILE=small` gives (a quarter CPU each), so a 2-CPU node runs a whole run.
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import tarfile
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from trainyard_contract import layout

REPO = Path(__file__).resolve().parents[2]
NS = "trainyard"
AIRFLOW_SA = "trainyard-airflow"
PROFILE = os.environ.get("TRAINYARD_PROFILE") or "small"
ENABLED = bool(os.environ.get("TRAINYARD_KUBE_TEST") and os.environ.get("KUBECONFIG"))


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if ENABLED:
        return
    skip = pytest.mark.skip(reason="needs a cluster: set TRAINYARD_KUBE_TEST=1 and KUBECONFIG (make cluster-test)")
    for item in items:
        if "tests/cluster/" in str(item.fspath):
            item.add_marker(skip)


@pytest.fixture(scope="session")
def admin():  # noqa: ANN201 - kubernetes.client.ApiClient
    from kubernetes import config

    return config.new_client_from_config(config_file=os.environ["KUBECONFIG"])


@pytest.fixture(scope="session")
def core(admin):  # noqa: ANN001, ANN201
    from kubernetes import client

    return client.CoreV1Api(admin)


@pytest.fixture(scope="session")
def apps(admin):  # noqa: ANN001, ANN201
    from kubernetes import client

    return client.AppsV1Api(admin)


def service_account_kubeconfig(core, namespace: str, account: str, path: Path) -> Path:  # noqa: ANN001
    """A kubeconfig for `namespace/account`: the admin's cluster entry, a 3-hour TokenRequest token."""
    from kubernetes import client

    request = client.AuthenticationV1TokenRequest(spec=client.V1TokenRequestSpec(audiences=[],
                                                                                 expiration_seconds=3 * 3600))
    token = core.create_namespaced_service_account_token(name=account, namespace=namespace, body=request).status.token
    admin_config = yaml.safe_load(Path(os.environ["KUBECONFIG"]).read_text())
    current = next(c for c in admin_config["contexts"] if c["name"] == admin_config["current-context"])
    cluster = next(c for c in admin_config["clusters"] if c["name"] == current["context"]["cluster"])
    user = f"{namespace}-{account}"
    path.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "clusters": [cluster],
        "users": [{"name": user, "user": {"token": token}}],
        "contexts": [{"name": user, "context": {"cluster": cluster["name"], "user": user, "namespace": namespace}}],
        "current-context": user}))
    return path


@pytest.fixture(scope="session")
def airflow_kubeconfig(core, tmp_path_factory: pytest.TempPathFactory) -> Path:  # noqa: ANN001
    return service_account_kubeconfig(core, NS, AIRFLOW_SA, tmp_path_factory.mktemp("sa") / "airflow.conf")


@pytest.fixture(scope="session")
def run_env(airflow_kubeconfig: Path) -> dict[str, str]:
    """The environment of a `trainyard run` on the cluster: the kubernetes backend, the small profile, and the
    Airflow connection `kubernetes_default` pointing at the ServiceAccount's kubeconfig."""
    connection = {"conn_type": "kubernetes", "extra": {"kube_config_path": str(airflow_kubeconfig)}}
    return {**os.environ, "TRAINYARD_BACKEND": "kubernetes", "TRAINYARD_PROFILE": PROFILE,
            "AIRFLOW_CONN_KUBERNETES_DEFAULT": json.dumps(connection), "PYTHONUNBUFFERED": "1"}


def trainyard(*args: str, env: dict[str, str], timeout: float = 1800) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "trainyard.cli", *args], capture_output=True, text=True,
                          timeout=timeout, env=env, cwd=REPO)


def start_trainyard(*args: str, env: dict[str, str], log: Path) -> subprocess.Popen[str]:
    """`trainyard ...` in the background, its output going to `log` (read while it runs)."""
    out = log.open("w")
    return subprocess.Popen([sys.executable, "-m", "trainyard.cli", *args], stdout=out, stderr=subprocess.STDOUT,
                            text=True, env=env, cwd=REPO, start_new_session=True)


def kubectl(*args: str, check: bool = True, stdin: bytes | None = None) -> subprocess.CompletedProcess[bytes]:
    done = subprocess.run(["kubectl", *args], input=stdin, capture_output=True, timeout=300)
    if check and done.returncode:
        raise AssertionError(f"kubectl {' '.join(args)}: {done.stderr.decode(errors='replace')}")
    return done


def wait_for(what: str, predicate, timeout: float, interval: float = 1.0):  # noqa: ANN001, ANN201
    """Poll `predicate()` until it returns something truthy; fail with `what` after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}")
        time.sleep(interval)


def selector(labels: dict[str, str]) -> str:
    return ",".join(f"{k}={v}" for k, v in sorted(labels.items()))


def leftovers(core, labels: dict[str, str], namespace: str = NS) -> list[str]:  # noqa: ANN001
    """`kubectl get pods,svc -l ...` by a run's labels: what is still there."""
    pods = core.list_namespaced_pod(namespace=namespace, label_selector=selector(labels)).items
    services = core.list_namespaced_service(namespace=namespace, label_selector=selector(labels)).items
    return [f"pod/{p.metadata.name}" for p in pods] + [f"service/{s.metadata.name}" for s in services]


def seed_volume(core, datasets: dict[str, Path], image: str = "trainyard/prep:0.1.0") -> None:  # noqa: ANN001
    """Copy local dataset folders onto the shared volume as `datasets/<name>/`, replacing what was there, through
    a pod that mounts the claim (`tar | kubectl exec -i ... tar -x`): how a user puts data on a PVC too."""
    from trainyard.config.loader import find_pipeline_file, load_pipeline_file
    from trainyard.dag.registry import stage_named
    from trainyard.dag.stages import RunContext, stage_container
    from trainyard.launch.podspec import build_pod

    config = load_pipeline_file(find_pipeline_file(REPO / "pipelines_config", "digits"))
    run = RunContext(pipeline="digits", run_id="cluster-seed")
    spec = stage_container(config, run, stage_named("validate"))
    spec = dataclasses.replace(spec, image=image, command=["python"], args=["-c", "import time; time.sleep(900)"],
                               stage="seed")
    pod = build_pod(config, run, spec, name="trainyard-test-seed")
    pod.spec.active_deadline_seconds = 900
    name = pod.metadata.name
    kubectl("-n", NS, "delete", "pod", name, "--ignore-not-found", "--grace-period=0", "--wait=true")
    core.create_namespaced_pod(namespace=NS, body=pod)
    try:
        wait_for(f"seed pod {name} running", lambda: core.read_namespaced_pod(name, NS).status.phase == "Running",
                 300)
        with tempfile.TemporaryDirectory() as scratch:
            archive = Path(scratch) / "datasets.tar"
            with tarfile.open(archive, "w") as tar:
                for dataset, folder in datasets.items():
                    tar.add(folder, arcname=f"{layout.DATASETS}/{dataset}")
            kubectl("-n", NS, "exec", name, "--", "rm", "-rf", *(f"/data/{layout.DATASETS}/{d}" for d in datasets))
            kubectl("-n", NS, "exec", "-i", name, "--", "tar", "-x", "-C", "/data", stdin=archive.read_bytes())
    finally:
        core.delete_namespaced_pod(name=name, namespace=NS, grace_period_seconds=0)


@pytest.fixture(scope="session")
def seeded(core, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:  # noqa: ANN001
    """digits (CSV, 5 days) and churn (Parquet, 3 days) on the cluster's volume, written by the project's own
    example generator here and copied up once per session."""
    local = tmp_path_factory.mktemp("volume")
    env = {**os.environ, "TRAINYARD_DATA_DIR": str(local)}
    for dataset in ("digits", "churn"):
        done = subprocess.run([sys.executable, "-m", "trainyard.cli", "data", dataset], capture_output=True,
                              text=True, env=env, timeout=300)
        assert done.returncode == 0, done.stdout + done.stderr
    seed_volume(core, {d: local / layout.DATASETS / d for d in ("digits", "churn")})
    yield local
