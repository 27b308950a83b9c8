#!/usr/bin/env bash
# The critical section of a polylock client in the migration drill, run by
# `polylock run`: reports to the fenced register with the fencing token
# polylock passes in POLYLOCK_FENCE (`-` in the legacy phase, whose Redis
# tokens are another sequence than the target's), then logs its phase.
# usage: section.sh CLIENT PHASE REGISTER_PORT LOG_FILE
set -eu
client=$1 phase=$2 port=$3 log=$4
token=$POLYLOCK_FENCE
if [ "$phase" = legacy ]; then token=-; fi
exec 3<>"/dev/tcp/127.0.0.1/$port"
say() { echo "$1" >&3; read -r _ <&3; }
say "GRANT $client $token"
say "ENTER $client $token"
sleep 0.03
say "WRITE $client $token"
say "EXIT $client"
echo "$phase" >>"$log"
