#!/usr/bin/env bash
# CI's Docker engine for the container lane (`make compose-test`, docs/compose.md): sourced by .ci/run, or run as
# `.ci/engine.sh start|stop|status`. Only CI starts a daemon: `make test` and `make compose-test` never do.
#
# engine_start: an engine that already answers (DOCKER_HOST, or the default socket) is used as it is. Otherwise, as
# root: Debian's Docker engine (docker.io) is installed when dockerd is missing, dockerd is started with
# --iptables=false --ip-masq=false (it leaves the host's firewall alone; containers get no route off the machine) on
# its own socket under $LLMQ_CI_ENGINE_DIR, and DOCKER_HOST points there once it answers. Not root and none answering:
# nothing is started, and the container lane skips, saying so. Idempotent: a second start finds it answering.
# engine_stop: stops the dockerd engine_start started (its containers stop with it) and waits until it is gone;
# nothing when it started none. Idempotent.
LLMQ_CI_ENGINE_DIR=${LLMQ_CI_ENGINE_DIR:-/run/llmq-ci-docker}
ENGINE_SOCKET="$LLMQ_CI_ENGINE_DIR/docker.sock"
ENGINE_PIDFILE="$LLMQ_CI_ENGINE_DIR/dockerd.pid"
ENGINE_LOG="$LLMQ_CI_ENGINE_DIR/dockerd.log"
ENGINE_WAIT_S=${ENGINE_WAIT_S:-60}

engine_answers() {  # $1: a DOCKER_HOST value (unset: the default socket)
  local host=${1:-unix:///var/run/docker.sock}
  case "$host" in
    unix://*) curl -sf --max-time 2 --unix-socket "${host#unix://}" http://docker/_ping >/dev/null 2>&1 ;;
    tcp://*) curl -sf --max-time 2 "http://${host#tcp://}/_ping" >/dev/null 2>&1 ;;
    *) return 1 ;;
  esac
}

engine_ours() {  # the dockerd engine_start started, alive
  [ -r "$ENGINE_PIDFILE" ] && kill -0 "$(cat "$ENGINE_PIDFILE")" 2>/dev/null
}

engine_start() {
  if engine_ours && engine_answers "unix://$ENGINE_SOCKET"; then
    export DOCKER_HOST="unix://$ENGINE_SOCKET"
    echo "engine: dockerd pid $(cat "$ENGINE_PIDFILE") answers on $ENGINE_SOCKET"
    return 0
  fi
  if engine_answers "${DOCKER_HOST:-}"; then
    echo "engine: using the one that answers at ${DOCKER_HOST:-unix:///var/run/docker.sock}"
    return 0
  fi
  if [ "$(id -u)" != 0 ]; then
    echo "engine: none answers and this is not root: nothing started (the container lane will skip)"
    return 0
  fi
  if ! command -v dockerd >/dev/null; then
    echo "engine: installing Debian's docker.io (and debootstrap, for make images' base image)"
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq docker.io debootstrap >/dev/null
  fi
  mkdir -p "$LLMQ_CI_ENGINE_DIR"
  rm -f "$ENGINE_PIDFILE" "$ENGINE_SOCKET"  # a killed run's leftovers: neither answers (checked above)
  setsid dockerd --iptables=false --ip-masq=false -H "unix://$ENGINE_SOCKET" --exec-root "$LLMQ_CI_ENGINE_DIR/exec" \
    --pidfile "$ENGINE_PIDFILE" >"$ENGINE_LOG" 2>&1 </dev/null &
  local pid=$! waited=0
  until engine_answers "unix://$ENGINE_SOCKET"; do
    if ! kill -0 "$pid" 2>/dev/null || [ "$waited" -ge $((ENGINE_WAIT_S * 10)) ]; then
      echo "engine: dockerd did not answer on $ENGINE_SOCKET within ${ENGINE_WAIT_S} s; its log:"
      tail -20 "$ENGINE_LOG"
      kill "$pid" 2>/dev/null || true
      return 1
    fi
    sleep 0.1 && waited=$((waited + 1))
  done
  export DOCKER_HOST="unix://$ENGINE_SOCKET"
  echo "engine: dockerd pid $pid answers on $ENGINE_SOCKET after $((waited / 10)) s (log: $ENGINE_LOG)"
}

engine_stop() {
  engine_ours || { rm -f "$ENGINE_PIDFILE"; return 0; }
  local pid waited=0
  pid=$(cat "$ENGINE_PIDFILE")
  kill -TERM "$pid"
  while kill -0 "$pid" 2>/dev/null; do
    if [ "$waited" -eq 300 ]; then  # 30 s: past dockerd's own 15 s for stopping its containers
      echo "engine: dockerd pid $pid still running after 30 s: SIGKILL"
      kill -KILL "$pid" 2>/dev/null || true
    fi
    sleep 0.1 && waited=$((waited + 1))
  done
  rm -f "$ENGINE_PIDFILE"
  echo "engine: dockerd pid $pid stopped"
}

if [ "${BASH_SOURCE[0]}" = "$0" ]; then
  set -euo pipefail
  case "${1:-}" in
    start) engine_start ;;
    stop) engine_stop ;;
    status) if engine_ours; then echo "running: pid $(cat "$ENGINE_PIDFILE") on $ENGINE_SOCKET"; else echo stopped; fi ;;
    *) echo "usage: $0 start|stop|status" >&2 && exit 2 ;;
  esac
fi
