#!/usr/bin/env bash
# A MariaDB primary and its asynchronous GTID replica on 127.0.0.1 (nodes a and b, ports 3321 and
# 3322), behind a router on 3320 that sends each new connection to the primary -- what a promoted
# MySQL replica looks like to an application (orchestrator, MaxScale, a virtual IP). Data under
# $MARIADB_PAIR_DIR (default /tmp/agentmemory-mariadb-pair). The work is done by
# agentmemory.consistency.mysql_pair, which memcheck's db-failover fault uses too.
#
#   scripts/mariadb-pair.sh start   start what is not running (a pair wholly down is created
#                                   afresh: it holds test data only), wait until the replica
#                                   caught up, create the `agentmemory` database
#   scripts/mariadb-pair.sh stop    stop the router and both servers
#   scripts/mariadb-pair.sh url     the DATABASE_URL: the router
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
if [ "${1:-}" = start ] && ! [ -x /usr/sbin/mariadbd ]; then
  echo "mariadb-pair: installing mariadb-server" >&2
  as_root() { if [ "$(id -u)" = 0 ]; then "$@"; else sudo "$@"; fi; }
  as_root apt-get update -qq && DEBIAN_FRONTEND=noninteractive as_root apt-get install -y -qq mariadb-server mariadb-client >/dev/null
fi
exec "$PY" -m agentmemory.consistency.mysql_pair "$@"
