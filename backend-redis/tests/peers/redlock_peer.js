// A node-redlock 5 client (over ioredis) driven over stdin/stdout by
// backend-redis's interop tests (tests/peers.rs). It locks the name the way
// node-redlock users do, `redlock.acquire([NAME], ttl)`, knowing nothing of
// polylock.
//
// usage: node redlock_peer.js URL[,URL...] [cluster]
// (several URLs: one client per independent node, Redlock's quorum over them)
// commands, one per line; one reply line each:
//   acquire NAME TTL_MS WAIT_MS  -> acquired | busy
//   release NAME                 -> released | not-owned
//   quit
"use strict";

const readline = require("node:readline");
const Redis = require("ioredis");
const { default: Redlock, ExecutionError } = require("redlock");

const RETRY_DELAY_MS = 50;

async function main() {
  const urls = process.argv[2].split(",");
  const url = new URL(urls[0]);
  const clients =
    process.argv[3] === "cluster"
      ? [new Redis.Cluster([{ host: url.hostname, port: Number(url.port) }])]
      : urls.map((u) => new Redis(u));
  await Promise.all(clients.map((c) => c.ping()));
  const locks = new Map();
  console.log("ready");
  const lines = readline.createInterface({ input: process.stdin });
  for await (const line of lines) {
    const words = line.trim().split(/\s+/);
    if (words[0] === "quit") break;
    if (words[0] === "acquire") {
      const [name, ttl, wait] = [words[1], Number(words[2]), Number(words[3])];
      const redlock = new Redlock(clients, {
        retryCount: Math.ceil(wait / RETRY_DELAY_MS),
        retryDelay: RETRY_DELAY_MS,
        retryJitter: 10,
        automaticExtensionThreshold: 0,
      });
      try {
        locks.set(name, await redlock.acquire([name], ttl));
        console.log("acquired");
      } catch (e) {
        if (!(e instanceof ExecutionError)) throw e;
        console.log("busy");
      }
    } else if (words[0] === "release") {
      const lock = locks.get(words[1]);
      locks.delete(words[1]);
      try {
        await lock.release();
        console.log("released");
      } catch (e) {
        if (!(e instanceof ExecutionError)) throw e;
        console.log("not-owned");
      }
    } else {
      console.log(`error: unknown command ${words[0]}`);
    }
  }
  clients.forEach((c) => c.disconnect());
}

main().catch((e) => {
  console.error(e);
  process.exit(1);
});
