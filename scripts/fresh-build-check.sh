#!/usr/bin/env bash
# Proves that a machine with only the Rust toolchain and a C compiler builds
# and runs polylock from the README alone.
#
# Runs itself again in a private mount namespace (root: CI runs as root) where
# protoc and the protobuf include files are hidden: a failing stub is bound
# over every protoc on the machine and an empty folder over every
# google/protobuf include folder. Inside, it
#   1. builds the polylock binary (default features, etcd included) and runs
#      the README's quick-start command on the SQLite default, checking its
#      output and that it leaves no untracked file in the repository;
#   2. builds and runs the README's library example as a new project would:
#      the README's Cargo.toml lines and Rust example, in a folder outside
#      the repository, with a path dependency on this checkout.
# A default build that comes to need a system package fails here.
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)

if [[ "${1-}" != --hidden ]]; then
  if ((EUID != 0)); then
    exec sudo unshare --mount --propagation private "$0" --hidden
  fi
  exec unshare --mount --propagation private "$0" --hidden
fi

scratch=$(mktemp -d)
hidden=()
cleanup() {
  for p in "${hidden[@]}"; do umount "$p" 2>/dev/null || true; done
  rm -rf "$scratch"
}
trap cleanup EXIT

# --- hide the build tools -------------------------------------------------
cat >"$scratch/no-protoc" <<'STUB'
#!/bin/sh
echo "protoc is hidden by scripts/fresh-build-check.sh: the default build must not need it" >&2
exit 127
STUB
chmod +x "$scratch/no-protoc"
mkdir "$scratch/empty"
for p in /usr/bin/protoc /usr/local/bin/protoc /bin/protoc $(type -ap protoc || true); do
  p=$(readlink -f "$p" 2>/dev/null || echo "$p")
  if [[ -e "$p" && " ${hidden[*]-} " != *" $p "* ]]; then
    mount --bind "$scratch/no-protoc" "$p"
    hidden+=("$p")
  fi
done
for d in /usr/include/google/protobuf /usr/local/include/google/protobuf; do
  if [[ -d "$d" && " ${hidden[*]-} " != *" $d "* ]]; then
    mount --bind "$scratch/empty" "$d"
    hidden+=("$d")
  fi
done
unset PROTOC PROTOC_INCLUDE
echo "fresh-build-check: hidden: ${hidden[*]:-nothing (none installed)}"

# --- 1. the README's quick start ------------------------------------------
cd "$repo"
quick_start=$(grep -m1 -E '^cargo run --release -p polylock -- run nightly-report -- ' README.md) || {
  echo "fresh-build-check: the README's quick-start command is gone; update this check" >&2
  exit 1
}
echo "fresh-build-check: \$ $quick_start"
untracked_before=$(git status --porcelain --untracked-files=all | grep '^??' || true)
out=$(eval "$quick_start")
echo "$out"
expected=$(sed -E 's/.*-- echo "(.*)"$/\1/' <<<"$quick_start")
if [[ "$out" != "$expected" ]]; then
  echo "fresh-build-check: the quick start printed '$out', not '$expected'" >&2
  exit 1
fi
untracked=$(comm -13 <(echo "$untracked_before") \
  <(git status --porcelain --untracked-files=all | grep '^??' || true))
if [[ -n "$untracked" ]]; then
  echo "fresh-build-check: the quick start left untracked files:" >&2
  echo "$untracked" >&2
  exit 1
fi

# --- 2. the README's library example in a project of its own --------------
app="$scratch/my-app"
mkdir -p "$app/src" "$app/.cargo"
# The first ```toml block is the dependency snippet, the first ```rust block
# the example; the snippet's path points at a checkout, here this one.
awk '/^```toml/{f=1;next} /^```/{if(f){exit}} f' README.md >"$scratch/deps.toml"
awk '/^```rust/{f=1;next} /^```/{if(f){exit}} f' README.md >"$app/src/main.rs"
grep -q '^polylock = ' "$scratch/deps.toml" || {
  echo "fresh-build-check: no 'polylock = ' line in the README's Cargo.toml snippet" >&2
  exit 1
}
{
  printf '[package]\nname = "my-app"\nversion = "0.1.0"\nedition = "2021"\n\n'
  sed -E "s#path = \"[^\"]*\"#path = \"$repo/polylock\"#" "$scratch/deps.toml"
} >"$app/Cargo.toml"
# The line the README tells library users to add for the etcd feature.
protoc_line=$(grep -m1 -E '^PROTOC = ' README.md) || {
  echo "fresh-build-check: the README no longer shows the PROTOC line for library users" >&2
  exit 1
}
printf '[env]\n%s\n' "${protoc_line/\/path\/to\/polylock/$repo}" >"$app/.cargo/config.toml"
# The workspace's lock file keeps the dependency versions the same, so the
# build reuses what step 1 compiled where features agree.
cp "$repo/Cargo.lock" "$app/"
echo "fresh-build-check: building the README example as a new project ($app)"
(cd "$app" && CARGO_TARGET_DIR="$repo/target" cargo run --release --quiet) | tee "$scratch/example.out"
grep -q 'fencing token' "$scratch/example.out" || {
  echo "fresh-build-check: the README example did not print its fencing token" >&2
  exit 1
}
echo "fresh-build-check: ok"
