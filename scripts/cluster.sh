#!/usr/bin/env bash
# A 3-node MariaDB Galera cluster on 127.0.0.1, for the suite and memcheck: three mariadbd
# processes (client ports 3311-3313, Galera 4571-4573, IST 4581-4583, SST 4591-4593), data under
# $GALERA_DIR (default /tmp/agentmemory-galera). Installs galera-4/mariadb-server/rsync if missing.
#
#   scripts/cluster.sh start    start what is not running (a cluster that is wholly down is
#                               created afresh: it holds test data only), wait until all three
#                               nodes report Synced, create the `agentmemory` database
#   scripts/cluster.sh stop     shut the three nodes down
#   scripts/cluster.sh status   each node's wsrep state
#   scripts/cluster.sh url      the DATABASE_URL of the cluster
#
# Exits non-zero naming the node that failed and the end of its error log.
set -uo pipefail

DIR=${GALERA_DIR:-/tmp/agentmemory-galera}
NODES=(1 2 3)
PROVIDER=""
for candidate in /usr/lib/galera/libgalera_smm.so /usr/lib/libgalera_smm.so /usr/lib/galera-4/libgalera_smm.so; do
  [ -f "$candidate" ] && PROVIDER=$candidate && break
done

# The servers run as the `mysql` user: rsync's SST daemon, started as root, would drop to
# `nobody` and could not write the joiner's files.
RUN_AS=mysql

as_root() { if [ "$(id -u)" = 0 ]; then "$@"; else sudo "$@"; fi; }
port() { echo $((3310 + $1)); }
say() { echo "cluster: $*" >&2; }
fail() { say "$*"; exit 1; }

install_packages() {
  local missing=()
  [ -n "$PROVIDER" ] || missing+=(galera-4)
  [ -x /usr/sbin/mariadbd ] || missing+=(mariadb-server mariadb-client)
  command -v rsync >/dev/null || missing+=(rsync)
  if [ ${#missing[@]} -gt 0 ]; then
    say "installing ${missing[*]}"
    as_root apt-get update -qq && DEBIAN_FRONTEND=noninteractive as_root apt-get install -y -qq "${missing[@]}" >/dev/null \
      || fail "could not install ${missing[*]}"
    for candidate in /usr/lib/galera/libgalera_smm.so /usr/lib/libgalera_smm.so; do
      [ -f "$candidate" ] && PROVIDER=$candidate && break
    done
  fi
  [ -n "$PROVIDER" ] || fail "galera-4 is installed but libgalera_smm.so was not found"
}

sql() {  # sql NODE STATEMENT: over the node's socket, as root
  mariadb --no-defaults -uroot -S "$DIR/node$1/mysqld.sock" -N -B -e "$2" 2>/dev/null
}

state() { sql "$1" "SHOW STATUS LIKE 'wsrep_local_state_comment'" | cut -f2; }
alive() { [ -n "$1" ] && kill -0 "$1" 2>/dev/null && ! grep -q '^[^)]*) Z' "/proc/$1/stat" 2>/dev/null; }
pid_of() {  # the server's own pid file (it may have been restarted by memcheck), else ours,
  # else a server started with this node's configuration that never got as far as writing its
  # pid file (restarted by a fault into a cluster without quorum: it holds the node's ports)
  local pid
  for file in mysqld.pid server.pid; do
    pid=$(cat "$DIR/node$1/$file" 2>/dev/null) && alive "$pid" && echo "$pid" && return 0
  done
  pid=$(pgrep -f -- "^/usr/sbin/mariadbd --defaults-file=$DIR/node$1/my.cnf" | head -n 1) && alive "$pid" && echo "$pid" && return 0
  return 1
}
running() { pid_of "$1" >/dev/null; }

write_config() {
  local n=$1 members="gcomm://127.0.0.1:4571,127.0.0.1:4572,127.0.0.1:4573"
  mkdir -p "$DIR/node$n"
  chmod 755 "$DIR"
  cat > "$DIR/node$n/my.cnf" <<EOF
[mysqld]
user=$RUN_AS
datadir=$DIR/node$n/data
socket=$DIR/node$n/mysqld.sock
pid-file=$DIR/node$n/mysqld.pid
log-error=$DIR/node$n/error.log
port=$(port "$n")
bind-address=127.0.0.1
character-set-server=utf8mb4
collation-server=utf8mb4_unicode_ci
default_storage_engine=InnoDB
binlog_format=ROW
innodb_autoinc_lock_mode=2
innodb_buffer_pool_size=64M
innodb_log_file_size=32M
innodb_flush_log_at_trx_commit=2
max_connections=300
wsrep_on=ON
wsrep_provider=$PROVIDER
wsrep_cluster_name=agentmemory-test
wsrep_cluster_address=$members
wsrep_node_name=node$n
wsrep_node_address=127.0.0.1:$((4570 + n))
wsrep_provider_options="base_port=$((4570 + n));ist.recv_addr=127.0.0.1:$((4580 + n));gcache.size=128M"
wsrep_sst_method=rsync
wsrep_sst_receive_address=127.0.0.1:$((4590 + n))
wsrep_slave_threads=2
EOF
}

init_node() {
  local n=$1
  rm -rf "$DIR/node$n/data"
  mkdir -p "$DIR/node$n/data"
  chown -R "$RUN_AS:$RUN_AS" "$DIR/node$n"
  mariadb-install-db --defaults-file="$DIR/node$n/my.cnf" --user="$RUN_AS" \
    --auth-root-authentication-method=normal >"$DIR/node$n/install.log" 2>&1 \
    || fail "node$n: mariadb-install-db failed: $(tail -n 5 "$DIR/node$n/install.log")"
}

start_node() {  # start_node N [--wsrep-new-cluster]
  local n=$1
  shift
  chown -R "$RUN_AS:$RUN_AS" "$DIR/node$n"
  /usr/sbin/mariadbd --defaults-file="$DIR/node$n/my.cnf" "$@" >>"$DIR/node$n/stdout.log" 2>&1 &
  echo $! >"$DIR/node$n/server.pid"
}

wait_synced() {  # wait_synced N SECONDS
  local n=$1 deadline=$((SECONDS + $2))
  while [ $SECONDS -lt $deadline ]; do
    [ "$(state "$n")" = "Synced" ] && return 0
    running "$n" || break
    sleep 0.5
  done
  running "$n" || fail "node$n (127.0.0.1:$(port "$n")) exited while starting; its log ends: $(tail -n 8 "$DIR/node$n/error.log" 2>/dev/null)"
  fail "node$n (127.0.0.1:$(port "$n")) did not reach Synced within $2 s; its log ends: $(tail -n 8 "$DIR/node$n/error.log" 2>/dev/null)"
}

start() {
  install_packages
  for n in "${NODES[@]}"; do write_config "$n"; done
  local up=0
  for n in "${NODES[@]}"; do running "$n" && up=$((up + 1)); done
  if [ "$up" -eq 0 ]; then
    say "creating a new cluster in $DIR"
    for n in "${NODES[@]}"; do init_node "$n"; done
    start_node 1 --wsrep-new-cluster
    wait_synced 1 60
    # root over TCP from 127.0.0.1 with no password, as on the single server (test cluster only).
    sql 1 "CREATE USER IF NOT EXISTS 'root'@'127.0.0.1'; GRANT ALL ON *.* TO 'root'@'127.0.0.1' WITH GRANT OPTION;" \
      || fail "node1: could not grant root@127.0.0.1"
  fi
  for n in "${NODES[@]}"; do  # one joiner at a time: a donor serves one state transfer
    if ! running "$n"; then
      [ -d "$DIR/node$n/data/mysql" ] || init_node "$n"
      start_node "$n"
    fi
    wait_synced "$n" 120
  done
  local size
  size=$(sql 1 "SHOW STATUS LIKE 'wsrep_cluster_size'" | cut -f2)
  [ "$size" = "3" ] || fail "the cluster has $size nodes, not 3"
  sql 1 "CREATE DATABASE IF NOT EXISTS agentmemory CHARACTER SET utf8mb4" || fail "node1: cannot create the database"
  say "3 nodes Synced on 127.0.0.1:3311,3312,3313"
}

stop() {
  for n in 3 2 1; do
    if running "$n"; then
      local pid
      pid=$(pid_of "$n")
      kill "$pid" 2>/dev/null
      for _ in $(seq 1 120); do kill -0 "$pid" 2>/dev/null || break; sleep 0.5; done
      kill -9 "$pid" 2>/dev/null || true
    fi
  done
  say "stopped"
}

status() {
  for n in "${NODES[@]}"; do
    if running "$n"; then echo "node$n 127.0.0.1:$(port "$n") $(state "$n")"; else echo "node$n 127.0.0.1:$(port "$n") down"; fi
  done
}

case "${1:-}" in
  start) start ;;
  stop) stop ;;
  status) status ;;
  url) echo "mysql://root@127.0.0.1:3311,127.0.0.1:3312,127.0.0.1:3313/agentmemory" ;;
  *) echo "usage: $0 start|stop|status|url" >&2; exit 2 ;;
esac
