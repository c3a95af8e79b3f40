#!/usr/bin/env bash
# Makes sure MariaDB, PostgreSQL and Redis answer on 127.0.0.1 (installing them from the system's
# packages if absent, starting them if down) and creates the `agentmemory` databases.
# Exits non-zero naming the server that could not be reached and how to start it.
set -uo pipefail

as_root() { if [ "$(id -u)" = 0 ]; then "$@"; else sudo "$@"; fi; }

wait_for() {  # wait_for NAME COMMAND...: up to 60 s
  for _ in $(seq 1 120); do "${@:2}" >/dev/null 2>&1 && return 0; sleep 0.5; done
  return 1
}

fail() { echo "services: $1 is not reachable. $2" >&2; exit 1; }

apt_install() {
  echo "services: installing $*" >&2
  as_root apt-get update -qq && DEBIAN_FRONTEND=noninteractive as_root apt-get install -y -qq "$@" >/dev/null
}

# --- MariaDB (root, empty password, 127.0.0.1:3306)
mariadb_up() { mysqladmin --protocol=TCP -h127.0.0.1 -uroot ping; }
if ! mariadb_up >/dev/null 2>&1; then
  command -v mariadbd >/dev/null || [ -x /usr/sbin/mariadbd ] || apt_install mariadb-server mariadb-client
  echo "services: starting MariaDB" >&2
  if [ -x /etc/init.d/mariadb ]; then
    as_root /etc/init.d/mariadb start >/dev/null 2>&1  # mysqld_safe, as the mysql user
  else
    as_root start-stop-daemon --start --oknodo --background --exec /usr/sbin/mariadbd -- --user=mysql >/dev/null 2>&1
  fi
  wait_for mariadb mariadb_up || true
  if ! mariadb_up >/dev/null 2>&1 && as_root mysql -uroot -e "SELECT 1" >/dev/null 2>&1; then
    # A fresh Debian install authenticates root by unix socket only: allow TCP with no password.
    as_root mysql -uroot -e "ALTER USER 'root'@'localhost' IDENTIFIED VIA mysql_native_password USING PASSWORD('') OR unix_socket; FLUSH PRIVILEGES;"
  fi
  mariadb_up >/dev/null 2>&1 || fail MariaDB "Start it with: /etc/init.d/mariadb start"
fi
mysql --protocol=TCP -h127.0.0.1 -uroot -e "CREATE DATABASE IF NOT EXISTS agentmemory CHARACTER SET utf8mb4" \
  || fail MariaDB "root@127.0.0.1 with an empty password must be able to create databases."

# --- PostgreSQL (postgres, trust, 127.0.0.1:5432)
postgres_up() { pg_isready -q -h 127.0.0.1 -p 5432; }
if ! postgres_up >/dev/null 2>&1; then
  command -v pg_ctlcluster >/dev/null || apt_install postgresql postgresql-client
  version=$(ls /etc/postgresql 2>/dev/null | sort -V | tail -n1)
  hba=/etc/postgresql/$version/main/pg_hba.conf
  if [ -f "$hba" ] && ! grep -q "agentmemory: trust" "$hba"; then
    # Local test server only: trust loopback connections, as the CI machines do.
    as_root sed -i '1i # agentmemory: trust loopback for the test suite\nhost all all 127.0.0.1/32 trust\nhost all all ::1/128 trust' "$hba"
  fi
  echo "services: starting PostgreSQL $version" >&2
  as_root pg_ctlcluster --skip-systemctl-redirect "$version" main start >/dev/null 2>&1
  wait_for postgres postgres_up || fail PostgreSQL "Start it with: pg_ctlcluster --skip-systemctl-redirect \$(ls /etc/postgresql) main start"
fi
psql -h 127.0.0.1 -U postgres -tAc "SELECT 1 FROM pg_database WHERE datname='agentmemory'" | grep -q 1 \
  || psql -q -h 127.0.0.1 -U postgres -c "CREATE DATABASE agentmemory" \
  || fail PostgreSQL "postgres@127.0.0.1 (trust) must be able to create databases."

# --- Redis (127.0.0.1:6379)
redis_up() { redis-cli -h 127.0.0.1 -p 6379 ping | grep -q PONG; }
if ! redis_up >/dev/null 2>&1; then
  command -v redis-server >/dev/null || apt_install redis-server
  echo "services: starting Redis" >&2
  mkdir -p /tmp/agentmemory-redis
  redis-server --daemonize yes --bind 127.0.0.1 --port 6379 --save "" --appendonly no \
    --dir /tmp/agentmemory-redis --logfile /tmp/agentmemory-redis/redis.log >/dev/null
  wait_for redis redis_up || fail Redis "Start it with: redis-server --daemonize yes --bind 127.0.0.1 --port 6379"
fi
echo "services: MariaDB, PostgreSQL and Redis are up" >&2
