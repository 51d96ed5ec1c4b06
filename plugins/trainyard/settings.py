"""Where things live, from the environment. Read when called (never at import time), so tests can repoint them."""

from __future__ import annotations

import os
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]


def pipelines_dir() -> Path:
    """`TRAINYARD_PIPELINES_DIR`, else `pipelines_config/` in the repo."""
    return Path(os.environ.get("TRAINYARD_PIPELINES_DIR") or REPO_ROOT / "pipelines_config")


def data_dir() -> Path:
    """The local backend's volume root: `TRAINYARD_DATA_DIR`, else `data/` in the repo."""
    return Path(os.environ.get("TRAINYARD_DATA_DIR") or REPO_ROOT / "data")


def local_serving_grpc(default_port: int) -> str:
    """The local server's gRPC address the deploy step talks to: `TRAINYARD_SERVING_GRPC`, else 127.0.0.1."""
    return os.environ.get("TRAINYARD_SERVING_GRPC") or f"127.0.0.1:{default_port}"


def backend_name(configured: str | None) -> str:
    """`TRAINYARD_BACKEND` wins, then the config's `backend`, then the embedded default `local`."""
    name = os.environ.get("TRAINYARD_BACKEND") or configured or "local"
    if name not in ("local", "kubernetes"):
        raise ValueError(f"TRAINYARD_BACKEND must be 'local' or 'kubernetes' (got {name!r})")
    return name


def default_airflow_home() -> None:
    """Without `AIRFLOW_HOME`, the CLI uses the Airflow home `make` prepared in the checkout (`.airflow/`, whose
    dags folder is the repo's `dags/`), as the Makefile does, instead of Airflow's own `~/airflow`."""
    prepared = REPO_ROOT / ".airflow"
    if "AIRFLOW_HOME" not in os.environ and (prepared / "airflow.cfg").is_file():
        os.environ["AIRFLOW_HOME"] = str(prepared)
