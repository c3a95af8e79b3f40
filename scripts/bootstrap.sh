#!/usr/bin/env bash
# Creates .venv and installs the project with every driver and test tool into it.
# mysqlclient compiles against the MariaDB/MySQL client headers: installed from the system's
# packages when missing (needs root or sudo).
# Usage: scripts/bootstrap.sh [--browser] [--core [--report]]
#   --browser: also Debian's Chromium and ChromeDriver, which only the admin's browser test needs
#     (scripts/test.sh asks for them; `make memcheck` and the other targets do not);
#   --core: only what `make memcheck` needs (requirements-core.txt: the package -- Django -- and
#     the demo project's URL parser): no compiler, no system headers, no framework adapters;
#     nothing when .venv already holds everything (requirements.txt); --report: and the report's
#     plotting (the `report` extra).
# BOOTSTRAP_PLAN=1: print what it would install (system packages, requirements), and stop there
# (nothing installed; the suite tests the plan).
set -euo pipefail
cd "$(dirname "$0")/.."

browser=0
core=0
report=0
for arg in "$@"; do
  case "$arg" in
    --browser) browser=1 ;;
    --core) core=1 ;;
    --report) report=1 ;;
    *) echo "bootstrap: unknown argument $arg (known: --browser, --core, --report)" >&2; exit 2 ;;
  esac
done
PKG_CONFIG=${BOOTSTRAP_PKG_CONFIG:-pkg-config}
CHROMIUM=${BOOTSTRAP_CHROMIUM:-/usr/bin/chromium}
CHROMEDRIVER=${BOOTSTRAP_CHROMEDRIVER:-/usr/bin/chromedriver}

as_root() { if [ "$(id -u)" = 0 ]; then "$@"; else sudo "$@"; fi; }

apt_install() {
  if [ -n "${BOOTSTRAP_PLAN:-}" ]; then echo "bootstrap plan: system packages: $*"; return; fi
  echo "bootstrap: installing system packages: $*" >&2
  as_root apt-get update -qq
  DEBIAN_FRONTEND=noninteractive as_root apt-get install -y -qq "$@" >/dev/null
}

if [ "$core" = 0 ] && ! "$PKG_CONFIG" --exists mysqlclient 2>/dev/null \
  && ! "$PKG_CONFIG" --exists libmariadb 2>/dev/null; then
  apt_install pkg-config libmariadb-dev build-essential python3-dev
fi
# The admin's end-to-end test drives Debian's Chromium through its ChromeDriver (no browser
# downloads: Selenium is given both paths). Only when asked: the main job needs no browser.
if [ "$browser" = 1 ] && { [ ! -x "$CHROMIUM" ] || [ ! -x "$CHROMEDRIVER" ]; }; then
  apt_install chromium chromium-driver
fi
if [ "$core" = 1 ]; then
  requirements=(-r requirements-core.txt)
  if [ "$report" = 1 ]; then requirements+=(-e ".[report]"); fi
else
  requirements=(-r requirements.txt)
fi
if [ -n "${BOOTSTRAP_PLAN:-}" ]; then
  echo "bootstrap plan: python requirements: ${requirements[*]}"
  exit 0
fi

PYTHON=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  echo "bootstrap: creating .venv with $($PYTHON --version)" >&2
  "$PYTHON" -m venv .venv
fi

# Reinstall only when the requirements or the package metadata changed. Everything
# (requirements.txt) holds what --core asks for.
stamp=.venv/.agentmemory-requirements
want=$(cat requirements.txt pyproject.toml | sha256sum | cut -d' ' -f1)
if [ "$core" = 1 ]; then
  if [ "$(cat "$stamp" 2>/dev/null)" = "$want" ]; then exit 0; fi
  stamp=.venv/.agentmemory-core
  want=$(cat requirements-core.txt pyproject.toml <(echo "report=$report") | sha256sum | cut -d' ' -f1)
fi
if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
  echo "bootstrap: installing ${requirements[*]} into .venv" >&2
  # (--core: the interpreter's own pip is recent enough for what it installs)
  if [ "$core" = 0 ]; then .venv/bin/python -m pip install -q --upgrade pip >/dev/null; fi
  .venv/bin/python -m pip install -q "${requirements[@]}"
  echo "$want" > "$stamp"
fi
