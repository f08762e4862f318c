"""Connections with permessage-deflate moved across a roll: Python's
websockets clients (which ask for permessage-deflate) connect to
`wspush --processes 2`, half of them asking for positions; they send
compressed messages while compressed broadcasts reach them; the supervisor
is sent SIGHUP, and each instance's new process takes the connections over.
Run by run.sh, which sets WSPUSH_BIN. Prints PASS or FAIL per check; exits
1 if any failed.

Each client must see no close and every line once, in order, and the
deflate it negotiated must stay in use both ways; each client message must
come out upstream once, in order, under the one key the client had from
its open; no open or close event may be written for the move; and
`conn KEY` with a key read before the roll must reach that client after
it."""

import asyncio
import os
import re
import signal
import subprocess
import sys
import threading
import time

import websockets

BIN = os.environ["WSPUSH_BIN"]
TIMEOUT = 20
CLIENTS = 8
LINES = 300


class Supervisor:
    """`wspush --processes 2` with commands on its input, its upstream
    lines (with events) collected from its output."""

    def __init__(self):
        self.process = subprocess.Popen(
            [BIN, "--listen", "127.0.0.1:0", "--quiet", "--processes", "2",
             "--drain-time", "1s", "--input", "commands",
             "--upstream", "stdout", "--upstream-events"],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            text=True, env={**os.environ, "RUST_LOG": "info"},
        )
        self.log = []
        self.upstream = []
        self.lock = threading.Lock()
        listening = threading.Event()
        addr = []

        def read_log():
            for line in self.process.stderr:
                with self.lock:
                    self.log.append(line)
                found = re.search(r"on (127\.0\.0\.1:\d+) with 2 instances", line)
                if found:
                    addr.append(found[1])
                    listening.set()

        def read_upstream():
            for line in self.process.stdout:
                with self.lock:
                    self.upstream.append(line.rstrip("\n"))

        threading.Thread(target=read_log, daemon=True).start()
        threading.Thread(target=read_upstream, daemon=True).start()
        if not listening.wait(TIMEOUT):
            raise RuntimeError("wspush --processes 2 did not start")
        self.addr = addr[0]

    def send(self, line):
        self.process.stdin.write(line + "\n")
        self.process.stdin.flush()

    def logged(self, needle):
        with self.lock:
            return sum(needle in line for line in self.log)

    async def wait_logged(self, needle, count=1):
        deadline = time.monotonic() + TIMEOUT
        while self.logged(needle) < count:
            assert time.monotonic() < deadline, f"never logged {needle!r}: {self.log}"
            await asyncio.sleep(0.05)

    def stop(self):
        self.process.send_signal(signal.SIGINT)
        self.process.wait(TIMEOUT)


async def client(number, addr, positions, sent, got, done, release):
    """Connects as `c{number}`, sends a compressed message every 30 ms
    until `end` arrives, and keeps what it gets; says so on `done`, and
    closes on `release`."""
    path = f"/?id=c{number}" + ("&positions=1" if positions else "")
    async with websockets.connect(f"ws://{addr}{path}", open_timeout=TIMEOUT) as ws:
        extensions = ws.response.headers.get("Sec-WebSocket-Extensions", "")
        assert extensions.startswith("permessage-deflate"), extensions

        async def talk():
            n = 0
            while True:
                text = f"c{number} says {n} " + "la" * 40
                await ws.send(text)
                sent.append(text)
                n += 1
                await asyncio.sleep(0.03)

        talking = asyncio.create_task(talk())
        try:
            while True:
                message = await asyncio.wait_for(ws.recv(), TIMEOUT)
                got.append(message)
                if message.endswith("end"):
                    break
        finally:
            talking.cancel()
        # Still open: no close came.
        assert ws.state == websockets.protocol.State.OPEN, ws.state
        done.release()
        await release.wait()


async def check():
    server = Supervisor()
    try:
        sent = [[] for _ in range(CLIENTS)]
        got = [[] for _ in range(CLIENTS)]
        done, release = asyncio.Semaphore(0), asyncio.Event()
        tasks = [asyncio.create_task(
                     client(n, server.addr, n % 2 == 0, sent[n], got[n], done, release))
                 for n in range(CLIENTS)]
        deadline = time.monotonic() + TIMEOUT
        while sum(line.startswith("open ") for line in server.upstream) < CLIENTS:
            assert time.monotonic() < deadline, server.upstream
            await asyncio.sleep(0.05)
        opens = {line.split()[2]: line.split()[1]
                 for line in server.upstream if line.startswith("open ")}
        for n in range(1, LINES + 1):
            server.send(f"all line {n} " + "compressible " * 8)
            if n == 50:
                os.kill(server.process.pid, signal.SIGHUP)
            await asyncio.sleep(0.01)
        await server.wait_logged("the restart of the 2 instances is done")
        server.send(f"conn {opens['c1']} to c1 by its old key")
        server.send("all end")
        for _ in range(CLIENTS):
            await asyncio.wait_for(done.acquire(), TIMEOUT)
        # What the clients sent last comes out upstream.
        await asyncio.sleep(0.5)
        lines = list(server.upstream)
        release.set()
        await asyncio.wait_for(asyncio.gather(*tasks), TIMEOUT)

        every = [f"line {n} " + "compressible " * 8 for n in range(1, LINES + 1)]
        for n in range(CLIENTS):
            texts = [m.split(" ", 1)[1] if n % 2 == 0 and not m.startswith("{") else m
                     for m in got[n] if not m.startswith("{")]
            wanted = every + (["to c1 by its old key"] if n == 1 else []) + ["end"]
            assert texts == wanted, (n, len(texts), texts[:3], texts[-3:])
        assert not [l for l in lines if l.startswith("close ")], [l for l in lines if not l.startswith("msg ")]
        assert sum(l.startswith("open ") for l in lines) == CLIENTS, "an open event was written again"
        for n in range(CLIENTS):
            mine = [l.split(" ", 4) for l in lines if l.startswith("msg ") and f" c{n} " in l]
            assert {m[1] for m in mine} == {opens[f"c{n}"]}, (n, {m[1] for m in mine})
            texts = [m[4] for m in mine]
            assert texts == sent[n][:len(texts)], (n, texts[:2], sent[n][:2])
            assert len(sent[n]) - len(texts) <= 2, (n, len(sent[n]), len(texts))
        assert server.logged("took ") >= 2, "each new process took connections over"
    finally:
        server.stop()


def main():
    try:
        asyncio.run(check())
    except AssertionError as e:
        print(f"FAIL permessage-deflate connections across a roll: {e!r}")
        sys.exit(1)
    print(f"PASS {CLIENTS} websockets {websockets.__version__} clients with permessage-deflate, "
          "half with positions: across a roll no close, every line once and in order both ways, "
          "keys kept, conn KEY reaches its client")


main()
