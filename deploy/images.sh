#!/usr/bin/env bash
# Build Trellis' container images on a machine that cannot pull from any registry.
#   bash deploy/images.sh               base (once), broker and Prometheus images
#   bash deploy/images.sh --analytics   also the analytics job's image (a JRE and PySpark)
#   bash deploy/images.sh --base-only   only the Debian base image
# Images:
#   trellis-base:bookworm     Debian bookworm minbase from `debootstrap`, imported with
#                             `docker import` (built once: skipped when it exists)
#   trellis-broker:latest     deploy/Dockerfile: the project from wheels built here
#   trellis-prometheus:latest deploy/Dockerfile.prometheus: Debian's prometheus package
#   trellis-analytics:latest  deploy/Dockerfile.analytics (with --analytics; its build stage
#                             is kept as trellis-analytics:install)
# Environment:
#   TRELLIS_BASE_IMAGE     build on this image instead (e.g. python:3.11-slim where pulls
#                          work); then no debootstrap base is made
#   TRELLIS_DEBIAN_MIRROR  the mirror for debootstrap (default: the one apt uses here)
#   DOCKER                 the docker client (default: Debian's /usr/bin/docker)
# The engine must be running (bash deploy/dockerd.sh start). Builds use the legacy builder.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)

want_analytics=0
base_only=0
for arg in "$@"; do
  case "$arg" in
    --analytics) want_analytics=1 ;;
    --base-only) base_only=1 ;;
    -h|--help) sed -n '2,20p' "$0"; exit 0 ;;
    *) echo "images.sh: unknown option $arg" >&2; exit 2 ;;
  esac
done

if [ -z "${DOCKER:-}" ]; then
  if [ -x /usr/bin/docker ]; then DOCKER=/usr/bin/docker; else DOCKER=docker; fi
fi
export DOCKER_BUILDKIT=0
LOCAL_BASE=trellis-base:bookworm
BASE=${TRELLIS_BASE_IMAGE:-$LOCAL_BASE}

log() { echo "images.sh: $*" >&2; }

if ! "$DOCKER" info >/dev/null 2>&1; then
  log "no Docker engine answers; start one with: bash deploy/dockerd.sh start"
  exit 1
fi

has_image() { "$DOCKER" image inspect "$1" >/dev/null 2>&1; }

replaced=()
build() {
  # docker build TAG ARGS...; the image TAG named before is removed at the end (no untagged
  # leftovers; an image another one was built on goes once that one is replaced too).
  local tag=$1 before after
  shift
  before=$("$DOCKER" image inspect --format '{{.Id}}' "$tag" 2>/dev/null || true)
  "$DOCKER" build --quiet -t "$tag" "$@" >/dev/null
  after=$("$DOCKER" image inspect --format '{{.Id}}' "$tag")
  if [ -n "$before" ] && [ "$before" != "$after" ]; then replaced=("$before" "${replaced[@]}"); fi
}

remove_replaced() {
  local id
  for id in "${replaced[@]}"; do "$DOCKER" image rm "$id" >/dev/null 2>&1 || true; done
}

apt_mirror() {
  # The Debian mirror apt already uses for bookworm (deb822 .sources or one-line format).
  local files=(/etc/apt/sources.list /etc/apt/sources.list.d/*.list /etc/apt/sources.list.d/*.sources)
  local found
  found=$(awk '
    FNR == 1 { uris = ""; suites = "" }
    /^[[:space:]]*$/ { uris = ""; suites = ""; next }
    /^URIs:/ { uris = $2 }
    /^Suites:/ { suites = $0 }
    /^deb[[:space:]]/ {
      i = 2; if ($i ~ /^\[/) { while ($i !~ /\]$/) i++; i++ }
      if ($(i + 1) == "bookworm" && $i !~ /security/) { print $i; exit }
    }
    uris != "" && suites ~ /[[:space:]]bookworm([[:space:]]|$)/ && uris !~ /security/ { print uris; exit }
  ' "${files[@]}" 2>/dev/null | head -n 1)
  echo "${found:-http://deb.debian.org/debian}"
}

build_base() {
  if has_image "$LOCAL_BASE"; then
    log "$LOCAL_BASE exists: kept"
    return
  fi
  if ! command -v debootstrap >/dev/null 2>&1; then
    log "debootstrap is missing (install it: bash deploy/setup.sh)"
    exit 1
  fi
  local mirror rootfs started
  mirror=${TRELLIS_DEBIAN_MIRROR:-$(apt_mirror)}
  rootfs=$(mktemp -d /tmp/trellis-rootfs.XXXXXX)
  trap 'rm -rf "$rootfs"' EXIT
  started=$(date +%s)
  log "debootstrap --variant=minbase bookworm from $mirror (about half a minute)"
  if ! debootstrap --variant=minbase bookworm "$rootfs" "$mirror" >"$rootfs.log" 2>&1; then
    tail -n 20 "$rootfs.log" >&2
    log "debootstrap failed (full log: $rootfs.log)"
    exit 1
  fi
  rm -f "$rootfs.log"
  printf 'deb %s bookworm main\ndeb %s bookworm-updates main\n' "$mirror" "$mirror" \
    >"$rootfs/etc/apt/sources.list"
  rm -rf "$rootfs"/var/cache/apt/archives/*.deb "$rootfs"/var/lib/apt/lists/*
  tar -C "$rootfs" -c . | "$DOCKER" import \
    --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
    --change 'CMD ["/bin/bash"]' - "$LOCAL_BASE" >/dev/null
  rm -rf "$rootfs"
  trap - EXIT
  log "$LOCAL_BASE built in $(($(date +%s) - started)) s"
}

python_for_wheels() {
  local py=python3
  [ -x .venv/bin/python ] && py=.venv/bin/python
  if ! "$py" -c 'import sys; sys.exit(sys.version_info[:2] != (3, 11))'; then
    log "wheels must be built by Python 3.11 (the images' Python); $py is $("$py" -V 2>&1)"
    exit 1
  fi
  echo "$py"
}

build_broker() {
  local ctx=build/docker/broker py
  py=$(python_for_wheels)
  rm -rf "$ctx"
  mkdir -p "$ctx/wheels"
  cp deploy/Dockerfile "$ctx/Dockerfile"
  log "pip wheel: the project and its dependencies into $ctx/wheels"
  # setuptools builds in build/lib and would pack modules left there by an older tree.
  rm -rf build/lib build/bdist.*
  # A fixed timestamp makes the same source the same wheel, so an unchanged project reuses
  # the cached image layers.
  SOURCE_DATE_EPOCH=315532800 "$py" -m pip wheel --quiet --wheel-dir "$ctx/wheels" "$root" 2>&1 | grep -v "is neither a file nor a directory" >&2 || true
  ls "$ctx"/wheels/trellis-*.whl >/dev/null 2>&1 || { log "pip wheel made no trellis wheel"; exit 1; }
  log "building trellis-broker:latest on $BASE"
  build trellis-broker:latest --build-arg "BASE=$BASE" "$ctx"
}

build_prometheus() {
  local ctx=build/docker/prometheus
  rm -rf "$ctx"
  mkdir -p "$ctx"
  cp deploy/Dockerfile.prometheus "$ctx/Dockerfile"
  local base=$BASE
  # Debian's prometheus package needs a Debian base, not the broker's Python image.
  [ "$base" = "$LOCAL_BASE" ] || base=${TRELLIS_PROMETHEUS_BASE:-debian:bookworm-slim}
  log "building trellis-prometheus:latest on $base"
  build trellis-prometheus:latest --build-arg "BASE=$base" "$ctx"
}

build_analytics() {
  local ctx=build/docker/analytics py
  py=$(python_for_wheels)
  rm -rf "$ctx"
  mkdir -p "$ctx/wheels"
  cp deploy/Dockerfile.analytics "$ctx/Dockerfile"
  log "pip wheel: PySpark and pyarrow into $ctx/wheels"
  rm -rf build/lib build/bdist.*
  SOURCE_DATE_EPOCH=315532800 "$py" -m pip wheel --quiet --wheel-dir "$ctx/wheels" "${root}[analytics]" pyarrow 2>&1 | grep -v "is neither a file nor a directory" >&2 || true
  log "building trellis-analytics:latest on trellis-broker:latest"
  # The stage that installs the wheels is tagged too: untagged, it would linger as <none>.
  build trellis-analytics:install --target install "$ctx"
  build trellis-analytics:latest "$ctx"
}

started=$(date +%s)
[ "$BASE" = "$LOCAL_BASE" ] && build_base
if [ "$base_only" = 0 ]; then
  build_broker
  build_prometheus
  [ "$want_analytics" = 1 ] && build_analytics
fi
remove_replaced
log "done in $(($(date +%s) - started)) s"
