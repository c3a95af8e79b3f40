#!/usr/bin/env bash
# Creates .venv and installs the project with every driver and test tool into it.
# mysqlclient compiles against the MariaDB/MySQL client headers: installed from the system's
# packages when missing (needs root or sudo).
# Usage: scripts/bootstrap.sh [--browser]   --browser: also Debian's Chromium and ChromeDriver,
# which only the admin's browser test needs (scripts/test.sh asks for them; `make memcheck` and
# the other targets do not). BOOTSTRAP_PLAN=1: print the system packages it would install, and
# stop there (nothing installed; the suite tests the plan).
set -euo pipefail
cd "$(dirname "$0")/.."

browser=0
for arg in "$@"; do
  case "$arg" in
    --browser) browser=1 ;;
    *) echo "bootstrap: unknown argument $arg (known: --browser)" >&2; exit 2 ;;
  esac
done
CHROMIUM=${BOOTSTRAP_CHROMIUM:-/usr/bin/chromium}
CHROMEDRIVER=${BOOTSTRAP_CHROMEDRIVER:-/usr/bin/chromedriver}

as_root() { if [ "$(id -u)" = 0 ]; then "$@"; else sudo "$@"; fi; }

apt_install() {
  if [ -n "${BOOTSTRAP_PLAN:-}" ]; then echo "bootstrap plan: system packages: $*"; return; fi
  echo "bootstrap: installing system packages: $*" >&2
  as_root apt-get update -qq
  DEBIAN_FRONTEND=noninteractive as_root apt-get install -y -qq "$@" >/dev/null
}

if ! pkg-config --exists mysqlclient 2>/dev/null && ! pkg-config --exists libmariadb 2>/dev/null; then
  apt_install pkg-config libmariadb-dev build-essential python3-dev
fi
# The admin's end-to-end test drives Debian's Chromium through its ChromeDriver (no browser
# downloads: Selenium is given both paths). Only when asked: the main job needs no browser.
if [ "$browser" = 1 ] && { [ ! -x "$CHROMIUM" ] || [ ! -x "$CHROMEDRIVER" ]; }; then
  apt_install chromium chromium-driver
fi
if [ -n "${BOOTSTRAP_PLAN:-}" ]; then exit 0; fi

PYTHON=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  echo "bootstrap: creating .venv with $($PYTHON --version)" >&2
  "$PYTHON" -m venv .venv
fi

# Reinstall only when the requirements or the package metadata changed.
stamp=.venv/.agentmemory-requirements
want=$(cat requirements.txt pyproject.toml | sha256sum | cut -d' ' -f1)
if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
  echo "bootstrap: installing requirements.txt into .venv" >&2
  .venv/bin/python -m pip install -q --upgrade pip >/dev/null
  .venv/bin/python -m pip install -q -r requirements.txt
  echo "$want" > "$stamp"
fi
