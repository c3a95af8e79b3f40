#!/usr/bin/env bash
# The whole suite, on every backend: SQLite (embedded), MariaDB, PostgreSQL (Django's default
# client-side binding, then with prepared statements), and a 3-node MariaDB
# Galera cluster on this machine (scripts/cluster.sh; its own cross-node tests run there too), and a
# PostgreSQL HA cluster under Patroni (scripts/pg-ha.sh; its switchover tests run there too), and
# a MariaDB primary with an asynchronous replica behind a router (scripts/mariadb-pair.sh; its own
# promotion tests only).
# Installs what it needs (scripts/bootstrap.sh), starts the servers if they are down
# (scripts/services.sh), then lints, checks migrations, and runs pytest once per backend.
# A backend that cannot be reached fails the run; nothing is skipped.
# Usage: scripts/test.sh [pytest args...]     BACKENDS="sqlite mariadb" to run a subset;
# PY=/path/to/python to test another interpreter's installation (no bootstrap then).
set -uo pipefail
cd "$(dirname "$0")/.."

# PY: the interpreter to test with (nox's `servers` session passes its own); default .venv's.
if [ -z "${PY:-}" ]; then
  bash scripts/bootstrap.sh --browser || exit 1
  PY=.venv/bin/python
fi
bash scripts/services.sh || exit 1

echo "== lint: ruff check, ruff format --check"
$PY -m ruff check . && $PY -m ruff format --check . || { echo "lint failed"; exit 1; }
echo "== migrations: makemigrations --check"
$PY manage.py makemigrations --check --dry-run agentmemory || { echo "a model change has no migration"; exit 1; }

declare -A URLS=(
  [sqlite]="sqlite:///$PWD/agentmemory.sqlite3"
  [mariadb]="mysql://root@127.0.0.1:3306/agentmemory"
  [postgres]="postgres://postgres@127.0.0.1:5432/agentmemory"
  # The same server with psycopg's prepared statements (server-side binding, prepared on a
  # statement's 5th run): the configuration the benchmark recommends where no pooler in
  # transaction mode sits in between. Django's default above never prepares.
  # A database of its own (test_agentmemory_prepared): CI runs it beside the default binding's.
  [postgres-prepared]="postgres://postgres@127.0.0.1:5432/agentmemory_prepared?server_side_binding=true&prepare_threshold=5"
  [galera]="$(bash scripts/cluster.sh url)"
  # A PostgreSQL HA cluster of two nodes under Patroni (scripts/pg-ha.sh): one alias over both
  # hosts that connects to the primary (target_session_attrs=read-write).
  [pg-ha]="$(bash scripts/pg-ha.sh url)"
  # A MariaDB primary and its asynchronous GTID replica behind a router (scripts/mariadb-pair.sh):
  # its own tests only (tests/test_mariadb_pair.py: a promotion that loses writes, memcheck's
  # db-failover on it) -- the rest of the suite runs on the single MariaDB server above.
  [mariadb-pair]="mysql://root@127.0.0.1:3320/agentmemory"
)
BACKENDS=${BACKENDS:-"sqlite mariadb postgres postgres-prepared galera pg-ha mariadb-pair"}
status=0
summary=()
total_passed=0
total_failed=0
for backend in $BACKENDS; do
  if [ -z "${URLS[$backend]:-}" ]; then
    echo "unknown backend $backend (known: ${!URLS[*]})"; status=1; summary+=("$backend: unknown"); continue
  fi
  # A cluster is one per machine (its ports, its data directory): two runs of the suite on one
  # machine (a developer's beside a CI rehearsal) take turns on it instead of failing each other
  # over. The lock is released when this backend's run ends (fd 9 is closed in what it starts:
  # a server started with it open would hold the lock as long as it runs).
  case $backend in
    galera | pg-ha | mariadb-pair)
      exec 9>"/tmp/agentmemory-$backend.lock"
      if ! flock -n 9; then
        echo "== $backend: another run of the suite on this machine uses it; waiting"
        flock 9
      fi
      ;;
  esac
  if [ "$backend" = galera ] && ! bash scripts/cluster.sh start 9>&-; then
    status=1; summary+=("galera: FAILED: the local Galera cluster (scripts/cluster.sh) could not start")
    continue
  fi
  if [ "$backend" = pg-ha ] && ! bash scripts/pg-ha.sh start 9>&-; then
    status=1; summary+=("pg-ha: FAILED: the local PostgreSQL HA cluster (scripts/pg-ha.sh) could not start")
    continue
  fi
  if [ "$backend" = mariadb-pair ] && ! PY=$PY bash scripts/mariadb-pair.sh start 9>&-; then
    status=1; summary+=("mariadb-pair: FAILED: the local MariaDB primary and replica (scripts/mariadb-pair.sh) could not start")
    continue
  fi
  args=("$@")
  if [ "$backend" = mariadb-pair ] && [ $# -eq 0 ]; then
    args=(tests/test_mariadb_pair.py)
  fi
  echo "== pytest on $backend (${URLS[$backend]})"
  # No test database file of an earlier run (nor its journal or WAL) may meet a new one: this
  # run's own files only (CI runs another backend beside this one, OTHER_DATABASE_URL elsewhere).
  other=${OTHER_DATABASE_URL:-sqlite:///$PWD/agentmemory-other.sqlite3}
  if [[ $other == sqlite:///* ]]; then
    other=${other#sqlite://}
    rm -f "$(dirname "$other")/test_$(basename "$other")"*
  fi
  if [ "$backend" = sqlite ]; then
    rm -f test_agentmemory.sqlite3* examples/agent_backend/test_agent_backend*.sqlite3*
  fi
  log=$(mktemp)
  mkdir -p out/junit  # each test's time, for what makes the suite long
  # Redis database 15 is the suite's own: the cache tests clear it.
  REDIS_URL=${REDIS_URL:-redis://127.0.0.1:6379/15} DATABASE_URL=${URLS[$backend]} $PY -m pytest -p no:cacheprovider -q --durations=10 \
    --junitxml="out/junit/$backend.xml" "${args[@]}" 9>&- 2>&1 | tee "$log"
  code=${PIPESTATUS[0]}
  line=$(grep -E '^[=]* ?[0-9]+ (passed|failed)' "$log" | tail -n1 | tr -d '=' | sed 's/^ *//')
  passed=$(grep -oE '[0-9]+ passed' <<<"$line" | cut -d' ' -f1); passed=${passed:-0}
  failed=$(grep -oE '[0-9]+ (failed|error)' <<<"$line" | awk '{s+=$1} END {print s+0}')
  total_passed=$((total_passed + passed)); total_failed=$((total_failed + failed))
  if [ "$code" -ne 0 ] || [ "$passed" -eq 0 ]; then
    status=1; summary+=("$backend: FAILED (pytest exit $code): $line")
  else
    summary+=("$backend: $line")
  fi
  rm -f "$log"
  exec 9>&-  # the cluster's lock, if this backend took one
done

echo
echo "== tests per backend"
printf '  %s\n' "${summary[@]}"
echo "total: $total_passed passed, $total_failed failed"
exit $status
