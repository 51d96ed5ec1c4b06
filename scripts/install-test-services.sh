#!/usr/bin/env bash
# Installs what the integration suite runs for real, from Debian's packages, when it is missing:
# PostgreSQL (the Airflow services' metadata database), Chromium (the trigger-form browser test) and Redis (the
# stream scorer's and lander's broker).
# Idempotent and quick when all are there; `make test` runs it before pytest.
set -euo pipefail
need=()
compgen -G "/usr/lib/postgresql/*/bin/postgres" >/dev/null || need+=(postgresql)
command -v chromium >/dev/null || need+=(chromium)
command -v redis-server >/dev/null || need+=(redis-server)
[ ${#need[@]} -eq 0 ] && exit 0
if [ "$(id -u)" -eq 0 ]; then SUDO=(); elif command -v sudo >/dev/null; then SUDO=(sudo); else
  echo "install-test-services: need ${need[*]} (Debian packages); run as root or install them: apt-get install ${need[*]}" >&2
  exit 1
fi
echo "install-test-services: installing ${need[*]} from Debian's packages"
export DEBIAN_FRONTEND=noninteractive
"${SUDO[@]}" apt-get update -qq
"${SUDO[@]}" apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
# the package's own cluster is not used (the tests start their own server on a free port); keep it stopped
if command -v pg_ctlcluster >/dev/null; then
  for cluster in $(pg_lsclusters -h 2>/dev/null | awk '{print $1"/"$2}'); do
    "${SUDO[@]}" pg_ctlcluster ${cluster/\// } stop 2>/dev/null || true
  done
fi
# likewise the package's own Redis service: the tests start redis-server on a free port
if command -v service >/dev/null; then "${SUDO[@]}" service redis-server stop >/dev/null 2>&1 || true; fi
