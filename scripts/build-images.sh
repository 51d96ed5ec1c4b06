#!/usr/bin/env bash
# Build the stage images (every images/*/Dockerfile but airflow's) from the repo root, each tagged as its header's
# `-t` says (the tags the configs' defaults name), with whichever builder is installed: docker, podman or buildah.
#   scripts/build-images.sh [--push] [NAME ...]        e.g. scripts/build-images.sh prep trainer
# Env: BUILDER=docker|podman|buildah (default: the first found), REGISTRY=registry.example.com/ml (also tag each
# image as $REGISTRY/trainyard/<name>:<tag>, the reference `kubernetes.registry: $REGISTRY` in a config makes the
# pods pull; --push pushes those tags), BUILD_ARGS (extra builder arguments), DRY_RUN=1 (print the commands only).
set -euo pipefail
cd "$(dirname "$0")/.."
push=
if [ "${1:-}" = "--push" ]; then push=1; shift; fi
if [ -n "${PUSH:-}" ]; then
  echo "build-images: PUSH= is now REGISTRY= (make images REGISTRY=...; make push REGISTRY=...)" >&2; exit 2
fi
registry=${REGISTRY:-}; registry=${registry%/}
if [ -n "$registry" ] && ! [[ "$registry" =~ ^[a-z0-9]([a-z0-9.-]*[a-z0-9])?(:[0-9]{1,5})?(/[a-z0-9]+([._-][a-z0-9]+)*)*$ ]]; then
  echo "build-images: REGISTRY=$REGISTRY is not a registry prefix (host[:port][/path], lowercase), e.g. registry.example.com/ml" >&2
  exit 2
fi
if [ -n "$push" ] && [ -z "$registry" ]; then
  echo "build-images: --push needs REGISTRY=host[:port][/path] (where to push), e.g. make push REGISTRY=registry.example.com/ml" >&2
  exit 2
fi
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
  if [ -z "$push" ]; then
    case $builder in
      buildah) run buildah bud --layers ${BUILD_ARGS:-} -f "$file" -t "$tag" . ;;
      *) run "$builder" build ${BUILD_ARGS:-} -f "$file" -t "$tag" . ;;
    esac
    [ -z "$registry" ] || run "$builder" tag "$tag" "$registry/$tag"
  else
    run "$builder" push "$registry/$tag"
  fi
done
