"""A client of the legacy fleet in the migration drill (polylock/tests/
migration_drill.rs): it knows nothing of polylock and locks NAME on Redis
the way such clients do in the field, then reports its critical sections
to the fenced register (testkit::register) over its line protocol.

usage: legacy_client.py redis-py|setnx REDIS_URL NAME CLIENT REGISTER_PORT STOP_FILE
- redis-py: redis-py's own `Redis.lock(NAME)`;
- setnx:    hand-rolled `SET NAME token NX PX 5000` and the classic
            compare-and-delete script.
Loops until STOP_FILE exists. Unfenced: it reports the token `-`.
"""

import os
import random
import socket
import sys
import time
import uuid

import redis
from redis.exceptions import LockNotOwnedError

UNLOCK = (
    "if redis.call('get', KEYS[1]) == ARGV[1] then "
    "return redis.call('del', KEYS[1]) else return 0 end"
)


def main() -> None:
    mode, url, name, client, port, stop = sys.argv[1:]
    r = redis.Redis.from_url(url)
    reg = socket.create_connection(("127.0.0.1", int(port)))
    f = reg.makefile("rw")

    def say(line: str) -> str:
        f.write(line + "\n")
        f.flush()
        return f.readline().strip()

    while not os.path.exists(stop):
        if mode == "redis-py":
            lock = r.lock(name, timeout=5, sleep=0.01, blocking_timeout=1)
            if not lock.acquire():
                continue
        else:
            token = uuid.uuid4().hex
            deadline = time.monotonic() + 1
            got = False
            while time.monotonic() < deadline:
                if r.set(name, token, nx=True, px=5000):
                    got = True
                    break
                time.sleep(0.01)
            if not got:
                continue
        say(f"GRANT {client} -")
        say(f"ENTER {client} -")
        time.sleep(0.03)
        say(f"WRITE {client} -")
        say(f"EXIT {client}")
        if mode == "redis-py":
            try:
                lock.release()
                say(f"RELEASE {client} ok")
            except LockNotOwnedError:
                say(f"RELEASE {client} lost")
        else:
            ok = r.eval(UNLOCK, 1, name, token)
            say(f"RELEASE {client} {'ok' if ok else 'lost'}")
        time.sleep(random.uniform(0, 0.03))


if __name__ == "__main__":
    main()
