#!/usr/bin/env bash
# The cluster suite as CI runs it, on the real single-node Kubernetes in ../shared/cluster (see its README).
#   scripts/cluster-ci.sh [all] [HARNESS_DIR]   clear what an earlier run left, bring the cluster up, build and load
#                                               the project's images, prepare the node, apply k8s/, run
#                                               `make cluster-test`, and tear the cluster down whatever happens
#   scripts/cluster-ci.sh prepare [HARNESS_DIR] everything before the tests (tears down again if a step fails);
#                                               .ci/run runs this beside the main suite
#   scripts/cluster-ci.sh test [HARNESS_DIR]    `make cluster-test` against the prepared cluster
#   scripts/cluster-ci.sh down [HARNESS_DIR]    tear the cluster down (its state wiped; images kept for next time)
# (default HARNESS_DIR: ../shared/cluster beside the checkout). A harness step that fails is a failure with the
# tail of its log (full logs in $LOGS), never a skip.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)
phase=all
case "${1:-}" in all|prepare|test|down) phase=$1; shift ;; esac
HARNESS=$(cd "${1:-$ROOT/../shared/cluster}" && pwd)
LOGS=${TRAINYARD_CLUSTER_LOGS:-$ROOT/.cluster-ci}
mkdir -p "$LOGS"
started=$SECONDS

step() { # name command...: run one harness step into its own log; on failure show the log's tail
  local name=$1 t0=$SECONDS
  shift
  echo "cluster-ci: $name ..."
  if ! "$@" > "$LOGS/$name.log" 2>&1; then
    echo "cluster-ci: $name FAILED after $((SECONDS - t0))s; the end of $LOGS/$name.log:" >&2
    tail -n 60 "$LOGS/$name.log" >&2
    return 1
  fi
  echo "cluster-ci: $name ok ($((SECONDS - t0))s)"
}

down() {
  step down "$HARNESS/down.sh" --wipe
}

prepare() {
  # what an earlier run (or a cluster started by hand) may have left; harmless when nothing is up
  "$HARNESS/down.sh" --wipe > "$LOGS/down-before.log" 2>&1 || true
  step up "$HARNESS/up.sh"
  step images-bases "$HARNESS/images.sh" bases
  step images-project "$HARNESS/images.sh" project "$ROOT"
  step images-tfserving "$HARNESS/images.sh" tfserving
  # what only the tests need (the stream test's Redis), built the same way from tests/cluster/images/
  step images-test "$HARNESS/images.sh" project "$ROOT/tests/cluster" redis
  step setup "$HARNESS/setup.sh" "$ROOT"
  # shellcheck disable=SC1091
  source "$HARNESS/env.sh"   # KUBECONFIG (admin), kubectl on PATH
  step apply kubectl apply -f "$ROOT/k8s/"
  echo "cluster-ci: prepared in $((SECONDS - started))s"
}

run_tests() {
  # shellcheck disable=SC1091
  source "$HARNESS/env.sh"
  local t0=$SECONDS
  TRAINYARD_KUBE_TEST=1 make -C "$ROOT" cluster-test
  echo "cluster-ci: cluster-test ok ($((SECONDS - t0))s)"
}

teardown() { # on exit: the cluster goes down whatever happened; a failed teardown fails the run
  local code=$?
  down || code=1
  echo "cluster-ci: finished with exit $code after $((SECONDS - started))s"
  exit $code
}

case $phase in
  all) trap teardown EXIT; prepare; run_tests ;;
  prepare) trap 'code=$?; [ $code -eq 0 ] || { down || true; exit $code; }' EXIT; prepare ;;
  test) run_tests ;;
  down) down ;;
esac
