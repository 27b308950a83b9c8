#!/usr/bin/env python3
"""Runs the workspace tests, then once more each test that failed, by itself.

The tests run against real servers (redis-server, etcd, ZooKeeper, PostgreSQL,
MariaDB) on a 2-core machine shared with the build and with each other. A
test that fails once under that load and passes when run again alone is
reported by name as FLAKY, so it is seen and can be fixed; it does not fail
the run. A test that fails twice fails the run, as does any failure that is
not a test's (a build error, a binary that did not start), and so does a run
with more failures than a loaded machine explains (MAX_RETRIED): that is a
breakage, not noise.

Usage: scripts/run-tests.py [cargo test arguments...]
Arguments after `--` go to the test binaries of the first run only.
       scripts/run-tests.py --self-test
checks this script on a throw-away crate with a test that fails once, one
that always fails, and one that passes (.ci/run runs it).
"""

import os
import re
import subprocess
import sys
import tempfile

MAX_RETRIED = 8

# Off in the self-test, whose deliberate failures would read like real ones
# in a CI log; its verdict lines say what happened.
ECHO = True

RERUN = re.compile(r"error: test failed, to rerun pass `([^`]*)`")
RESULT = re.compile(r"test result: (ok|FAILED)\. (\d+) passed; (\d+) failed")


def say(text):
    if ECHO:
        print(text, flush=True)


def run(args, cwd=None):
    """Runs cargo, streaming its output; returns (exit code, lines)."""
    say("+ cargo " + " ".join(args))
    proc = subprocess.Popen(
        ["cargo", *args],
        cwd=cwd,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        errors="replace",
    )
    lines = []
    for line in proc.stdout:
        if ECHO:
            sys.stdout.write(line)
            sys.stdout.flush()
        lines.append(line.rstrip("\n"))
    return proc.wait(), lines


def failed_targets(lines):
    """[(cargo args of a test target, [names of its failed tests])].

    libtest ends a failing binary's output with a "failures:" list of names
    (indented by four spaces) and cargo then names the target to rerun. The
    first "failures:" block holds the captured output; a second one resets
    the list, so only the names block before the rerun line counts."""
    targets = []
    names = []
    in_list = False
    for line in lines:
        m = RERUN.search(line)
        if m:
            targets.append((m.group(1).split(), names))
            names, in_list = [], False
        elif line == "failures:":
            names, in_list = [], True
        elif in_list and line.startswith("    ") and not line.startswith("     "):
            names.append(line.strip())
        elif in_list and line.startswith("test result:"):
            in_list = False
    return targets


def totals(lines):
    passed = failed = 0
    for line in lines:
        m = RESULT.search(line)
        if m:
            passed += int(m.group(2))
            failed += int(m.group(3))
    return passed, failed


def main(args, cwd=None):
    cargo_args, _, test_args = (
        (args[: args.index("--")], "--", args[args.index("--") + 1 :])
        if "--" in args
        else (args, "", [])
    )
    first = ["test", "--workspace", "--locked", "--no-fail-fast", *cargo_args]
    if test_args:
        first += ["--", *test_args]
    code, lines = run(first, cwd)
    passed, failed = totals(lines)
    if code == 0:
        say(f"summary: {passed} passed, {failed} failed")
        return 0

    targets = failed_targets(lines)
    count = sum(len(names) for _, names in targets)
    if not targets or any(not names for _, names in targets):
        say(
            "run-tests: cargo failed outside a test's assertions (a build error or a "
            "test binary that did not run to its end); not retried"
        )
        return code
    if count > MAX_RETRIED:
        say(
            f"run-tests: {count} tests failed, more than the {MAX_RETRIED} a loaded "
            "machine explains; not retried"
        )
        return code

    flaky, broken = [], []
    for target, names in targets:
        for name in names:
            again, _ = run(["test", "--locked", *target, "--", "--exact", name], cwd)
            (flaky if again == 0 else broken).append(f"{' '.join(target)} :: {name}")

    for name in flaky:
        say(f"FLAKY (failed, then passed alone): {name}")
    for name in broken:
        say(f"FAILED TWICE: {name}")
    # `passed` already counts every test that passed the first time.
    say(f"summary: {passed + len(flaky)} passed, {len(broken)} failed")
    return 1 if broken else 0


SELF_TEST_CRATE = r"""
#[test]
fn steady() {}

/// Fails on its first run in a directory, passes on the next.
#[test]
fn once() {
    let marker = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("ran-once");
    let first = !marker.exists();
    std::fs::write(&marker, b"").unwrap();
    assert!(!first, "the first run fails");
}

#[test]
fn always() {
    assert!(std::env::var_os("SELF_TEST_BROKEN").is_none(), "always fails");
}
"""


def self_test():
    global ECHO
    ECHO = False
    with tempfile.TemporaryDirectory(prefix="run-tests-self-test-") as d:
        os.makedirs(os.path.join(d, "tests"))
        with open(os.path.join(d, "Cargo.toml"), "w") as f:
            f.write('[package]\nname = "selftest"\nversion = "0.0.0"\nedition = "2021"\n[workspace]\n')
        os.makedirs(os.path.join(d, "src"))
        open(os.path.join(d, "src", "lib.rs"), "w").close()
        with open(os.path.join(d, "tests", "t.rs"), "w") as f:
            f.write(SELF_TEST_CRATE)
        subprocess.run(["cargo", "generate-lockfile", "--offline"], cwd=d, check=True)
        env = dict(os.environ, CARGO_TARGET_DIR=os.path.join(d, "target"))
        os.environ.update(env)
        checks = []
        # A test that fails once and passes alone: the run passes.
        checks.append(("a flaky test passes the run", main([], d) == 0))
        # A test that fails every time: the run fails, even next to a flaky one.
        os.remove(os.path.join(d, "ran-once"))
        os.environ["SELF_TEST_BROKEN"] = "1"
        checks.append(("a test failing twice fails the run", main([], d) != 0))
        del os.environ["SELF_TEST_BROKEN"]
        # A build error is not retried into a pass.
        with open(os.path.join(d, "tests", "t.rs"), "a") as f:
            f.write("fn broken( {}\n")
        checks.append(("a build error fails the run", main([], d) != 0))
    for what, ok in checks:
        print(f"self-test: {what}: {'ok' if ok else 'WRONG'}", flush=True)
    return 0 if all(ok for _, ok in checks) else 1


if __name__ == "__main__":
    if sys.argv[1:] == ["--self-test"]:
        sys.exit(self_test())
    sys.exit(main(sys.argv[1:]))
