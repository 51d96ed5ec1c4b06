"""Where things live, from the environment. Read when called (never at import time), so tests can repoint them.

Two ways to have Trainyard: a checkout of its repository (the examples, `make`), or its wheel installed into an
Airflow you already run (`make wheel`; your configs and DAG shims in your own repository). The defaults differ only
where a checkout has folders an installed package does not.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]  # the checkout's root, when this module runs from one


def in_checkout() -> bool:
    """Whether this package runs from a checkout of the repository (editable install), not from the wheel."""
    return (REPO_ROOT / "plugins" / "trainyard" / "settings.py").is_file() and (REPO_ROOT / "pyproject.toml").is_file()


def pipelines_dir() -> Path:
    """`TRAINYARD_PIPELINES_DIR`; else the checkout's `pipelines_config/`; else, installed from the wheel, the
    `pipelines_config/` folder beside Airflow's dags folder (`<repo>/dags` + `<repo>/pipelines_config`, the layout of
    a team repository synced into Airflow)."""
    given = os.environ.get("TRAINYARD_PIPELINES_DIR")
    if given:
        return Path(given)
    if in_checkout():
        return REPO_ROOT / "pipelines_config"
    from airflow.configuration import conf

    return Path(conf.get("core", "dags_folder")).parent / "pipelines_config"


def data_dir() -> Path:
    """The local backend's volume root: `TRAINYARD_DATA_DIR`, else `data/` in a checkout, else
    `$AIRFLOW_HOME/trainyard-data`."""
    given = os.environ.get("TRAINYARD_DATA_DIR")
    if given:
        return Path(given)
    if in_checkout():
        return REPO_ROOT / "data"
    from airflow.configuration import AIRFLOW_HOME

    return Path(AIRFLOW_HOME) / "trainyard-data"


def stage_python() -> str:
    """The interpreter the local backend runs stages with (`python -m trainyard_prep ...`):
    `TRAINYARD_STAGE_PYTHON`, else this one. An Airflow with only the wheel installed has no stage packages (they
    live in the images); point this at a venv that has them (a checkout's `.venv/bin/python`) to run the local
    backend there."""
    return os.environ.get("TRAINYARD_STAGE_PYTHON") or sys.executable


def local_serving_grpc(default_port: int) -> str:
    """The local server's gRPC address the deploy step talks to: `TRAINYARD_SERVING_GRPC`, else 127.0.0.1."""
    return os.environ.get("TRAINYARD_SERVING_GRPC") or f"127.0.0.1:{default_port}"


def backend_name(configured: str | None) -> str:
    """`TRAINYARD_BACKEND` wins, then the config's `backend`, then the embedded default `local`."""
    from trainyard_contract.schema import BACKENDS

    name = os.environ.get("TRAINYARD_BACKEND") or configured or "local"
    if name not in BACKENDS:
        raise ValueError(f"TRAINYARD_BACKEND must be one of {', '.join(map(repr, BACKENDS))} (got {name!r})")
    return name


def default_airflow_home() -> None:
    """In a checkout, without `AIRFLOW_HOME`, the CLI uses the Airflow home `make` prepared there (`.airflow/`,
    whose dags folder is the repo's `dags/`) instead of Airflow's own `~/airflow`; but not when
    `TRAINYARD_PIPELINES_DIR` names another folder: those are someone else's pipelines, whose shims are not the
    examples' (Airflow's own default applies, or the `AIRFLOW_HOME` you set)."""
    prepared = REPO_ROOT / ".airflow"
    given = os.environ.get("TRAINYARD_PIPELINES_DIR")
    examples = not given or Path(given).resolve() == (REPO_ROOT / "pipelines_config").resolve()
    if "AIRFLOW_HOME" not in os.environ and examples and in_checkout() and (prepared / "airflow.cfg").is_file():
        os.environ["AIRFLOW_HOME"] = str(prepared)
