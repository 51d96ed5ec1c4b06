#!/usr/bin/env bash
# Build the stage images (every images/*/Dockerfile but airflow's) from the repo root, each tagged as its header's
# `-t` says (the tags the configs' defaults name), with whichever builder is installed: docker, podman or buildah.
#   scripts/build-images.sh [NAME ...]        e.g. scripts/build-images.sh prep trainer
# Env: BUILDER=docker|podman|buildah (default: the first found), PUSH=registry/prefix (tag as PREFIX/<name>:<tag>
# and push; point the configs' `image` fields at it), BUILD_ARGS (extra builder arguments), DRY_RUN=1 (print only).
set -euo pipefail
cd "$(dirname "$0")/.."
builder=${BUILDER:-}
if [ -z "$builder" ]; then  # docker only where its engine answers (a client alone cannot build)
  if command -v docker >/dev/null 2>&1 && docker info >/dev/null 2>&1; then builder=docker
  elif command -v podman >/dev/null 2>&1; then builder=podman
  elif command -v buildah >/dev/null 2>&1; then builder=buildah
  fi
fi
[ -n "$builder" ] || { echo "build-images: no docker engine, podman or buildah found: install one" >&2; exit 2; }
names=("$@")
[ ${#names[@]} -gt 0 ] || names=($(ls images | grep -v '^airflow$'))
run() { echo "+ $*"; [ -n "${DRY_RUN:-}" ] || "$@"; }
for name in "${names[@]}"; do
  file=images/$name/Dockerfile
  [ -f "$file" ] || { echo "build-images: no $file" >&2; exit 2; }
  tag=$(sed -n 's/^#.* -t \([^ ]*\) .*/\1/p' "$file" | head -n 1)
  [ -n "$tag" ] || { echo "build-images: $file has no '-t NAME:TAG' in its header comment" >&2; exit 2; }
  case $builder in
    buildah) run buildah bud --layers ${BUILD_ARGS:-} -f "$file" -t "$tag" . ;;
    *) run "$builder" build ${BUILD_ARGS:-} -f "$file" -t "$tag" . ;;
  esac
  if [ -n "${PUSH:-}" ]; then
    remote=${PUSH%/}/${tag#*/}
    run "$builder" tag "$tag" "$remote"
    run "$builder" push "$remote"
  fi
done
