// wspush's permessage-deflate against an independent implementation: the
// client of Node's `ws` library, whose deflate is Node's zlib (C zlib), not
// the zlib-rs family the server and the Rust tests use. Each check starts its
// own wspush on 127.0.0.1 (a free port) and three ws clients: `deflate` (ws's
// own offer, with client_max_window_bits), `plain` (perMessageDeflate: false)
// and `window10` (asks for server_max_window_bits=10, which wspush sends
// plain). It checks:
//   - what each negotiated: the 101's Sec-WebSocket-Extensions, ws.extensions,
//     wspush_connections_deflate;
//   - 200 broadcasts fed on stdin, small, 1-10 KB and 100 KB JSON-like lines:
//     every client gets each line, in order; on the wire (the server's frame
//     headers, parsed as the socket reads them) the deflate client gets those
//     of 256 B or more compressed (RSV1), in under half the plain client's
//     bytes, and the others get none compressed;
//   - --echo: each client sends text and binary messages of 4 B to 1 MB (ws
//     compresses those of 256 B or more) and gets each back equal; the deflate
//     client's echoes of 256 B or more come back compressed, the others plain.
// Every check prints PASS or FAIL with its name; the last line is "N passed,
// N failed" and the exit status is 1 if any failed. 60 s at most in all.
//
// Run by run.sh, which passes in the environment:
//   WSPUSH_BIN              the wspush binary
//   WSPUSH_BROWSER_MODULES  a node_modules directory holding ws

import { createRequire } from "node:module";
import path from "node:path";
import { isDeepStrictEqual } from "node:util";
import { BIN, Scope, WAIT_MS, assertEqual, check, finish, need, setUp, waitUntil } from "./harness.mjs";

/** wspush's --deflate-min-bytes default: smaller messages go plain. */
const MIN_BYTES = 256;

setUp({
  label: "ws client",
  checkTimeoutMs: 20_000,
  runTimeoutMs: 60_000,
  pollMs: 20,
  // Room for a 1 MB message, and queues that never close a client that reads
  // late on a loaded machine.
  flags: ["--max-message-bytes", "2097152", "--max-queued-bytes", "67108864"],
  newScope: () => new ClientScope(),
});
const modules = need("WSPUSH_BROWSER_MODULES");
const WebSocket = createRequire(path.join(modules, "x.js"))("ws");
const wsVersion = createRequire(path.join(modules, "x.js"))("ws/package.json").version;

/** The three clients' permessage-deflate options; threshold: ws compresses what it sends of 256 B or more. */
const KINDS = {
  deflate: { threshold: MIN_BYTES },
  plain: false,
  window10: { serverMaxWindowBits: 10, threshold: MIN_BYTES },
};

/** Messages equal and in order; names the first that differs rather than printing megabytes. */
function assertMessages(got, want, what) {
  const at = want.findIndex((message, i) => !isDeepStrictEqual(got[i], message));
  if (got.length !== want.length || at >= 0) {
    throw new Error(`${what}: ${got.length} messages for ${want.length}, the first that differs is #${at}`);
  }
}

// -------------------------------------------------------------- clients --

/** A check's servers (see harness.mjs) and its ws clients. */
class ClientScope extends Scope {
  clients = [];

  async release() {
    for (const ws of this.clients) ws.terminate();
    await super.release();
  }
}

/**
 * Tallies what a client's socket reads from the server (whose frames are
 * not masked): bytes, data messages, and those whose first frame has RSV1
 * (compressed). ws inflates transparently; this is what came on the wire.
 */
function tap(socket) {
  const wire = { bytes: 0, messages: 0, compressed: 0 };
  let pending = Buffer.alloc(0); // a frame header not yet whole
  let skip = 0; // payload bytes of the current frame still to come
  socket.on("data", (chunk) => {
    wire.bytes += chunk.length;
    pending = Buffer.concat([pending, chunk]);
    for (;;) {
      const skipped = Math.min(skip, pending.length);
      skip -= skipped;
      pending = pending.subarray(skipped);
      if (skip > 0 || pending.length < 2) return;
      const short = pending[1] & 0x7f;
      const head = short === 126 ? 4 : short === 127 ? 10 : 2;
      if (pending.length < head) return;
      const opcode = pending[0] & 0x0f;
      if (opcode === 1 || opcode === 2) {
        wire.messages++;
        if (pending[0] & 0x40) wire.compressed++;
      }
      skip = short === 126 ? pending.readUInt16BE(2) : short === 127 ? Number(pending.readBigUInt64BE(2)) : short;
      pending = pending.subarray(head);
    }
  });
  return wire;
}

/** A ws client of `kind`, open, with what it receives (text as strings, binary as Buffers) and its wire tally. */
async function connect(scope, server, kind) {
  const ws = new WebSocket(`ws://${server.addr}/`, { perMessageDeflate: KINDS[kind], handshakeTimeout: WAIT_MS });
  scope.clients.push(ws);
  const client = { kind, ws, received: [], closed: null };
  ws.on("upgrade", (response) => (client.answer = response.headers["sec-websocket-extensions"]));
  ws.on("message", (data, isBinary) => client.received.push(isBinary ? data : data.toString()));
  ws.on("close", (code) => (client.closed ??= `closed with ${code}`));
  ws.on("error", (error) => (client.closed ??= error.message));
  ws.on("open", () => (client.wire = tap(ws._socket))); // before anything is read past the 101
  await waitUntil(`the ${kind} client to open`, () => {
    if (client.closed) throw new Error(`the ${kind} client: ${client.closed}`);
    return ws.readyState === WebSocket.OPEN;
  });
  return client;
}

async function connectAll(scope, server) {
  const clients = {};
  for (const kind of Object.keys(KINDS)) clients[kind] = await connect(scope, server, kind);
  return clients;
}

function waitForMessages(client, count) {
  return waitUntil(`the ${client.kind} client's ${count} messages (has ${client.received.length})`, () => {
    if (client.closed) throw new Error(`the ${client.kind} client, after ${client.received.length} messages: ${client.closed}`);
    return client.received.length >= count;
  });
}

// ----------------------------------------------------------------- data --

let seed = 0x9e3779b9;
/** xorshift32: the same data every run. */
function rand(n) {
  seed ^= seed << 13;
  seed ^= seed >>> 17;
  seed ^= seed << 5;
  return (seed >>> 0) % n;
}

/** JSON-like text of about `chars` characters, some not ASCII: compressible, not trivially. */
function json(chars) {
  const rows = [];
  for (let length = 0; length < chars; length += rows.at(-1).length + 1) {
    const px = (1 + rand(100_000) / 100_000).toFixed(5);
    rows.push(`{"id":${rand(1e6)},"px":${px},"qty":${rand(5000)},"side":"${rand(2) ? "bid" : "ask"}","venue":"zürich-${rand(8)}"}`);
  }
  return `{"rows":[${rows.join(",")}]}`;
}

const bytes = (message) => Buffer.byteLength(message);

// --------------------------------------------------------------- checks --

console.log(`ws ${wsVersion}, node ${process.version}, zlib ${process.versions.zlib}, wspush ${BIN}`);

await check("ws clients negotiate permessage-deflate (with server_no_context_takeover), or not", async (scope) => {
  const server = await scope.server([]);
  const { deflate, plain, window10 } = await connectAll(scope, server);
  const agreed = "permessage-deflate; server_no_context_takeover; client_no_context_takeover";
  assertEqual([deflate.answer, deflate.ws.extensions], [agreed, "permessage-deflate"], "the deflate client's");
  assertEqual([plain.answer, plain.ws.extensions], [undefined, ""], "the plain client's");
  assertEqual(
    [window10.answer, window10.ws.extensions],
    [`${agreed}; server_max_window_bits=10`, "permessage-deflate"],
    "the window10 client's",
  );
  assertEqual((await server.metrics()).get("wspush_connections_deflate"), 2, "wspush_connections_deflate");
});

await check("200 broadcasts reach every ws client in order; the deflate client's big ones compressed", async (scope) => {
  const server = await scope.server([]);
  const clients = await connectAll(scope, server);
  const lines = Array.from({ length: 200 }, (_, i) => {
    if (i % 50 === 25) return json(100_000);
    if (i % 4 === 0) return json(1_000 + rand(9_000));
    if (i === 1) return "";
    if (i === 2) return "x".repeat(MIN_BYTES - 1);
    if (i === 3) return "y".repeat(MIN_BYTES);
    return `{"seq":${i},"px":${rand(1e5)},"note":"ünïcødé ✓"}`;
  });
  const big = lines.filter((line) => bytes(line) >= MIN_BYTES).length;
  server.feed(lines);
  for (const client of Object.values(clients)) {
    await waitForMessages(client, lines.length);
    assertMessages(client.received, lines, `the ${client.kind} client's messages`);
  }
  const wire = Object.fromEntries(Object.values(clients).map((c) => [c.kind, c.wire]));
  assertEqual(
    [wire.deflate.compressed, wire.plain.compressed, wire.window10.compressed],
    [big, 0, 0],
    "messages that came compressed (deflate, plain, window10)",
  );
  if (!(wire.deflate.bytes < wire.plain.bytes / 2)) {
    throw new Error(`the deflate client read ${wire.deflate.bytes} bytes, the plain one ${wire.plain.bytes}: not under half`);
  }
  assertEqual((await server.metrics()).get("wspush_broadcasts_compressed_total"), big, "wspush_broadcasts_compressed_total");
  console.log(`  bytes read: deflate ${wire.deflate.bytes}, plain ${wire.plain.bytes}, window10 ${wire.window10.bytes}`);
});

await check("--echo: ws clients' messages, text and binary up to 1 MB, come back equal; compressed to deflate", async (scope) => {
  const server = await scope.server(["--echo"]);
  const clients = await connectAll(scope, server);
  const messages = [
    "hi",
    json(2_000),
    json(50_000),
    json(1_000_000),
    Buffer.from([0, 1, 2, 255]),
    Buffer.from(json(5_000)),
    Buffer.from(Array.from({ length: 100_000 }, () => rand(256))), // incompressible
  ];
  const big = messages.filter((message) => (typeof message === "string" ? bytes(message) : message.length) >= MIN_BYTES).length;
  for (const client of Object.values(clients)) for (const message of messages) client.ws.send(message);
  for (const client of Object.values(clients)) {
    await waitForMessages(client, messages.length);
    assertMessages(client.received, messages, `the ${client.kind} client's echoes`);
  }
  const { deflate, plain, window10 } = clients;
  assertEqual(
    [deflate.wire.compressed, plain.wire.compressed, window10.wire.compressed],
    [big, 0, 0],
    "echoes that came compressed (deflate, plain, window10)",
  );
  // What the deflate client sent went compressed too (so wspush inflated it).
  const sent = (client) => client.ws._socket.bytesWritten;
  for (const [what, mine, theirs] of [
    ["read", deflate.wire.bytes, plain.wire.bytes],
    ["wrote", sent(deflate), sent(plain)],
  ]) {
    if (!(mine < theirs / 2)) throw new Error(`the deflate client ${what} ${mine} bytes, the plain one ${theirs}: not under half`);
  }
  assertEqual((await server.metrics()).get("wspush_messages_echoed_total"), 3 * messages.length, "wspush_messages_echoed_total");
  console.log(`  bytes read: deflate ${deflate.wire.bytes}, plain ${plain.wire.bytes}; written: deflate ${sent(deflate)}, plain ${sent(plain)}`);
});

finish();
