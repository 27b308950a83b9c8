#!/usr/bin/env bash
# The one command that passes polylock's tests on a fresh Debian machine:
# installs the lock servers the test kit spawns (nothing is started as a
# system service; the tests start their own on free loopback ports), then
# runs every test of the workspace, conformance suite included. A test that
# fails is run once more by itself (scripts/run-tests.py): it is reported as
# FLAKY if it passes then, and fails the run if it fails again.
set -euo pipefail
cd "$(dirname "$0")/.."

scripts/install-deps.sh
exec python3 scripts/run-tests.py "$@"
