#!/usr/bin/env bash
# The wheels an existing Airflow 3 installs (README "Adopt it on your Airflow"): dist/trainyard_contract-*.whl (the
# stage contract) and dist/trainyard-*.whl (the Airflow side: plugins/trainyard, built with
# packaging/airflow/pyproject.toml; the stage packages stay in their images). DIST=folder to write elsewhere.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-.venv/bin/python}
out=$(realpath -m "${DIST:-dist}")
version() { sed -n 's/^version = "\(.*\)"/\1/p' "$1" | head -n 1; }
if [ "$(version pyproject.toml)" != "$(version packaging/airflow/pyproject.toml)" ]; then
  echo "build-wheel: packaging/airflow/pyproject.toml says version $(version packaging/airflow/pyproject.toml)," \
       "pyproject.toml $(version pyproject.toml): make them equal" >&2
  exit 2
fi
stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
mkdir -p "$out" "$stage/src"
cp packaging/airflow/pyproject.toml README.md "$stage/src/"
cp -r plugins/trainyard "$stage/src/trainyard"
find "$stage/src" -name __pycache__ -prune -exec rm -rf {} +
cp -r contract "$stage/contract"
find "$stage/contract" \( -name __pycache__ -o -name '*.egg-info' -o -name build \) -prune -exec rm -rf {} +
PYTHONWARNINGS=ignore "$PYTHON" -m pip wheel -q --disable-pip-version-check --no-deps --no-build-isolation -w "$out" "$stage/contract"
PYTHONWARNINGS=ignore "$PYTHON" -m pip wheel -q --disable-pip-version-check --no-deps --no-build-isolation -w "$out" "$stage/src"
ls "$out"/trainyard_contract-*.whl "$out"/trainyard-*.whl
