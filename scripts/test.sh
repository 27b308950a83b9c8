#!/usr/bin/env bash
# The one command that passes polylock's tests on a fresh Debian machine:
# installs the lock servers the test kit spawns (nothing is started as a
# system service; the tests start their own on free loopback ports), then
# runs every test of the workspace, conformance suite included.
set -euo pipefail
cd "$(dirname "$0")/.."

scripts/install-deps.sh
cargo test --workspace --locked --no-fail-fast "$@"
