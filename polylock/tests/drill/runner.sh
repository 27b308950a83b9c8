#!/usr/bin/env bash
# One polylock client of the migration drill: runs `polylock run` in a loop,
# reading its phase and URL from URL_FILE before each run, so the harness
# moves it to another phase by rewriting that file. Stops when STOP_FILE
# exists.
# usage: runner.sh POLYLOCK CLIENT NAME URL_FILE REGISTER_PORT LOG_FILE STOP_FILE
set -u
polylock=$1 client=$2 name=$3 urls=$4 port=$5 log=$6 stop=$7
here=$(dirname "$0")
while [ ! -e "$stop" ]; do
  read -r phase url <"$urls"
  "$polylock" --url "$url" run -w 2s --ttl 5s "$name" -- \
    bash "$here/section.sh" "$client" "$phase" "$port" "$log" || true
  sleep "0.0$((RANDOM % 3))"
done
