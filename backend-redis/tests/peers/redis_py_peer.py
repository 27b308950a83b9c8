"""A redis-py `Lock` client driven over stdin/stdout by backend-redis's
interop tests (tests/peers.rs). It locks the name the way redis-py users
do, `Redis.lock(NAME)`, knowing nothing of polylock.

usage: redis_py_peer.py URL [cluster]
commands, one per line; one reply line each:
  acquire NAME TTL_MS WAIT_MS  -> acquired | busy
  release NAME                 -> released | not-owned
  quit
"""

import sys

import redis
from redis.cluster import RedisCluster
from redis.exceptions import LockNotOwnedError


def main() -> None:
    url = sys.argv[1]
    if len(sys.argv) > 2 and sys.argv[2] == "cluster":
        client = RedisCluster.from_url(url)
    else:
        client = redis.Redis.from_url(url)
    client.ping()
    locks = {}
    print("ready", flush=True)
    for line in sys.stdin:
        words = line.split()
        if not words:
            continue
        if words[0] == "quit":
            break
        if words[0] == "acquire":
            name, ttl_ms, wait_ms = words[1], int(words[2]), int(words[3])
            lock = client.lock(name, timeout=ttl_ms / 1000)
            if wait_ms > 0:
                got = lock.acquire(blocking=True, blocking_timeout=wait_ms / 1000)
            else:
                got = lock.acquire(blocking=False)
            if got:
                locks[name] = lock
            print("acquired" if got else "busy", flush=True)
        elif words[0] == "release":
            lock = locks.pop(words[1])
            try:
                lock.release()
                print("released", flush=True)
            except LockNotOwnedError:
                print("not-owned", flush=True)
        else:
            print(f"error: unknown command {words[0]}", flush=True)


if __name__ == "__main__":
    main()
