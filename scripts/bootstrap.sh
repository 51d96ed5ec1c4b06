#!/usr/bin/env bash
# Creates .venv (pinned), installs the stage contract and Trainyard editable, and initialises the embedded Airflow home in .airflow/.
# Idempotent: each step is skipped when its inputs have not changed, so `make test` after `make demo` is quick.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)
PYTHON=${PYTHON:-python3.11}
VENV=${VENV:-$ROOT/.venv}
export AIRFLOW_HOME=${AIRFLOW_HOME:-$ROOT/.airflow}

if ! command -v "$PYTHON" >/dev/null 2>&1; then
  echo "bootstrap: $PYTHON not found; Trainyard needs Python 3.11 (set PYTHON=/path/to/python3.11)" >&2
  exit 2
fi

stamp="$VENV/.trainyard-installed"
want=$(cat requirements.txt constraints.txt pyproject.toml contract/pyproject.toml | sha256sum | cut -c1-16)
if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$want" ]; then
  echo "bootstrap: installing pinned dependencies into $VENV (first time: ~2 minutes, ~2.8 GB)"
  [ -x "$VENV/bin/python" ] || "$PYTHON" -m venv "$VENV"
  "$VENV/bin/python" -m pip install -q --disable-pip-version-check pip==26.3
  "$VENV/bin/python" -m pip install -q --disable-pip-version-check -c constraints.txt -r requirements.txt
  # the stage contract first (its own package, as every image installs it), then Trainyard itself
  "$VENV/bin/python" -m pip install -q --disable-pip-version-check --no-deps --no-build-isolation -e contract
  "$VENV/bin/python" -m pip install -q --disable-pip-version-check --no-deps --no-build-isolation -e .
  "$VENV/bin/python" -m pip check
  echo "$want" > "$stamp"
fi

mkdir -p "$AIRFLOW_HOME"
cfg="$AIRFLOW_HOME/airflow.cfg"
# Only the settings Trainyard needs; Airflow fills in every other default.
cat > "$cfg.tmp" <<CFG
[core]
dags_folder = $ROOT/dags
plugins_folder = $ROOT/plugins
load_examples = False
executor = LocalExecutor
parallelism = 4
max_active_tasks_per_dag = 4
dagbag_import_timeout = 60

[database]
sql_alchemy_conn = sqlite:///$AIRFLOW_HOME/airflow.db

[dag_processor]
refresh_interval = 30

[logging]
base_log_folder = $AIRFLOW_HOME/logs

[scheduler]
enable_health_check = True

[api]
port = 8080
CFG
if ! cmp -s "$cfg.tmp" "$cfg" 2>/dev/null; then mv "$cfg.tmp" "$cfg"; else rm -f "$cfg.tmp"; fi

if [ ! -f "$AIRFLOW_HOME/.db-migrated" ] || [ "$cfg" -nt "$AIRFLOW_HOME/.db-migrated" ]; then
  echo "bootstrap: initialising the Airflow database in $AIRFLOW_HOME"
  "$VENV/bin/airflow" db migrate >"$AIRFLOW_HOME/db-migrate.log" 2>&1 || { tail -30 "$AIRFLOW_HOME/db-migrate.log"; exit 1; }
  touch "$AIRFLOW_HOME/.db-migrated"
fi
