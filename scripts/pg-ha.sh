#!/usr/bin/env bash
# A PostgreSQL HA cluster on 127.0.0.1, for the suite and memcheck: one etcd (client port 2479,
# peer 2480) and two PostgreSQL 15 nodes managed by Patroni (PostgreSQL 5441-5442, Patroni's REST
# API 8041-8042), a leader and a streaming replica; data under $PG_HA_DIR (default
# /tmp/agentmemory-pg-ha). Installs etcd-server and PostgreSQL 15 from Debian's packages when
# missing, and Patroni from PyPI into a venv of the system's python3 under $PG_HA_DIR (Patroni and
# the servers run as the `postgres` user, who cannot run root's interpreters).
#
#   scripts/pg-ha.sh start [async|sync]  start what is not running (a cluster that is wholly down
#                               is created afresh: it holds test data only), in asynchronous
#                               replication (Patroni's default) or synchronous_mode_strict; wait
#                               until Patroni reports a leader and a streaming replica; create the
#                               `agentmemory` database
#   scripts/pg-ha.sh stop       stop Patroni (and its PostgreSQL) on both nodes, then etcd
#   scripts/pg-ha.sh status     Patroni's view of the cluster (patronictl list)
#   scripts/pg-ha.sh url        the DATABASE_URL of the cluster: one alias over both hosts that
#                               connects to whichever is the primary (target_session_attrs)
#   scripts/pg-ha.sh leader     the port of the current leader
#   scripts/pg-ha.sh failover   crash the leader (Patroni and PostgreSQL, SIGKILL), wait for the
#                               replica's promotion, start the crashed node again, wait until it
#                               streams (memcheck --faults db does the same, mid-workload)
#
# Exits non-zero naming what failed and the end of its log.
set -uo pipefail

DIR=${PG_HA_DIR:-/tmp/agentmemory-pg-ha}
NODES=(1 2)
BIN=/usr/lib/postgresql/15/bin
VENV=$DIR/venv
RUN_AS=postgres
ETCD_CLIENT=2479
ETCD_PEER=2480

as_root() { if [ "$(id -u)" = 0 ]; then "$@"; else sudo "$@"; fi; }
pg_port() { echo $((5440 + $1)); }
api_port() { echo $((8040 + $1)); }
say() { echo "pg-ha: $*" >&2; }
fail() { say "$*"; exit 1; }
# A process that runs (a zombie left by a kill, not yet reaped, does not).
alive() { [ -n "${1:-}" ] && kill -0 "$1" 2>/dev/null && ! grep -q '^[^)]*) Z' "/proc/$1/stat" 2>/dev/null; }
pid_in() { cat "$1" 2>/dev/null; }
# Node N's Patroni, found by its command line (not a pid file): memcheck's db-failover fault
# kills it and starts it again itself.
patroni_pid() { pgrep -f -- "python3 $VENV/bin/patroni $DIR/node$1/patroni.yml" | head -n1; }

install_packages() {
  local missing=()
  command -v etcd >/dev/null || missing+=(etcd-server)
  [ -x "$BIN/postgres" ] || missing+=(postgresql-15)
  if [ ${#missing[@]} -gt 0 ]; then
    say "installing ${missing[*]}"
    as_root apt-get update -qq && DEBIAN_FRONTEND=noninteractive as_root apt-get install -y -qq "${missing[@]}" >/dev/null \
      || fail "could not install ${missing[*]}"
  fi
  mkdir -p "$DIR"
  chmod 755 "$DIR"
  if [ ! -x "$VENV/bin/patroni" ]; then
    say "installing Patroni into $VENV"
    /usr/bin/python3 -m venv "$VENV" && "$VENV/bin/pip" install -q "patroni[etcd3,psycopg3]>=4,<5" >"$DIR/pip.log" 2>&1 \
      || fail "could not install Patroni from PyPI into $VENV"
  fi
}

# api NODE PATH: Patroni's REST API answer (JSON), or nothing.
api() {
  /usr/bin/python3 - "$(api_port "$1")" "$2" <<'EOF' 2>/dev/null
import sys, urllib.request
try:
    print(urllib.request.urlopen(f"http://127.0.0.1:{sys.argv[1]}{sys.argv[2]}", timeout=2).read().decode())
except Exception as error:
    if hasattr(error, "read"):  # a 503 still carries the body (a replica's /primary)
        print(error.read().decode())
EOF
}

# cluster_state: "leader=PORT replicas=N" from any node's /cluster, or nothing.
cluster_state() {
  local n answer
  for n in "${NODES[@]}"; do
    answer=$(api "$n" /cluster) && [ -n "$answer" ] && break
  done
  [ -n "${answer:-}" ] || return 1
  /usr/bin/python3 -c '
import json, sys
members = json.loads(sys.argv[1]).get("members", [])
leader = [m["port"] for m in members if m["role"] == "leader" and m["state"] == "running"]
streaming = [m for m in members if m["role"] in ("replica", "sync_standby") and m["state"] == "streaming"]
print(f"leader={leader[0] if leader else 0} replicas={len(streaming)}")
' "$answer"
}

write_config() {
  local n=$1 mode=$2 sync=false strict=false
  [ "$mode" = sync ] && sync=true && strict=true
  mkdir -p "$DIR/node$n"
  cat > "$DIR/node$n/patroni.yml" <<EOF
scope: agentmemory
name: node$n
log:
  level: WARNING
restapi:
  listen: 127.0.0.1:$(api_port "$n")
  connect_address: 127.0.0.1:$(api_port "$n")
etcd3:
  hosts: 127.0.0.1:$ETCD_CLIENT
bootstrap:
  dcs:
    # A short TTL so that a failover takes seconds here (loop_wait + 2 * retry_timeout <= ttl).
    ttl: 10
    loop_wait: 1
    retry_timeout: 4
    maximum_lag_on_failover: 1048576
    synchronous_mode: $sync
    synchronous_mode_strict: $strict
    postgresql:
      use_pg_rewind: true
      parameters:
        wal_level: replica
        hot_standby: "on"
        max_wal_senders: 10
        max_replication_slots: 10
        wal_log_hints: "on"
        max_connections: 200
  initdb:
    - encoding: UTF8
    - locale: C.UTF-8
postgresql:
  listen: 127.0.0.1:$(pg_port "$n")
  connect_address: 127.0.0.1:$(pg_port "$n")
  data_dir: $DIR/node$n/data
  bin_dir: $BIN
  pgpass: $DIR/node$n/pgpass
  pg_hba:
    - local all all trust
    - host replication replicator 127.0.0.1/32 trust
    - host all all 127.0.0.1/32 trust
  authentication:
    replication:
      username: replicator
      password: replicator
    superuser:
      username: postgres
      password: postgres
  parameters:
    unix_socket_directories: $DIR/node$n
EOF
  chown -R "$RUN_AS:" "$DIR/node$n"
}

start_etcd() {
  alive "$(pid_in "$DIR/etcd.pid")" && return 0
  mkdir -p "$DIR/etcd"
  setsid etcd --name agentmemory --data-dir "$DIR/etcd/data" \
    --listen-client-urls "http://127.0.0.1:$ETCD_CLIENT" --advertise-client-urls "http://127.0.0.1:$ETCD_CLIENT" \
    --listen-peer-urls "http://127.0.0.1:$ETCD_PEER" --initial-advertise-peer-urls "http://127.0.0.1:$ETCD_PEER" \
    --initial-cluster "agentmemory=http://127.0.0.1:$ETCD_PEER" >"$DIR/etcd/etcd.log" 2>&1 &
  echo $! > "$DIR/etcd.pid"
  local tries=0
  until /usr/bin/python3 -c "import urllib.request; urllib.request.urlopen('http://127.0.0.1:$ETCD_CLIENT/health', timeout=1)" 2>/dev/null; do
    tries=$((tries + 1))
    [ $tries -gt 100 ] && { tail -n 20 "$DIR/etcd/etcd.log" >&2; fail "etcd did not answer on port $ETCD_CLIENT"; }
    alive "$(pid_in "$DIR/etcd.pid")" || { tail -n 20 "$DIR/etcd/etcd.log" >&2; fail "etcd exited"; }
    sleep 0.1
  done
}

start_node() {
  local n=$1
  alive "$(patroni_pid "$n")" && return 0
  runuser -u "$RUN_AS" -- setsid "$VENV/bin/patroni" "$DIR/node$n/patroni.yml" \
    >>"$DIR/node$n/patroni.log" 2>&1 < /dev/null &
  local tries=0
  until alive "$(patroni_pid "$n")"; do  # its process, under runuser
    tries=$((tries + 1))
    [ $tries -gt 100 ] && { tail -n 20 "$DIR/node$n/patroni.log" >&2; fail "Patroni of node$n did not start"; }
    sleep 0.05
  done
}

wait_ready() {  # a running leader and every other node streaming from it
  local tries=0 state=""
  while :; do
    state=$(cluster_state) || state=""
    [[ "$state" =~ ^leader=[1-9].*replicas=$((${#NODES[@]} - 1))$ ]] && break
    tries=$((tries + 1))
    if [ $tries -gt 1200 ]; then  # two minutes
      for n in "${NODES[@]}"; do tail -n 15 "$DIR/node$n/patroni.log" >&2; done
      fail "no leader with a streaming replica after 120 s (last: ${state:-no answer})"
    fi
    for n in "${NODES[@]}"; do
      alive "$(patroni_pid "$n")" || { tail -n 20 "$DIR/node$n/patroni.log" >&2; fail "Patroni of node$n exited"; }
    done
    sleep 0.1
  done
  say "ready: $state"
}

leader_port() { cluster_state | sed -n 's/^leader=\([0-9]*\).*/\1/p'; }

start() {
  local mode=${1:-async}
  [ "$mode" = async ] || [ "$mode" = sync ] || fail "unknown replication mode $mode (async or sync)"
  install_packages
  local any=0
  for n in "${NODES[@]}"; do alive "$(patroni_pid "$n")" && any=1; done
  if [ $any = 0 ]; then  # wholly down: afresh (test data only), in the mode asked for
    alive "$(pid_in "$DIR/etcd.pid")" && kill "$(pid_in "$DIR/etcd.pid")" && sleep 0.5
    rm -rf "$DIR/etcd" "$DIR"/node*
    for n in "${NODES[@]}"; do write_config "$n" "$mode"; done
  fi
  start_etcd
  start_node 1
  # The second node after the first has bootstrapped (it then clones the leader).
  local tries=0
  until [ -n "$(leader_port)" ] && [ "$(leader_port)" != 0 ]; do
    tries=$((tries + 1))
    [ $tries -gt 1200 ] && { tail -n 20 "$DIR/node1/patroni.log" >&2; fail "node1 did not become the leader"; }
    alive "$(patroni_pid 1)" || { tail -n 20 "$DIR/node1/patroni.log" >&2; fail "Patroni of node1 exited"; }
    sleep 0.1
  done
  for n in "${NODES[@]}"; do start_node "$n"; done
  wait_ready
  local port
  port=$(leader_port)
  psql -h 127.0.0.1 -p "$port" -U postgres -Atqc "SELECT 1 FROM pg_database WHERE datname = 'agentmemory'" | grep -q 1 \
    || psql -h 127.0.0.1 -p "$port" -U postgres -qc "CREATE DATABASE agentmemory" \
    || fail "could not create the agentmemory database on the leader (port $port)"
}

stop() {
  for n in "${NODES[@]}"; do
    local pid
    pid=$(patroni_pid "$n")
    alive "$pid" && kill "$pid"
  done
  for n in "${NODES[@]}"; do
    local pid tries=0
    pid=$(patroni_pid "$n")
    while alive "$pid" && [ $tries -lt 300 ]; do sleep 0.1; tries=$((tries + 1)); done
    alive "$pid" && kill -9 "$pid"
    # Patroni stops its PostgreSQL; one left behind (Patroni killed) is stopped here.
    [ -f "$DIR/node$n/data/postmaster.pid" ] && runuser -u "$RUN_AS" -- "$BIN/pg_ctl" -D "$DIR/node$n/data" -m fast stop >/dev/null 2>&1
  done
  local pid
  pid=$(pid_in "$DIR/etcd.pid")
  alive "$pid" && kill "$pid"
  say "stopped"
}

# The leader crashes as in a power cut (its Patroni and every PostgreSQL process, SIGKILL):
# Patroni promotes the replica once the leader key expires (ttl); the crashed node is started
# again and rejoins as a replica (rewound when it had WAL the new leader lacks). With
# asynchronous replication, what the replica had not received is lost.
failover() {
  local port n postmaster
  port=$(leader_port)
  [ -n "$port" ] && [ "$port" != 0 ] || fail "no running leader to crash"
  n=$((port - 5440))
  postmaster=$(head -n1 "$DIR/node$n/data/postmaster.pid" 2>/dev/null)
  say "crashing node$n (the leader, port $port)"
  kill -9 "$(patroni_pid "$n")" $postmaster $(pgrep -P "$postmaster") 2>/dev/null
  local tries=0
  until [ -n "$(leader_port)" ] && [ "$(leader_port)" != 0 ] && [ "$(leader_port)" != "$port" ]; do
    tries=$((tries + 1))
    [ $tries -gt 1200 ] && fail "no other node became the leader within 120 s"
    sleep 0.1
  done
  say "node$(( $(leader_port) - 5440 )) leads; starting node$n again"
  start_node "$n"
  wait_ready
}

url() {
  echo "postgres://postgres@127.0.0.1:$(pg_port 1),127.0.0.1:$(pg_port 2)/agentmemory?target_session_attrs=read-write"
}

case "${1:-}" in
  start) start "${2:-async}" ;;
  stop) stop ;;
  status) runuser -u "$RUN_AS" -- "$VENV/bin/patronictl" -c "$DIR/node1/patroni.yml" list ;;
  url) url ;;
  leader) leader_port ;;
  failover) failover ;;
  *) echo "usage: $0 start [async|sync] | stop | status | url | leader | failover" >&2; exit 2 ;;
esac
