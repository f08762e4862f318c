// The served client (src/protocol/wspush.js) on its own, in Node, with a
// stand-in WebSocket and timers that only record what they are asked:
// how 1,000 clients of a server that went away spread their reconnects,
// and what a client does with a gap status. Run by run.sh with Node's
// test runner (`node --test`); needs nothing installed.
import assert from "node:assert/strict";
import fs from "node:fs";
import { test } from "node:test";
import vm from "node:vm";

const source = fs.readFileSync(new URL("../../src/protocol/wspush.js", import.meta.url), "utf8");

// wspush.js loaded in a context of its own: the sockets it opens and the
// timers it sets are recorded, nothing runs by itself.
function load() {
  const sockets = [];
  const timers = [];
  class StandIn {
    constructor(url) {
      this.url = url;
      sockets.push(this);
    }
    close() {}
  }
  const context = {
    WebSocket: StandIn,
    URL,
    location: { href: "https://push.example/" },
    setTimeout: (run, ms) => timers.push({ run, ms }),
    clearTimeout() {},
  };
  vm.runInNewContext(source, context);
  return { wspush: context.wspush, sockets, timers };
}

// The bound on any 100-ms bucket of 1,000 first reconnects: twice the
// mean of a spread over 2.5 s (40 a bucket).
const FIRST_SPREAD_MS = [500, 3000];
const BUCKET_BOUND = 80;

function buckets(delays) {
  const counts = new Map();
  for (const ms of delays) {
    const bucket = Math.floor(ms / 100);
    counts.set(bucket, (counts.get(bucket) ?? 0) + 1);
  }
  return counts;
}

test("1,000 clients closed at once come back spread over seconds, no 100-ms bucket over the bound", () => {
  const { wspush, sockets, timers } = load();
  for (let i = 0; i < 1000; i++) wspush.connect("wss://push.example/", {});
  assert.equal(sockets.length, 1000);
  for (const socket of sockets) {
    socket.onopen();
    socket.onclose({ code: 1001 });
  }
  const first = timers.map((t) => t.ms);
  assert.equal(first.length, 1000, "each one waits to reconnect");
  const [low, high] = FIRST_SPREAD_MS;
  assert.ok(Math.min(...first) >= low && Math.max(...first) <= high, `within ${low}-${high} ms`);
  const counts = buckets(first);
  const fullest = Math.max(...counts.values());
  assert.ok(fullest <= BUCKET_BOUND, `the fullest 100-ms bucket holds ${fullest} of 1,000`);
  assert.ok(counts.size >= 20, `spread over ${counts.size} buckets of the 25`);

  // They reconnect, and the server goes away again before they were
  // open long: the next wait is spread over twice as long.
  const reconnects = timers.splice(0);
  for (const timer of reconnects) timer.run();
  assert.equal(sockets.length, 2000, "each one reconnected");
  for (const socket of sockets.slice(1000)) {
    socket.onopen();
    socket.onclose({ code: 1001 });
  }
  const second = timers.map((t) => t.ms);
  assert.ok(Math.min(...second) >= low && Math.max(...second) <= 2 * high);
  const fullestAgain = Math.max(...buckets(second).values());
  assert.ok(fullestAgain <= BUCKET_BOUND / 2 + 20, `the fullest bucket of the second wait holds ${fullestAgain}`);
});

test("a gap status is handed to ongap with both ends, and a resume goes on after its end", () => {
  const { wspush, sockets, timers } = load();
  const gaps = [];
  const messages = [];
  const push = wspush.connect("wss://push.example/", {
    since: "00000000000000ab.9",
    ongap: (...args) => gaps.push(args),
    onmessage: (data, position) => messages.push([data, position]),
  });
  assert.match(sockets[0].url, /[?&]since=00000000000000ab\.9(&|$)/);
  sockets[0].onopen();
  const receive = (data) => sockets[0].onmessage({ data });
  receive('{"status":"recovered","position":"00000000000000ab.12"}');
  receive('{"status":"gap","from":"00000000000000ab.10","to":"00000000000000ab.11","position":"00000000000000ab.30"}');
  assert.deepEqual(gaps, [["00000000000000ab.10", "00000000000000ab.11", "00000000000000ab.30"]]);
  assert.equal(push.position, "00000000000000ab.11", "what was lost is behind it");
  receive("00000000000000ab.12 twelve");
  assert.deepEqual(messages, [["twelve", "00000000000000ab.12"]]);
  receive('{"status":"gap","from":"00000000000000ab.13","to":"00000000000000ab.14","position":"00000000000000ab.30"}');
  sockets[0].onclose({ code: 1006 });
  timers.splice(0)[0].run();
  assert.match(sockets[1].url, /[?&]since=00000000000000ab\.14(&|$)/, "resumes after the gap's end");
  push.close();
});

test("a drain's hint sets the wait before the reconnect, once, and the backoff starts over", () => {
  const { wspush, sockets, timers } = load();
  const push = wspush.connect("wss://push.example/", {});
  sockets[0].onopen();
  sockets[0].onmessage({ data: '{"status":"position","position":"00000000000000ab.3"}' });
  sockets[0].onmessage({ data: '{"status":"reconnect","delay_ms":37}' });
  sockets[0].onclose({ code: 1012 });
  assert.deepEqual(timers.map((t) => t.ms), [37], "the hint's delay, not the backoff's");
  timers.splice(0)[0].run();
  assert.match(sockets[1].url, /[?&]since=00000000000000ab\.3(&|$)/, "resumes where it was");
  // The next close has no hint: the backoff, from its first ceiling.
  sockets[1].onclose({ code: 1006 });
  const [next] = timers.map((t) => t.ms);
  assert.ok(next >= 500 && next <= 3000, `a first backoff: ${next} ms`);
  push.close();
});

test("getToken gives each connection its token, and a 4001 reconnects at once with the next", async () => {
  const { wspush, sockets, timers } = load();
  let issued = 0;
  const push = wspush.connect("wss://push.example/", { getToken: () => Promise.resolve(`t${++issued}`) });
  await new Promise((resolve) => setImmediate(resolve));
  assert.equal(sockets.length, 1);
  assert.equal(new URL(sockets[0].url).searchParams.get("token"), "t1");
  sockets[0].onopen();
  sockets[0].onmessage({ data: '{"status":"position","position":"e.5"}' });
  sockets[0].onmessage({ data: "e.6 hello" });
  sockets[0].onclose({ code: 4001 });
  await new Promise((resolve) => setImmediate(resolve));
  assert.equal(timers.length, 0, "no backoff after an expiry");
  assert.equal(sockets.length, 2);
  const again = new URL(sockets[1].url).searchParams;
  assert.equal(again.get("token"), "t2");
  assert.equal(again.get("since"), "e.6", "it resumes where it was");
  // Any other close waits, and then asks for a token again.
  sockets[1].onclose({ code: 1006 });
  assert.equal(timers.length, 1);
  timers.pop().run();
  await new Promise((resolve) => setImmediate(resolve));
  assert.equal(new URL(sockets[2].url).searchParams.get("token"), "t3");
  // A getToken that fails is retried with the backoff.
  const failing = wspush.connect("wss://push.example/", { getToken: () => Promise.reject(new Error("offline")) });
  await new Promise((resolve) => setImmediate(resolve));
  assert.equal(sockets.length, 3, "no socket without a token");
  assert.equal(timers.length, 1, "a retry is set");
  push.close();
  failing.close();
});
