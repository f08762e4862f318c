"""Tokens signed by PyJWT, presented by Python's websockets client to a
wspush server started here (run by pyjwt.sh, which sets WSPUSH_BIN and
WSPUSH_KEYS). Prints PASS or FAIL per check; exits 1 if any failed."""

import asyncio
import os
import re
import signal
import subprocess
import sys
import tempfile
import time

import jwt
import websockets

BIN = os.environ["WSPUSH_BIN"]
KEYS = os.environ["WSPUSH_KEYS"]
SECRET = "a-secret-that-pyjwt-and-wspush-share"
TIMEOUT = 10


def key(name):
    with open(os.path.join(KEYS, name)) as f:
        return f.read()


class Server:
    """wspush with `args`, its input a pipe of commands."""

    def __init__(self, args):
        self.process = subprocess.Popen(
            [BIN, "--listen", "127.0.0.1:0", "--quiet", "--input", "commands", *args],
            stdin=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        deadline = time.monotonic() + TIMEOUT
        while time.monotonic() < deadline:
            line = self.process.stderr.readline()
            found = re.search(r"listening on (127\.0\.0\.1:\d+) ", line)
            if found:
                self.addr = found[1]
                return
            if not line and self.process.poll() is not None:
                break
        raise RuntimeError(f"wspush {args} did not start")

    def send(self, line):
        self.process.stdin.write(line + "\n")
        self.process.stdin.flush()

    def stop(self):
        self.process.send_signal(signal.SIGINT)
        self.process.wait(TIMEOUT)


async def refused_with(url, headers=None):
    """The HTTP status an upgrade is refused with (None if it was not)."""
    try:
        async with websockets.connect(url, additional_headers=headers or {}, open_timeout=TIMEOUT):
            return None
    except websockets.exceptions.InvalidStatus as refused:
        return refused.response.status_code


async def check_algorithm(alg, key_file, signing_key):
    with tempfile.NamedTemporaryFile("w", suffix=".key") as f:
        f.write(key_file)
        f.flush()
        server = Server(["--jwt-alg", alg, "--jwt-key-file", f.name, "--require-token-id"])
    try:
        now = int(time.time())
        alice = jwt.encode({"sub": "alice", "exp": now + 600, "channels": ["news.*"]}, signing_key, alg)
        bob = jwt.encode({"sub": "bob", "exp": now + 600, "iat": now}, signing_key, alg)
        base = f"ws://{server.addr}/"
        async with websockets.connect(
            f"{base}?channel=news.eu", additional_headers={"Authorization": f"Bearer {alice}"}
        ) as by_header, websockets.connect(f"{base}?token={bob}") as by_query:
            # Both are open once the server has counted them: a command
            # sent before would reach nobody.
            await asyncio.sleep(0.2)
            server.send(f"id bob for bob ({alg})")
            server.send(f"id alice for alice ({alg})")
            server.send(f"pub news.eu news ({alg})")
            got_alice = [await asyncio.wait_for(by_header.recv(), TIMEOUT) for _ in range(2)]
            got_bob = await asyncio.wait_for(by_query.recv(), TIMEOUT)
        assert got_alice == [f"for alice ({alg})", f"news ({alg})"], got_alice
        assert got_bob == f"for bob ({alg})", got_bob
        expired = jwt.encode({"sub": "alice", "exp": now - 60}, signing_key, alg)
        assert await refused_with(f"{base}?token={expired}") == 401
        assert await refused_with(f"{base}?id=alice&token={bob}") == 403
        other = "HS256" if alg != "HS256" else "HS384"
        forged = jwt.encode({"sub": "alice", "exp": now + 60}, SECRET + "-but-longer", other)
        assert await refused_with(f"{base}?token={forged}") == 401
    finally:
        server.stop()


async def refusal_body(url):
    """The status and body an upgrade is refused with (None if it was not)."""
    try:
        async with websockets.connect(url, open_timeout=TIMEOUT):
            return None
    except websockets.exceptions.InvalidStatus as refused:
        return refused.response.status_code, refused.response.body.decode().strip()


async def check_null_claims():
    """PyJWT writes None as null: such a claim is refused, never absent
    (which, with no --require-token-id or --allow-channel, would bind the
    bearer to no id and no channel)."""
    with tempfile.NamedTemporaryFile("w", suffix=".key") as f:
        f.write(SECRET)
        f.flush()
        server = Server(["--jwt-alg", "HS256", "--jwt-key-file", f.name])
    try:
        base = f"ws://{server.addr}/"
        now = int(time.time())
        for claim in ["sub", "channels", "nbf", "exp", "aud", "iss"]:
            claims = {"exp": now + 600}
            claims[claim] = None
            token = jwt.encode(claims, SECRET, "HS256")
            got = await refusal_body(f"{base}?id=bob&channel=anything&token={token}")
            assert got == (401, f"malformed token: {claim} is null"), (claim, got)
        taken = jwt.encode({"exp": now + 600}, SECRET, "HS256")
        assert await refusal_body(f"{base}?id=bob&token={taken}") is None
    finally:
        server.stop()


CHECKS = [
    ("HS256", SECRET + "\n", SECRET),
    ("RS256", key("rsa-public.pem"), key("rsa-private.pem")),
    ("ES256", key("ec-public.pem"), key("ec-private.pem")),
]


async def main():
    failed = 0
    for alg, key_file, signing_key in CHECKS:
        name = f"PyJWT {jwt.__version__} {alg} tokens are taken by header and query; expired, forged and a foreign id refused"
        try:
            await check_algorithm(alg, key_file, signing_key)
            print(f"PASS {name}")
        except Exception as error:  # noqa: BLE001 - every failure is reported
            failed += 1
            print(f"FAIL {name}: {error!r}")
    name = f"PyJWT {jwt.__version__} tokens with a null claim (None) are refused as malformed"
    try:
        await check_null_claims()
        print(f"PASS {name}")
    except Exception as error:  # noqa: BLE001 - every failure is reported
        failed += 1
        print(f"FAIL {name}: {error!r}")
    print(f"{len(CHECKS) + 1 - failed} passed, {failed} failed")
    return 1 if failed else 0


sys.exit(asyncio.run(main()))
