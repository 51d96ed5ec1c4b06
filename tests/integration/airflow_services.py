"""Real Airflow services for the operating tests and the scheduling benchmark.

A PostgreSQL server (Debian's binaries, `scripts/install-test-services.sh`) on a free 127.0.0.1 port in its own
folder, and Airflow's api-server, scheduler, dag-processor and triggerer against it with LocalExecutor and a
parallelism fit for 2 cores. Everything started here is stopped by `stop()`, process group by process group.
SQLite stays the embedded default of `make demo`; this is what a deployment runs.
"""

from __future__ import annotations

import glob
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from tests.integration.serving_helpers import Server, free_port
from trainyard_contract import layout
from trainyard_contract.airflow_api import AirflowApi, ApiError, get_token

REPO = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
SERVICES = ("api-server", "scheduler", "dag-processor", "triggerer")


def wait_for(what: str, check: Any, timeout: float, every: float = 0.5, logs: list[Path] | None = None) -> Any:
    """Poll `check()` until it returns something truthy; bounded, and says what it waited for."""
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        try:
            last = check()
        except (OSError, ApiError) as exc:
            last = exc
        else:
            if last:
                return last
        time.sleep(every)
    tails = "".join(f"\n--- {p.name}\n{p.read_text(errors='replace')[-3000:]}" for p in logs or [] if p.is_file())
    raise TimeoutError(f"timed out after {timeout:.0f} s waiting for {what} (last: {last!r}){tails}")


class Postgres:
    """A throwaway PostgreSQL server: initdb into a fresh folder, trust auth on 127.0.0.1 only."""

    def __init__(self) -> None:
        found = sorted(glob.glob("/usr/lib/postgresql/*/bin/postgres"))
        if not found:
            raise RuntimeError("PostgreSQL is not installed: run scripts/install-test-services.sh (make test does)")
        self.bin = Path(found[-1]).parent
        self.port = free_port()
        # under /tmp with a traversable path: as root, the server runs as the `postgres` user
        self.root = Path(tempfile.mkdtemp(prefix="trainyard-pg-"))
        self.data: Path | None = None

    def _as_server_user(self, argv: list[str]) -> list[str]:
        return ["runuser", "-u", "postgres", "--", *argv] if os.geteuid() == 0 else argv

    @property
    def url(self) -> str:
        return f"postgresql+psycopg2://postgres@127.0.0.1:{self.port}/airflow"

    def start(self) -> Postgres:
        self.root.chmod(0o755)
        data = self.root / "data"
        data.mkdir()
        if os.geteuid() == 0:
            shutil.chown(self.root, "postgres")
            shutil.chown(data, "postgres")
        subprocess.run(self._as_server_user([str(self.bin / "initdb"), "-D", str(data), "-U", "postgres",
                                             "--auth=trust", "-E", "UTF8", "--no-sync"]),
                       check=True, capture_output=True)
        options = (f"-p {self.port} -c listen_addresses=127.0.0.1 -c unix_socket_directories={self.root} "
                   "-c fsync=off -c max_connections=200")
        started = subprocess.run(self._as_server_user([str(self.bin / "pg_ctl"), "-D", str(data), "-l",
                                                       str(self.root / "postgres.log"), "-o", options, "-w",
                                                       "-t", "60", "start"]), capture_output=True, text=True)
        if started.returncode != 0:
            raise RuntimeError(f"PostgreSQL did not start: {started.stdout}{started.stderr}"
                               f"{(self.root / 'postgres.log').read_text(errors='replace')[-2000:]}")
        self.data = data
        subprocess.run([str(self.bin / "createdb"), "-h", "127.0.0.1", "-p", str(self.port), "-U", "postgres",
                        "airflow"], check=True, capture_output=True)
        return self

    def stop(self) -> None:
        if self.data is not None:
            subprocess.run(self._as_server_user([str(self.bin / "pg_ctl"), "-D", str(self.data), "-m", "fast",
                                                 "-w", "-t", "30", "stop"]), capture_output=True)
            self.data = None
        shutil.rmtree(self.root, ignore_errors=True)


def airflow_cfg(home: Path, dags: Path, db_url: str, port: int) -> str:
    return f"""[core]
dags_folder = {dags}
plugins_folder = {REPO / "plugins"}
load_examples = False
executor = LocalExecutor
parallelism = 2
max_active_tasks_per_dag = 2
dagbag_import_timeout = 90
auth_manager = airflow.api_fastapi.auth.managers.simple.simple_auth_manager.SimpleAuthManager
simple_auth_manager_all_admins = True
simple_auth_manager_passwords_file = {home / "passwords.json"}
execution_api_server_url = http://127.0.0.1:{port}/execution/

[database]
sql_alchemy_conn = {db_url}

[api]
host = 127.0.0.1
port = {port}
workers = 1
base_url = http://127.0.0.1:{port}

[api_auth]
jwt_secret = {secrets.token_hex(16)}

[dag_processor]
refresh_interval = 5
min_file_process_interval = 10
parsing_processes = 1

[scheduler]
enable_health_check = True
scheduler_health_check_server_port = {free_port()}

[triggerer]
capacity = 10

[logging]
base_log_folder = {home / "logs"}
"""


class AirflowServices:
    """Airflow 3's four services over one AIRFLOW_HOME; `env` is what tasks see too (TRAINYARD_*)."""

    def __init__(self, home: Path, dags: Path, db_url: str, env: dict[str, str]):
        self.home = home
        self.dags = dags
        self.port = free_port()
        self.base_url = f"http://127.0.0.1:{self.port}"
        self.env = {**os.environ, **env, "AIRFLOW_HOME": str(home), "AIRFLOW_API_URL": self.base_url,
                    "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}"}
        for key in [k for k in self.env if k.startswith("AIRFLOW__")]:
            del self.env[key]  # the cfg file below is the whole configuration
        self.db_url = db_url
        self.processes: dict[str, subprocess.Popen[bytes]] = {}
        self._api: AirflowApi | None = None

    def log(self, service: str) -> Path:
        return self.home / f"{service}.log"

    def command(self, program: str, *args: str, timeout: float, check: bool) -> subprocess.CompletedProcess[str]:
        """Run a venv command (`airflow`, `trainyard`) with the services' environment."""
        done = subprocess.run([str(BIN / program), *args], env=self.env, capture_output=True, text=True,
                              timeout=timeout)
        if check and done.returncode != 0:
            raise RuntimeError(f"{program} {' '.join(args)} failed ({done.returncode}):\n{done.stdout[-3000:]}\n"
                               f"{done.stderr[-3000:]}")
        return done

    def airflow(self, *args: str, timeout: float = 300, check: bool = True) -> subprocess.CompletedProcess[str]:
        return self.command("airflow", *args, timeout=timeout, check=check)

    def trainyard(self, *args: str, timeout: float = 120, check: bool = False) -> subprocess.CompletedProcess[str]:
        return self.command("trainyard", *args, timeout=timeout, check=check)

    def start(self) -> AirflowServices:
        self.home.mkdir(parents=True, exist_ok=True)
        (self.home / "airflow.cfg").write_text(airflow_cfg(self.home, self.dags, self.db_url, self.port))
        self.airflow("db", "migrate", timeout=600)
        self.trainyard("pools", check=True)
        for service in SERVICES:
            self.processes[service] = subprocess.Popen(
                [str(BIN / "airflow"), service], env=self.env, stdout=self.log(service).open("wb"),
                stderr=subprocess.STDOUT, start_new_session=True)
        wait_for("the api-server to answer", self._api_up, 180, logs=self._logs())
        wait_for("the database, scheduler, dag-processor and triggerer to report healthy", self._healthy, 180,
                 logs=self._logs())
        return self

    def _logs(self) -> list[Path]:
        return [self.log(s) for s in SERVICES]

    def _api_up(self) -> bool:
        for name, process in self.processes.items():
            if process.poll() is not None:
                raise RuntimeError(f"airflow {name} exited ({process.returncode}):\n"
                                   f"{self.log(name).read_text(errors='replace')[-3000:]}")
        self._api = AirflowApi(self.base_url, get_token(self.base_url))
        return True

    def _healthy(self) -> bool:
        health = self.api.call("GET", "/monitor/health")
        return all(health.get(part, {}).get("status") == "healthy"
                   for part in ("metadatabase", "scheduler", "triggerer", "dag_processor"))

    @property
    def api(self) -> AirflowApi:
        if self._api is None:
            raise RuntimeError("the services are not started")
        return self._api

    def wait_parsed(self, dag_id: str, timeout: float = 180) -> dict[str, Any]:
        """Wait until the dag-processor has parsed `dag_id` (it appears in the REST API)."""
        def parsed() -> dict[str, Any] | None:
            errors = self.api.call("GET", "/importErrors")["import_errors"]
            mine = [e for e in errors if Path(e["filename"]).stem == dag_id]
            if mine:
                raise RuntimeError(f"DAG {dag_id} has an import error: {mine[0]['stack_trace'][-2000:]}")
            try:
                return self.api.call("GET", f"/dags/{dag_id}")
            except ApiError as exc:
                if exc.status == 404:
                    return None
                raise
        return wait_for(f"DAG {dag_id} to be parsed", parsed, timeout, every=1.0, logs=[self.log("dag-processor")])

    def wait_run(self, dag_id: str, run_id: str, timeout: float = 600) -> dict[str, Any]:
        """Wait until a run ends; returns it (its state may be success or failed: the caller asserts)."""
        def ended() -> dict[str, Any] | None:
            run = self.api.dag_run(dag_id, run_id)
            return run if run["state"] in ("success", "failed") else None
        return wait_for(f"run {run_id} of {dag_id} to end", ended, timeout, every=1.0, logs=[self.log("scheduler")])

    def task_log(self, dag_id: str, run_id: str, task_id: str, try_number: int = 1) -> str:
        """A task's log as text (from the log folder the services write), for assertion messages."""
        path = self.home / "logs" / f"dag_id={dag_id}" / f"run_id={run_id}" / f"task_id={task_id}" / \
            f"attempt={try_number}.log"
        return path.read_text(errors="replace") if path.is_file() else f"(no log at {path})"

    def stop(self) -> None:
        """Stop every service (SIGTERM to its process group, then SIGKILL), newest first."""
        for process in reversed(list(self.processes.values())):
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGTERM)
        deadline = time.monotonic() + 15
        for process in self.processes.values():
            try:
                process.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait(10)
        self.processes.clear()


def dag_shim(name: str) -> str:
    """The DAG file of pipeline `name`, as in `dags/` (safe mode parses only files naming "airflow" and "dag")."""
    return (f'"""Airflow DAG shim for {name}.yaml."""\n\nfrom trainyard.dag.factory import dag_from_config\n\n'
            f"dag = dag_from_config({name!r})\n")


@contextmanager
def running_pipelines(root: Path, configs: dict[str, str],
                      data_days: int) -> Iterator[tuple[AirflowServices, Path, Server]]:
    """The pipelines `configs` (name -> YAML text, beside the repo's `_defaults.yaml`, one shim each) on the real
    services over a fresh volume holding `data_days` daily digits partitions, with the local model server.
    Yields (services, volume, server) once every DAG is parsed; stops everything it started on the way out."""
    from trainyard_prep.example_data import write_digits

    volume, pipelines, dags = root / "volume", root / "pipelines", root / "dags"
    for folder in (volume / layout.MODELS, pipelines, dags):
        folder.mkdir(parents=True)
    shutil.copy(REPO / "pipelines_config" / "_defaults.yaml", pipelines)
    for name, text in configs.items():
        (pipelines / f"{name}.yaml").write_text(text)
        (dags / f"{name}.py").write_text(dag_shim(name))
    write_digits(volume / layout.DATASETS / "digits", days=data_days)
    server = Server(volume / layout.MODELS).start(root / "serving.log")
    postgres = Postgres()
    services = AirflowServices(root / "airflow", dags, postgres.url, {
        "TRAINYARD_DATA_DIR": str(volume), "TRAINYARD_PIPELINES_DIR": str(pipelines),
        "TRAINYARD_SERVING_GRPC": server.grpc, "TRAINYARD_BACKEND": "local",
    })
    try:
        postgres.start()
        services.start()
        for name in configs:
            services.wait_parsed(name)
        yield services, volume, server
    finally:
        services.stop()
        postgres.stop()
        server.stop()
