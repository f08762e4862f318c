// wspush in a real browser: headless Chromium, driven by playwright-core,
// against wspush servers on 127.0.0.1 (each check starts its own on a free
// port). Every check prints PASS or FAIL with its name; the last line is
// "N passed, N failed" and the exit status is 1 if any failed.
//
// Run by run.sh, which passes in the environment:
//   WSPUSH_BIN              the wspush binary
//   WSPUSH_BROWSER_MODULES  a node_modules directory holding playwright-core
//   WSPUSH_CHROMIUM         the Chromium executable

import crypto from "node:crypto";
import fs from "node:fs";
import { createRequire } from "node:module";
import net from "node:net";
import os from "node:os";
import path from "node:path";
import { BIN, Scope, WAIT_MS, assertEqual, check, die, finish, need, setUp, sleep, waitUntil } from "./harness.mjs";

/** Chromium's process (whose PID this script holds) and the client to it. */
let chromiumServer;
let browser;
let tmp;

setUp({
  label: "browser e2e",
  checkTimeoutMs: 30_000,
  runTimeoutMs: 100_000,
  newScope: () => new PageScope(),
  // Ends Chromium and removes the temporary directory, after the servers.
  cleanUp: () => {
    const chrome = chromiumServer?.process();
    if (chrome && chrome.exitCode === null && chrome.signalCode === null) chrome.kill("SIGKILL");
    if (tmp) fs.rmSync(tmp, { recursive: true, force: true });
  },
});
const CHROMIUM = need("WSPUSH_CHROMIUM");
const { chromium } = createRequire(path.join(need("WSPUSH_BROWSER_MODULES"), "x.js"))("playwright-core");

// ---------------------------------------------------------------- pages --

/**
 * What the demo page shows: its state, the closes it saw, what its last
 * connection was told (the resume: position, recovered, gap, unknown),
 * and its messages (and their positions) in arrival order.
 */
function shown(page) {
  return page.evaluate(() => {
    const items = [...document.querySelectorAll("#messages li")].reverse();
    return {
      state: document.getElementById("state").textContent,
      closes: window.closes,
      resume: document.getElementById("resume").className,
      count: Number(document.getElementById("count").textContent),
      messages: items.map((li) => li.querySelector("span").textContent),
      positions: items.map((li) => li.querySelector("small").textContent),
    };
  });
}

async function waitForState(page, state) {
  return waitUntil(`the page at ${page.url()} to be ${state}`, async () => {
    const now = await shown(page);
    return now.state === state && now;
  });
}

/**
 * Opens a WebSocket from inside `page` (so with the page's origin) and
 * says how it went: `{ open: true }`, or how it closed.
 */
function connectFrom(page, url) {
  return page.evaluate(
    ([url, ms]) =>
      new Promise((resolve) => {
        const ws = new WebSocket(url);
        ws.onopen = () => resolve({ open: true });
        ws.onclose = (e) => resolve({ open: false, code: e.code, clean: e.wasClean });
        setTimeout(() => resolve({ open: false, timedOut: true }), ms);
      }),
    [url, WAIT_MS],
  );
}

/**
 * A raw client that upgrades and then sends nothing, not even a pong: once
 * the server's close for the idle timeout came, it ends the connection.
 */
function silentClient(addr) {
  const [host, port] = addr.split(":");
  const client = { closed: false, response: "" };
  const idleClose = "\x88\x0e\x03\xe9idle timeout";
  client.socket = net.connect({ host, port: Number(port) }, () =>
    client.socket.write(
      "GET / HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n" +
        "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n",
    ),
  );
  client.socket.on("data", (chunk) => {
    client.response += chunk.toString("latin1");
    if (client.response.endsWith(idleClose)) client.socket.end();
  });
  client.socket.on("close", () => (client.closed = true));
  client.socket.on("error", () => {});
  return client;
}

// --------------------------------------------------------------- checks --

/** A check's servers (see harness.mjs), and its browser context and raw sockets. */
class PageScope extends Scope {
  contexts = [];
  sockets = [];

  /** A new page (a tab) in this check's browser context, at `url` if given. */
  async page(url) {
    if (this.contexts.length === 0) this.contexts.push(await browser.newContext());
    const page = await this.contexts[0].newPage();
    page.setDefaultTimeout(WAIT_MS);
    if (url) await page.goto(url);
    return page;
  }

  async release() {
    for (const socket of this.sockets) socket.destroy();
    await Promise.all(this.contexts.map((context) => context.close()));
    await super.release();
  }
}

try {
  // launchServer, not launch: it hands over the browser's process.
  chromiumServer = await chromium.launchServer({
    executablePath: CHROMIUM,
    headless: true,
    host: "127.0.0.1",
    args: [
      "--no-sandbox",
      "--disable-gpu",
      "--disable-background-networking",
      "--disable-component-update",
      "--disable-sync",
      "--no-first-run",
    ],
    timeout: 30_000,
  });
  browser = await chromium.connect(chromiumServer.wsEndpoint(), { timeout: 30_000 });
} catch (error) {
  die(`cannot start Chromium (${CHROMIUM}): ${error.message}`);
}
console.log(`Chromium ${browser.version()}, wspush ${BIN}`);
tmp = fs.mkdtempSync(path.join(os.tmpdir(), "wspush-browser-"));

await check("the --demo page shows the lines fed on standard input", async (scope) => {
  const server = await scope.server(["--demo"]);
  const page = await scope.page();
  const requests = [];
  const errors = [];
  page.on("request", (request) => requests.push(request.url()));
  page.on("console", (message) => message.type() === "error" && errors.push(message.text()));
  page.on("pageerror", (error) => errors.push(error.message));
  await page.goto(server.url("/"));
  await waitForState(page, "open");
  const lines = ["hello from stdin", "<b>text, not markup</b>", "", "ünïcødé ✓"];
  server.feed(lines);
  const now = await waitUntil("4 messages on the page", async () => {
    const now = await shown(page);
    return now.count === lines.length && now;
  });
  assertEqual(now.messages, lines, "messages shown");
  assertEqual(await page.locator("#messages b").count(), 0, "elements made from a message");
  assertEqual(requests, [server.url("/"), server.url("/wspush.js")], "requests the page made (nothing from elsewhere)");
  assertEqual(errors, [], "console errors");
});

await check("three tabs each get all 50 lines in order", async (scope) => {
  const server = await scope.server(["--demo"]);
  const tabs = [];
  for (let i = 0; i < 3; i++) tabs.push(await scope.page(server.url("/")));
  await Promise.all(tabs.map((tab) => waitForState(tab, "open")));
  await waitUntil("the server to count 3 upgrades", async () => (await server.metrics()).get("wspush_upgrades_total") === 3);
  const lines = Array.from({ length: 50 }, (_, i) => `line ${i + 1} of 50`);
  server.feed(lines);
  for (const [i, tab] of tabs.entries()) {
    const now = await waitUntil(`tab ${i + 1} to have 50 messages`, async () => {
      const now = await shown(tab);
      return now.count >= 50 && now;
    });
    assertEqual(now.messages, lines, `tab ${i + 1}'s messages`);
  }
  assertEqual((await server.metrics()).get("wspush_broadcast_deliveries_total"), 150, "deliveries");
});

await check("pages on two channels each get only theirs; upstream carries what a page sends", async (scope) => {
  const server = await scope.server(["--demo", "--input", "commands", "--upstream", "stdout"]);
  const red = await scope.page(server.url("/?channel=red"));
  const blue = await scope.page(server.url("/?channel=blue"));
  await Promise.all([red, blue].map((page) => waitForState(page, "open")));
  server.feed(["pub red r1", "pub blue b1", "pub red r2", "pub red,blue both", "all everyone"]);
  const want = { red: ["r1", "r2", "both", "everyone"], blue: ["b1", "both", "everyone"] };
  for (const [name, page] of Object.entries({ red, blue })) {
    const now = await waitUntil(`the ${name} page to have ${want[name].length} messages`, async () => {
      const now = await shown(page);
      return now.count >= want[name].length && now;
    });
    assertEqual(now.messages, want[name], `the ${name} page's messages`);
  }
  const sent = await red.evaluate(
    ([url, ms]) =>
      new Promise((resolve) => {
        const ws = new WebSocket(url);
        ws.onopen = () => {
          ws.send("from the browser\nline two");
          resolve(true);
        };
        setTimeout(() => resolve(false), ms);
      }),
    [`ws://${server.addr}/?id=painter`, WAIT_MS],
  );
  assertEqual(sent, true, "the page's socket opened");
  const line = await waitUntil("the upstream line", () =>
    server.out.split("\n").find((l) => l.startsWith("msg ") && l.includes(" painter ")),
  );
  assertEqual(line.split(" ").slice(2).join(" "), "painter text from the browser\\nline two", "the upstream line");
});

await check("permessage-deflate: big broadcasts reach the page compressed, and its messages are inflated", async (scope) => {
  const server = await scope.server(["--demo", "--echo"]);
  const page = await scope.page(server.url("/"));
  await waitForState(page, "open");
  await waitUntil("the page's connection to negotiate deflate", async () => (await server.metrics()).get("wspush_connections_deflate") === 1);
  const big = (i) => `{"seq":${i},"book":"${"bid 1.0842 ask 1.0843 ".repeat(40)}"}`;
  const lines = [big(1), "small", big(2)];
  server.feed(lines);
  const now = await waitUntil("3 messages on the page", async () => {
    const now = await shown(page);
    return now.count >= 3 && now;
  });
  assertEqual(now.messages, lines, "messages shown");
  const m = await server.metrics();
  // The page's is the one connection, with deflate: the two big ones
  // reached it compressed (with their positions in a stored block before
  // the compressed payload), and it showed them inflated.
  assertEqual(m.get("wspush_broadcasts_compressed_total"), 2, "broadcasts compressed (the small one went plain)");
  // What the page sends, Chromium compresses; the echo comes back whole.
  const text = "echo ".repeat(400);
  const echoed = await page.evaluate(
    ([url, text, ms]) =>
      new Promise((resolve) => {
        const ws = new WebSocket(url);
        ws.onopen = () => ws.send(text);
        ws.onmessage = (event) => resolve({ data: event.data, extensions: ws.extensions });
        setTimeout(() => resolve(null), ms);
      }),
    [`ws://${server.addr}/`, text, WAIT_MS],
  );
  assertEqual(echoed && echoed.data, text, "the echo");
  assertEqual(echoed.extensions, "permessage-deflate; server_no_context_takeover; client_no_context_takeover", "the extension agreed");
});

await check("SIGINT closes the page with 1001, cleanly", async (scope) => {
  const server = await scope.server(["--demo"]);
  const page = await scope.page(server.url("/"));
  await waitForState(page, "open");
  server.child.kill("SIGINT");
  const now = await waitForState(page, "closed");
  assertEqual(now.closes[0], { code: 1001, clean: true, reason: "server shutting down" }, "the close the page saw");
  const exit = await Promise.race([server.exited, sleep(WAIT_MS).then(() => "still running")]);
  assertEqual(exit, { code: 0, signal: null }, "wspush's exit");
});

await check("--allow-origin: the allowed origin connects, another is refused (403)", async (scope) => {
  const other = await scope.server(["--demo"]);
  const allowed = `http://${other.addr}`;
  const guarded = await scope.server(["--demo", "--allow-origin", allowed]);
  // A page of the allowed origin, connecting across to the guarded server.
  const fromAllowed = await scope.page(other.url("/"));
  assertEqual(await connectFrom(fromAllowed, `ws://${guarded.addr}/`), { open: true }, `from ${allowed}`);
  // The guarded server's own page: its origin is not the one allowed.
  const own = await scope.page(guarded.url("/"));
  const now = await waitForState(own, "closed");
  assertEqual(now.closes[0], { code: 1006, clean: false, reason: "" }, `from http://${guarded.addr}`);
  const metrics = await guarded.metrics();
  assertEqual(
    [metrics.get("wspush_upgrades_total"), metrics.get('wspush_requests_rejected_total{status="403"}')],
    [1, 1],
    "upgrades and 403s counted",
  );
});

await check("--token-file: the right token connects, a wrong or missing one is refused (401)", async (scope) => {
  const tokens = path.join(tmp, "tokens");
  fs.writeFileSync(tokens, "# the browser test's token\nright-token\n");
  const server = await scope.server(["--demo", "--token-file", tokens]);
  // The page passes its own query on: /?token=… connects with that token.
  const right = await scope.page(server.url("/?token=right-token"));
  await waitForState(right, "open");
  for (const query of ["/?token=wrong-token", "/"]) {
    const now = await waitForState(await scope.page(server.url(query)), "closed");
    assertEqual(now.closes[0], { code: 1006, clean: false, reason: "" }, `with ${query}`);
  }
  server.feed(["for token holders"]);
  await waitUntil("the message on the page with the token", async () => (await shown(right)).count === 1);
  const metrics = await server.metrics("?token=right-token");
  assertEqual(
    [metrics.get("wspush_upgrades_total"), metrics.get('wspush_requests_rejected_total{status="401"}')],
    [1, 2],
    "upgrades and 401s counted",
  );
});

// Signed tokens, made here with Node's crypto (not by the server's code).
const JWT_SECRET = "the-browser-test-secret-of-32-bytes+";

function jwt(claims) {
  const part = (value) => Buffer.from(JSON.stringify(value)).toString("base64url");
  const input = `${part({ alg: "HS256", typ: "JWT" })}.${part(claims)}`;
  return `${input}.${crypto.createHmac("sha256", JWT_SECRET).update(input).digest("base64url")}`;
}

const inSeconds = (s) => Math.floor(Date.now() / 1000) + s;

async function jwtServer(scope, args = []) {
  const secret = path.join(tmp, "jwt-secret");
  fs.writeFileSync(secret, `${JWT_SECRET}\n`);
  return scope.server(["--jwt-alg", "HS256", "--jwt-key-file", secret, "--require-token-id", ...args]);
}

await check("--jwt-key-file: a page with alice's token gets alice's messages; bob's cannot ask for ?id=alice (403)", async (scope) => {
  const server = await jwtServer(scope, ["--demo", "--input", "commands"]);
  const alice = await scope.page(server.url(`/?token=${jwt({ sub: "alice", exp: inSeconds(600) })}`));
  await waitForState(alice, "open");
  const bob = jwt({ sub: "bob", exp: inSeconds(600) });
  const asAlice = await connectFrom(alice, `ws://${server.addr}/?id=alice&token=${bob}`);
  assertEqual(asAlice, { open: false, code: 1006, clean: false }, "bob's token asking for alice");
  server.feed(["id bob for bob", "id alice for alice", "all for all"]);
  const now = await waitUntil("two messages on alice's page", async () => {
    const now = await shown(alice);
    return now.count >= 2 && now;
  });
  assertEqual(now.messages, ["for alice", "for all"], "what alice's page shows");
  const metrics = await server.metrics();
  assertEqual(metrics.get('wspush_requests_rejected_total{status="403"}'), 1, "the 403 counted");
});

await check("an expiring token: the page reconnects through getToken() and loses nothing", async (scope) => {
  const server = await jwtServer(scope, ["--jwt-leeway", "0"]);
  const page = await scope.page(server.url("/healthz"));
  // Tokens good for 2-3 s: several expire while 200 lines go out over 7 s.
  let issued = 0;
  await page.exposeFunction("freshToken", () => {
    issued += 1;
    return jwt({ sub: "reader", exp: inSeconds(3) });
  });
  await page.addScriptTag({ url: "/wspush.js" });
  await page.evaluate((url) => {
    window.got = [];
    window.closes = [];
    window.statuses = [];
    window.wspush.connect(url, {
      getToken: () => window.freshToken(),
      onmessage: (data) => window.got.push(data),
      onstatus: (s) => window.statuses.push(s.status),
      onstate: (state, e) => state === "closed" && e && window.closes.push(e.code),
    });
  }, `ws://${server.addr}/`);
  await waitUntil("the page connected", async () => (await page.evaluate(() => window.statuses.length)) === 1);
  const lines = Array.from({ length: 200 }, (_, i) => `line ${i + 1}`);
  for (let i = 0; i < 200; i += 10) {
    server.feed(lines.slice(i, i + 10));
    await sleep(350);
  }
  const got = await waitUntil("200 lines on the page", async () => {
    const got = await page.evaluate(() => window.got);
    return got.length >= 200 && got;
  });
  assertEqual(got, lines, "every line once, in order");
  const closes = await page.evaluate(() => window.closes);
  if (closes.length < 2 || closes.some((code) => code !== 4001)) throw new Error(`closes: ${closes}`);
  const statuses = await page.evaluate(() => window.statuses);
  assertEqual(statuses, ["position", ...closes.map(() => "recovered")], "what each connection was told");
  assertEqual(issued, closes.length + 1, "a token per connection");
  const metrics = await server.metrics();
  assertEqual(metrics.get('wspush_connections_closed_total{reason="token_expired"}'), closes.length, "the expiries counted");
});

await check("EventSource: text (empty, whitespace, non-ASCII) arrives as sent; any bytes (CR, LF, CRLF) as binary events in base64", async (scope) => {
  const server = await scope.server(["--input", "commands"]);
  const page = await scope.page(server.url("/healthz"));
  await page.evaluate(() => {
    window.got = [];
    window.binary = [];
    window.statuses = [];
    const source = new EventSource("/?id=reader");
    source.onmessage = (e) => window.got.push(e.data);
    source.addEventListener("binary", (e) => window.binary.push(e.data));
    source.addEventListener("status", (e) => window.statuses.push(JSON.parse(e.data).status));
  });
  await waitUntil("the stream open", async () => (await page.evaluate(() => window.statuses.length)) === 1);
  // Binary commands carry any bytes: CR, LF and CRLF inside text too.
  const texts = ["plain", "", "   ", " lead and trail ", "żółw 🐢 ☃", "a\nb", "a\r\nb", "a\rb", "x\n"];
  const b64 = (text) => Buffer.from(text).toString("base64");
  server.feed([...texts.map((t) => `id:b64 reader ${b64(t)}`), "id reader last"]);
  const binary = await waitUntil("every binary event", async () => {
    const binary = await page.evaluate(() => window.binary);
    return binary.length >= texts.length && binary;
  });
  assertEqual(binary.map((d) => Buffer.from(d, "base64").toString()), texts, "binary events, base64 of the bytes");
  await waitUntil("the text after them", async () => (await page.evaluate(() => window.got)).length === 1);
  server.feed(texts.map((t) => `id reader ${t.replace(/\n|\r/g, "")}`));
  const more = await waitUntil("the texts", async () => {
    const got = await page.evaluate(() => window.got);
    return got.length >= texts.length + 1 && got;
  });
  assertEqual(more, ["last", ...texts.map((t) => t.replace(/\n|\r/g, ""))], "text events as sent");
});

await check("the --demo page over EventSource (?transport=sse) shows the lines, and switches back", async (scope) => {
  const server = await scope.server(["--demo"]);
  const page = await scope.page(server.url("/?transport=sse"));
  await waitForState(page, "open");
  server.feed(["over sse one", "over sse two"]);
  const now = await waitUntil("two messages", async () => {
    const now = await shown(page);
    return now.count >= 2 && now;
  });
  assertEqual(now.messages, ["over sse one", "over sse two"], "what the page shows");
  assertEqual(now.resume, "position", "what the stream was told");
  assertEqual((await server.metrics()).get("wspush_connections_event_stream"), 1, "an event stream counted");
  // The link loads the page again: wait for the new one before reading it
  // (read while the old one unloads, it has no elements).
  await Promise.all([page.waitForURL((url) => url.searchParams.get("transport") === "ws"), page.click("#switch")]);
  await waitForState(page, "open");
  assertEqual((await server.metrics()).get("wspush_connections_event_stream"), 0, "back on WebSocket");
});

await check("EventSource resumes by itself through Last-Event-ID: the server drops it mid-feed, the count stays exact", async (scope) => {
  const server = await scope.server(["--input", "commands", "--ping-interval", "2s"]);
  const page = await scope.page(server.url("/healthz"));
  await page.evaluate(() => {
    window.got = [];
    window.statuses = [];
    const source = new EventSource("/?id=reader");
    source.onmessage = (e) => window.got.push(e.data);
    source.addEventListener("status", (e) => window.statuses.push(JSON.parse(e.data).status));
  });
  await waitUntil("the stream open", async () => (await page.evaluate(() => window.statuses.length)) === 1);
  const lines = Array.from({ length: 300 }, (_, i) => `line ${i + 1}`);
  for (let i = 0; i < 300; i += 100) {
    server.feed(lines.slice(i, i + 50).map((l) => `all ${l}`));
    server.feed(["close id reader 1000 dropped"]);
    server.feed(lines.slice(i + 50, i + 100).map((l) => `all ${l}`));
    // Each drop is told (the "closed" status), then the stream comes back.
    const back = async () => (await page.evaluate(() => window.statuses.filter((s) => s === "recovered").length)) === i / 100 + 1;
    await waitUntil(`the reconnect after drop ${i}`, back, 15_000);
  }
  const got = await waitUntil("300 messages", async () => {
    const got = await page.evaluate(() => window.got);
    return got.length >= 300 && got;
  });
  assertEqual(got, lines, "every line once, in order, across three drops");
  const statuses = await page.evaluate(() => window.statuses);
  assertEqual(statuses, ["position", "closed", "recovered", "closed", "recovered", "closed", "recovered"], "what the stream was told");
});

await check("--ping-interval 1s: the browser answers pings and stays connected (idle timeout 3s)", async (scope) => {
  const flags = ["--demo", "--ping-interval", "1s", "--idle-timeout", "3s"];
  const server = await scope.server(flags);
  const page = await scope.page(server.url("/"));
  await waitForState(page, "open");
  const opened = Date.now();
  // Meanwhile, on a server of its own, a client that never answers: the
  // same settings do close that one.
  const control = await scope.server(flags);
  const silent = silentClient(control.addr);
  scope.sockets.push(silent.socket);
  await waitUntil("the silent client to be closed for the idle timeout", () => silent.closed, 8_000);
  const closed = (await control.metrics()).get('wspush_connections_closed_total{reason="idle_timeout"}');
  assertEqual(closed, 1, "the silent client's close, counted");
  await sleep(Math.max(0, 5_500 - (Date.now() - opened)));
  assertEqual((await shown(page)).state, "open", "the page's state after 5.5 s");
  const metrics = await server.metrics();
  const pings = metrics.get("wspush_pings_sent_total");
  if (!(pings >= 3)) throw new Error(`the browser got only ${pings} pings in 5.5 s`);
  assertEqual(metrics.get('wspush_connections_closed_total{reason="idle_timeout"}'), 0, "idle closes");
  server.feed(["still here"]);
  await waitUntil("a message on the page after the pings", async () => (await shown(page)).count === 1);
});

await check("the served client keeps the page's count exact across server-side drops, and shows a gap", async (scope) => {
  const server = await scope.server(["--demo", "--input", "commands", "--history-messages", "100"]);
  const page = await scope.page(server.url("/?id=reader"));
  await waitForState(page, "open");
  assertEqual((await shown(page)).resume, "position", "what the first connection was told");
  // 300 lines; the server drops the page's connection three times
  // meanwhile. The first time the client backs off (0.5-3 s); then, as it
  // would back off longer each time, the page is told it is back online,
  // which reconnects at once.
  const lines = Array.from({ length: 300 }, (_, i) => `line ${i + 1}`);
  const online = () => page.evaluate(() => window.dispatchEvent(new Event("online")));
  for (let i = 0; i < 300; i += 100) {
    server.feed(lines.slice(i, i + 100).map((line) => `all ${line}`));
    server.feed(["close id reader 4000 drop " + i]);
    await waitUntil(`the page to see drop ${i}`, async () => (await shown(page)).closes.length === i / 100 + 1);
    if (i > 0) await online();
    await waitUntil(`the page to reconnect after drop ${i}`, async () => (await shown(page)).state === "open");
  }
  const now = await waitUntil("300 messages on the page", async () => {
    const now = await shown(page);
    return now.count >= 300 && now;
  });
  assertEqual(now.messages, lines, "every line once, in order, across three drops");
  assertEqual(now.resume, "recovered", "what the last connection was told");
  assertEqual(now.closes.map((c) => c.code), [4000, 4000, 4000], "the closes");
  const m = await server.metrics();
  assertEqual(m.get('wspush_resumes_total{result="recovered"}'), 3, "resumes counted");
  // While the page is away, more is published than the history keeps.
  server.feed(["close id reader 4000 away", ...Array.from({ length: 150 }, (_, i) => `all later ${i + 1}`)]);
  await waitUntil("the page to see it closed", async () => (await shown(page)).closes.length === 4);
  await waitUntil("the 150 lines taken", async () => (await server.metrics()).get("wspush_broadcasts_total") === 450);
  await online();
  const after = await waitUntil("the page to resume with a gap", async () => {
    const now = await shown(page);
    return now.resume === "gap" && now.count >= 400 && now;
  });
  assertEqual(after.messages.slice(300), Array.from({ length: 100 }, (_, i) => `later ${i + 51}`), "what the history held");
  assertEqual(m.get('wspush_resumes_total{result="gap"}') ?? 0, 0, "no gap before");
  assertEqual((await server.metrics()).get('wspush_resumes_total{result="gap"}'), 1, "the gap counted");
});

/**
 * A `--processes 2` server with `args` and a page on it; 300 lines are fed
 * a hundred at a time: first, then as each instance in turn (the page is
 * on one of them) is sent `signal` and is replaced. Returns what the page
 * shows once it has all 300 (checked to be every line once, in order).
 */
async function replacingEachInstance(scope, args, signal) {
  const server = await scope.server(["--demo", "--processes", "2", ...args]);
  const instances = () =>
    fs.readFileSync(`/proc/${server.child.pid}/task/${server.child.pid}/children`, "utf8").trim().split(/\s+/).map(Number);
  await waitUntil("two instances", () => instances().length === 2);
  const page = await scope.page(server.url("/"));
  await waitForState(page, "open");
  const lines = Array.from({ length: 300 }, (_, i) => `line ${i + 1}`);
  server.feed(lines.slice(0, 100));
  await waitUntil("100 messages on the page", async () => (await shown(page)).count >= 100);
  for (const [i, victim] of instances().entries()) {
    process.kill(victim, signal);
    server.feed(lines.slice(100 * (i + 1), 100 * (i + 2)));
    await waitUntil(`instance ${victim} to be replaced`, () => {
      const now = instances();
      return now.length === 2 && !now.includes(victim);
    });
  }
  // Dropped twice at worst: back within 0.5-3 s, then 0.5-6 s.
  const now = await waitUntil("300 messages on the page", async () => {
    const now = await shown(page);
    return now.count >= 300 && now.state === "open" && now;
  }, 20_000);
  assertEqual(now.messages, lines, "every line once, in order");
  if (now.closes.length < 1) throw new Error("the page's connection was never dropped");
  return { page, now };
}

await check("the served client keeps the page's count exact while each instance is killed and restarted", async (scope) => {
  const { now } = await replacingEachInstance(scope, [], "SIGKILL");
  assertEqual(now.resume, "recovered", "what its last connection was told");
});

await check("a draining instance closes the page with 1012; it comes back after the hint, on the other, recovered", async (scope) => {
  // 100 ms of drain time: the hint is under 100 ms, and the client's own
  // backoff would wait at least 500 ms.
  const drain = ["--drain-time", "100ms", "--drain-grace", "0s"];
  const { page, now } = await replacingEachInstance(scope, drain, "SIGTERM");
  // Drained once or twice (it may land on the first one's replacement).
  const drained = { code: 1012, reason: "service restart", clean: true };
  assertEqual(now.closes, now.closes.map(() => drained), "the drains' closes");
  const statuses = await page.evaluate(() => window.statuses);
  const hints = statuses.flatMap((s, i) => (s.status === "reconnect" ? [i] : []));
  assertEqual(hints.length, now.closes.length, "a hint before each close");
  for (const hint of hints) {
    const [told, back] = [statuses[hint], statuses[hint + 1]];
    assertEqual(back && back.status, "recovered", "what the next connection was told");
    if (!(told.delay_ms < 100)) throw new Error(`a hint of ${told.delay_ms} ms`);
    const waited = back.at - told.at;
    if (waited > told.delay_ms + 400) throw new Error(`back ${waited} ms after a hint of ${told.delay_ms} ms`);
  }
});

await check("across a SIGUSR2 of --processes 2, a wspush.js page and a bare WebSocket page see no close and no missing line", async (scope) => {
  const server = await scope.server(["--demo", "--processes", "2"]);
  const instances = () =>
    fs.readFileSync(`/proc/${server.child.pid}/task/${server.child.pid}/children`, "utf8").trim().split(/\s+/).map(Number);
  await waitUntil("two instances", () => instances().length === 2);
  const served = await scope.page(server.url("/"));
  await waitForState(served, "open");
  // A bare page: a plain WebSocket, no library, no positions.
  const bare = await scope.page(server.url("/healthz"));
  await bare.evaluate((url) => {
    window.got = [];
    window.bareCloses = [];
    const ws = new WebSocket(url);
    ws.onmessage = (e) => window.got.push(e.data);
    ws.onclose = (e) => window.bareCloses.push(e.code);
    return new Promise((resolve) => (ws.onopen = resolve));
  }, `ws://${server.addr}/`);
  const lines = Array.from({ length: 300 }, (_, i) => `line ${i + 1}`);
  server.feed(lines.slice(0, 100));
  await waitUntil("100 messages on both pages", async () =>
    (await shown(served)).count >= 100 && (await bare.evaluate(() => window.got.length)) >= 100);
  const before = instances();
  process.kill(server.child.pid, "SIGUSR2");
  server.feed(lines.slice(100, 200));
  await waitUntil("the upgrade of both instances", () => /the upgrade of the 2 instances is done/.test(server.log));
  // The old processes exit just after they handed over.
  await waitUntil(`the old instances ${before} to exit`, () => {
    const now = instances();
    return now.length === 2 && !now.some((pid) => before.includes(pid));
  });
  server.feed(lines.slice(200));
  const now = await waitUntil("300 messages on the served page", async () => {
    const now = await shown(served);
    return now.count >= 300 && now;
  });
  assertEqual(now.messages, lines, "the served page: every line once, in order");
  assertEqual(now.closes, [], "the served page saw no close");
  assertEqual(now.state, "open", "the served page's state");
  const got = await waitUntil("300 messages on the bare page", async () => {
    const got = await bare.evaluate(() => window.got);
    return got.length >= 300 && got;
  });
  assertEqual(got, lines, "the bare page: every line once, in order");
  assertEqual(await bare.evaluate(() => window.bareCloses), [], "the bare page saw no close");
});

await browser.close();
await chromiumServer.close();
finish();
