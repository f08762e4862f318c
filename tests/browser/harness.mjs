// What e2e.mjs and ws_client.mjs share: the run's set-up (setUp: its time
// limit, SIGINT and SIGTERM, and on any exit every wspush it started ended by
// PID), Wspush (a server on 127.0.0.1, on a free port wspush picks itself), the
// waits and assertEqual, and check(): a check's own time limit, PASS with its
// time or FAIL with the logs of the servers it started, and its Scope released
// whatever happens; finish() prints "N passed, N failed" and exits 1 if any
// failed. A script's own resources (pages, clients) go in a subclass of Scope,
// handed to setUp as newScope.

import { spawn } from "node:child_process";
import { isDeepStrictEqual } from "node:util";

/** The longest any single wait inside a check may take. */
export const WAIT_MS = 10_000;

/** The wspush binary (setUp fails the run if it is not set). */
export const BIN = process.env.WSPUSH_BIN;

const config = {
  /** Names the run in a FAIL line of its own (not a check's). */
  label: "wspush",
  /** The longest any one check may take. */
  checkTimeoutMs: 30_000,
  /** How often waitUntil probes. */
  pollMs: 50,
  /** Flags for every server, before the check's own. */
  flags: [],
  /** A check's scope, released when it ends. */
  newScope: () => new Scope(),
  /** What the script itself has to end on exit (synchronous). */
  cleanUp: () => {},
};

/** Every wspush started, to end by PID whatever happens. */
const children = new Set();
/** One per check: whether it passed. */
const results = [];

/**
 * Configures the run (options as in `config`, and runTimeoutMs, the longest
 * the whole run may take) and fails it unless WSPUSH_BIN is set.
 */
export function setUp({ runTimeoutMs, ...options }) {
  Object.assign(config, options);
  process.on("exit", cleanUp);
  for (const signal of ["SIGINT", "SIGTERM"]) process.on(signal, () => die(`stopped by ${signal}`));
  setTimeout(() => die(`the run took over ${runTimeoutMs / 1000} s`), runTimeoutMs).unref();
  need("WSPUSH_BIN");
}

/** An environment variable run.sh passes in; fails the run without it. */
export const need = (name) => process.env[name] || die(`${name} is not set (run tests/browser/run.sh)`);

/** Fails the whole run: ends what it started and exits 1. */
export function die(message) {
  console.error(`FAIL ${config.label}: ${message}`);
  cleanUp();
  process.exit(1);
}

/** Ends what this run started: synchronous, so it also runs on exit. */
function cleanUp() {
  for (const child of children) {
    if (child.exitCode === null && child.signalCode === null) child.kill("SIGKILL");
  }
  config.cleanUp();
}

export const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));

/** Polls `probe` until it returns something truthy; fails after `ms`. */
export async function waitUntil(what, probe, ms = WAIT_MS) {
  const deadline = Date.now() + ms;
  for (;;) {
    const last = await probe();
    if (last) return last;
    if (Date.now() > deadline) throw new Error(`timed out after ${ms} ms waiting for ${what}`);
    await sleep(config.pollMs);
  }
}

export function assertEqual(got, want, what) {
  if (!isDeepStrictEqual(got, want)) {
    throw new Error(`${what}: got ${JSON.stringify(got)}, want ${JSON.stringify(want)}`);
  }
}

// ------------------------------------------------------------- servers --

/** A wspush process on 127.0.0.1, port 0, with its stdin piped. */
export class Wspush {
  constructor(args) {
    this.child = spawn(BIN, ["--listen", "127.0.0.1:0", "--quiet", ...config.flags, ...args], {
      stdio: ["pipe", "pipe", "pipe"],
      env: { ...process.env, RUST_LOG: "info" },
    });
    children.add(this.child);
    this.log = "";
    this.out = "";
    this.child.stderr.on("data", (chunk) => (this.log += chunk));
    this.child.stdout.on("data", (chunk) => (this.out += chunk));
    this.exited = new Promise((resolve) => this.child.on("exit", (code, signal) => resolve({ code, signal })));
    this.child.stdin.on("error", () => {}); // a server that went is reported by the check
  }

  /** Starts one and waits for its `listening on ADDR` line. */
  static async start(args) {
    const server = new Wspush(args);
    const found = await waitUntil(`wspush ${args.join(" ")} to listen (log: ${server.log})`, () => {
      if (server.child.exitCode !== null) throw new Error(`wspush ${args.join(" ")} exited: ${server.log}`);
      return /listening on (127\.0\.0\.1:\d+) /.exec(server.log);
    });
    server.addr = found[1];
    return server;
  }

  url(target = "/") {
    return `http://${this.addr}${target}`;
  }

  /** Broadcasts: one line each on standard input, in one write. */
  feed(lines) {
    this.child.stdin.write(lines.map((line) => `${line}\n`).join(""));
  }

  /** `/metrics` as a map from series (name and labels) to value. */
  async metrics(query = "") {
    const response = await fetch(this.url(`/metrics${query}`), { signal: AbortSignal.timeout(WAIT_MS) });
    if (response.status !== 200) throw new Error(`/metrics answered ${response.status}`);
    const samples = new Map();
    for (const line of (await response.text()).split("\n")) {
      const [series, value] = line.split(" ");
      if (line && !line.startsWith("#")) samples.set(series, Number(value));
    }
    return samples;
  }

  /** SIGINT (close at once, no drain), then SIGKILL if it has not exited within 10 s. */
  async stop() {
    if (this.child.exitCode !== null || this.child.signalCode !== null) return this.exited;
    this.child.kill("SIGINT");
    const timer = setTimeout(() => this.child.kill("SIGKILL"), 10_000);
    const status = await this.exited;
    clearTimeout(timer);
    return status;
  }
}

// -------------------------------------------------------------- checks --

/**
 * The resources of one check, released when it ends: here its servers; a
 * subclass adds the script's own and releases them before calling
 * super.release().
 */
export class Scope {
  servers = [];

  async server(args) {
    const server = await Wspush.start(args);
    this.servers.push(server);
    return server;
  }

  async release() {
    await Promise.all(this.servers.map((server) => server.stop()));
  }
}

/** Runs one check in a new scope: PASS with its time, or FAIL with why and its servers' logs. */
export async function check(name, body) {
  const started = Date.now();
  const scope = config.newScope();
  let timer;
  try {
    await Promise.race([
      body(scope),
      new Promise((_, reject) => {
        timer = setTimeout(() => reject(new Error(`over ${config.checkTimeoutMs / 1000} s`)), config.checkTimeoutMs);
      }),
    ]);
    results.push(true);
    console.log(`PASS ${name} (${((Date.now() - started) / 1000).toFixed(1)} s)`);
  } catch (error) {
    results.push(false);
    console.log(`FAIL ${name}: ${error.message}`);
    for (const server of scope.servers) {
      if (server.log) console.log(`  wspush ${server.addr} logged:\n    ${server.log.trim().split("\n").join("\n    ")}`);
    }
  } finally {
    clearTimeout(timer);
    await scope.release().catch((error) => console.log(`  (cleaning up: ${error.message})`));
  }
}

/** The last line, "N passed, N failed", and the exit: 1 if any failed. */
export function finish() {
  const passed = results.filter(Boolean).length;
  console.log(`${passed} passed, ${results.length - passed} failed`);
  process.exit(passed === results.length ? 0 : 1);
}
