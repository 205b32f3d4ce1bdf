#!/usr/bin/env bash
# Start a Docker engine for Trellis' container tests and images when none answers, and stop
# only the one this script started.
#   bash deploy/dockerd.sh start    start dockerd in the background unless `docker info` works
#   bash deploy/dockerd.sh stop     stop the dockerd that `start` started (nothing otherwise)
#   bash deploy/dockerd.sh status   exit 0 when an engine answers
# Debian's `docker.io` package installs dockerd but no service starts it on machines without
# systemd, so this script does. Its pid and log go to $TRELLIS_DOCKERD_DIR (default
# /tmp/trellis-dockerd); a pid file there is how `stop` knows the engine is ours.
set -euo pipefail
state=${TRELLIS_DOCKERD_DIR:-/tmp/trellis-dockerd}
pidfile=$state/dockerd.pid
logfile=$state/dockerd.log
wait_seconds=${TRELLIS_DOCKERD_WAIT:-60}

# Debian's client first: another `docker` earlier on PATH may be a client that misbehaves.
docker_cli() {
  if [ -x /usr/bin/docker ]; then echo /usr/bin/docker; else command -v docker || true; fi
}

engine_answers() {
  local cli
  cli=$(docker_cli)
  [ -n "$cli" ] && "$cli" info >/dev/null 2>&1
}

ours_alive() {
  # The pid in our pid file is a running dockerd (a stale file may name a reused pid).
  [ -f "$pidfile" ] || return 1
  local pid
  pid=$(cat "$pidfile")
  [ -n "$pid" ] && [ -r "/proc/$pid/comm" ] && [ "$(cat "/proc/$pid/comm")" = dockerd ]
}

start() {
  if engine_answers; then
    echo "dockerd.sh: a Docker engine already answers"
    return 0
  fi
  local dockerd
  dockerd=$(command -v dockerd || true)
  [ -n "$dockerd" ] || [ ! -x /usr/sbin/dockerd ] || dockerd=/usr/sbin/dockerd
  if [ -z "$dockerd" ]; then
    echo "dockerd.sh: no dockerd (install Debian's docker.io: bash deploy/setup.sh)" >&2
    return 1
  fi
  if [ "$(id -u)" -ne 0 ]; then
    echo "dockerd.sh: starting dockerd needs root" >&2
    return 1
  fi
  if [ -z "$(docker_cli)" ]; then
    echo "dockerd.sh: no docker client (install Debian's docker.io: bash deploy/setup.sh)" >&2
    return 1
  fi
  mkdir -p "$state"
  if ! ours_alive; then
    setsid "$dockerd" >"$logfile" 2>&1 </dev/null &
    echo $! >"$pidfile"
  fi
  local waited=0 pid
  pid=$(cat "$pidfile")
  until engine_answers; do
    # Alive, not "ours_alive": on a busy machine the child may not have exec'd dockerd yet
    # (its name is still setsid's) when the first `docker info` fails; taking that for an
    # exit dropped the pid file and left the dockerd that then started to nobody.
    if [ ! -d "/proc/$pid" ]; then
      echo "dockerd.sh: dockerd exited while starting; last lines of $logfile:" >&2
      tail -n 15 "$logfile" >&2
      rm -f "$pidfile"
      return 1
    fi
    if [ "$waited" -ge "$((wait_seconds * 5))" ]; then
      echo "dockerd.sh: dockerd did not answer within ${wait_seconds}s (log: $logfile)" >&2
      return 1
    fi
    sleep 0.2
    waited=$((waited + 1))
  done
  echo "dockerd.sh: dockerd started (pid $(cat "$pidfile"), log $logfile)"
}

stop() {
  if ! ours_alive; then
    rm -f "$pidfile"
    echo "dockerd.sh: no dockerd of ours to stop"
    return 0
  fi
  local pid waited=0
  pid=$(cat "$pidfile")
  kill -TERM "$pid"
  # dockerd stops its containers and its own containerd before it exits.
  while [ -d "/proc/$pid" ]; do
    if [ "$waited" -ge 150 ]; then
      echo "dockerd.sh: dockerd $pid still running after 30 s: SIGKILL" >&2
      kill -KILL "$pid" 2>/dev/null || true
      break
    fi
    sleep 0.2
    waited=$((waited + 1))
  done
  rm -f "$pidfile"
  echo "dockerd.sh: dockerd $pid stopped"
}

case "${1:-}" in
  start) start ;;
  stop) stop ;;
  status) engine_answers ;;
  *) echo "usage: $0 start|stop|status" >&2; exit 2 ;;
esac
