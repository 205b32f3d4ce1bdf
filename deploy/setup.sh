#!/usr/bin/env bash
# Set up a fresh machine for Trellis: a virtualenv in .venv with the project and its test tools.
#   bash deploy/setup.sh           runtime + test dependencies
#   bash deploy/setup.sh --bench   also the benchmark peers (Mosquitto, nats-server, libgfshare, amqtt,
#                                  nats-py, pycryptodome, py-spy for bench_confidential --profile)
set -euo pipefail
cd "$(dirname "$0")/.."
want_bench=0
for arg in "$@"; do
  case "$arg" in
    --bench) want_bench=1 ;;
    *) echo "setup.sh: unknown option $arg" >&2; exit 2 ;;
  esac
done

apt_install() {
  # Install Debian packages only when a command or library is missing (root needed then).
  if [ "$(id -u)" -ne 0 ]; then
    echo "setup.sh: need root to apt-get install $*" >&2; return 1
  fi
  if [ -z "${_apt_updated:-}" ]; then apt-get update -qq; _apt_updated=1; fi
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$@" >/dev/null
}

# libgfshare: the Shamir interoperability test combines shares with the C library.
ldconfig -p | grep -q libgfshare || apt_install libgfshare2
# A Java runtime: the analytics job (PySpark) starts a JVM.
command -v java >/dev/null 2>&1 || apt_install openjdk-17-jre-headless
# Mosquitto: the MQTT bridge's system test starts one on a free port.
{ command -v mosquitto >/dev/null 2>&1 || [ -x /usr/sbin/mosquitto ]; } || apt_install mosquitto
# Headless Chromium: the admin page's system test drives the page in a real browser.
command -v chromium >/dev/null 2>&1 || apt_install chromium
# Docker: deploy/images.sh and the compose overlay's test (tests/deploy) need Debian's engine
# (started by deploy/dockerd.sh), Compose v1 and debootstrap for the local base image.
has() { command -v "$1" >/dev/null 2>&1 || [ -x "/usr/sbin/$1" ] || [ -x "/sbin/$1" ]; }
if ! { has dockerd && [ -x /usr/bin/docker ] && has docker-compose && has debootstrap; }; then
  if [ "$(id -u)" -eq 0 ] && command -v apt-get >/dev/null 2>&1; then
    apt_install docker.io docker-compose debootstrap
  else
    echo "setup.sh: no docker.io, docker-compose or debootstrap and no root with apt-get to" \
      "install them: the docker tests will skip" >&2
  fi
fi
if [ "$want_bench" = 1 ]; then
  command -v mosquitto_pub >/dev/null 2>&1 || apt_install mosquitto-clients
  { command -v nats-server >/dev/null 2>&1 || [ -x /usr/sbin/nats-server ]; } || apt_install nats-server
fi

PY=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PY" -m venv .venv
.venv/bin/python -m pip install -q --upgrade pip
extras="dev,analytics"
[ "$want_bench" = 1 ] && extras="dev,analytics,bench"
.venv/bin/python -m pip install -q -e ".[$extras]"
echo "setup.sh: ready (.venv, extras: $extras)"
