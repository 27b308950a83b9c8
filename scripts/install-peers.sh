#!/usr/bin/env bash
# Installs the real foreign lock clients that backend-redis's interop tests
# (backend-redis/tests/peers.rs) run against polylock: redis-py in a venv
# and node-redlock 5 + ioredis in node_modules, both under
# backend-redis/tests/peers/ (git-ignored). Idempotent and fast when they
# are present: nothing is fetched when the installed versions match.
set -euo pipefail
cd "$(dirname "$0")/../backend-redis/tests/peers"

# The versions the tests were written against.
REDIS_PY=redis==5.2.1

sudo=()
if ((EUID != 0)); then
  sudo=(sudo)
fi
apt_install() {
  "${sudo[@]}" apt-get update -qq
  "${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "$@"
}

if ! command -v python3 >/dev/null 2>&1; then
  apt_install python3 python3-venv
fi
if ! command -v npm >/dev/null 2>&1; then
  apt_install nodejs npm
fi

# redis-py
if ! .venv/bin/python -c "import redis, sys; sys.exit(redis.__version__ != '${REDIS_PY#redis==}')" 2>/dev/null; then
  rm -rf .venv
  if ! python3 -m venv .venv 2>/dev/null; then
    # Debian splits venv (ensurepip) into its own package.
    apt_install python3-venv
    python3 -m venv .venv
  fi
  .venv/bin/pip install --quiet --disable-pip-version-check "$REDIS_PY"
  echo "install-peers: redis-py installed"
fi

# node-redlock 5 (a beta: the `latest` tag is 4.x, with another API) and
# ioredis, pinned by package.json and package-lock.json.
if ! node -e "process.exit(require('./node_modules/redlock/package.json').version === 'v5.0.0-beta.2' && require('./node_modules/ioredis') ? 0 : 1)" 2>/dev/null; then
  if [[ -f package-lock.json ]]; then
    npm ci --silent --no-audit --no-fund
  else
    npm install --silent --no-audit --no-fund
  fi
  echo "install-peers: redlock and ioredis installed"
fi
echo "install-peers: peers ready"
