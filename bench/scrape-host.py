#!/usr/bin/env python3
"""Scrapes a host's /metrics (a supervisor's --metrics-listen) once a
second until stopped (SIGTERM or SIGINT), as Prometheus would, and says
how long each answer took. Every tenth answer is also checked against the
instances' own pages (PORT+1 ... PORT+K): the host's sums of a few series
should equal the sums of the instances' own, read just after it, when the
host's page read again after them has not moved meanwhile (a check made
while connections come or broadcasts go out is left out).

Usage: bench/scrape-host.py PORT INSTANCES [EVERY_SECONDS]
Prints one summary line at the end (scrapes, answer times, checks).

It runs at the highest priority it may (nice -20 as root): a Prometheus
scrapes from another machine, while this one shares the bench machine's
cores with every instance, and its own wait for a CPU is not the
server's answer time. The line says the priority it ran at.
"""

import os
import signal
import socket
import sys
import time

SERIES = ["wspush_upgrades_total", "wspush_broadcast_deliveries_total",
          "wspush_connections_open"]


def get(port, path="/metrics", timeout=10.0):
    """The body of GET path on 127.0.0.1:port, and how long it took (s)."""
    start = time.monotonic()
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
        s.sendall(f"GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n".encode())
        chunks = []
        while True:
            chunk = s.recv(1 << 16)
            if not chunk:
                break
            chunks.append(chunk)
    took = time.monotonic() - start
    head, _, body = b"".join(chunks).partition(b"\r\n\r\n")
    if not head.startswith(b"HTTP/1.1 200"):
        raise OSError(head.split(b"\r\n")[0].decode(errors="replace"))
    return body.decode(), took


def sample(page, series):
    for line in page.splitlines():
        name, _, value = line.partition(" ")
        if name == series:
            return int(float(value))
    return None


def main():
    port, instances = int(sys.argv[1]), int(sys.argv[2])
    try:
        os.nice(-20)
    except OSError:
        pass
    niceness = os.nice(0)
    every = float(sys.argv[3]) if len(sys.argv) > 3 else 1.0
    stop = []
    signal.signal(signal.SIGTERM, lambda *_: stop.append(1))
    signal.signal(signal.SIGINT, lambda *_: stop.append(1))
    took, failed, checks, equal, unequal, moving = [], 0, 0, 0, [], 0
    while not stop:
        at = time.monotonic()
        try:
            page, seconds = get(port)
            took.append(seconds)
            if len(took) % 10 == 0:
                own = [get(port + k)[0] for k in range(1, instances + 1)]
                host = [sample(page, s) for s in SERIES]
                if host != [sample(get(port)[0], s) for s in SERIES]:
                    moving += 1
                else:
                    checks += 1
                    summed = [sum(sample(p, s) or 0 for p in own) for s in SERIES]
                    if host == summed:
                        equal += 1
                    else:
                        unequal.append((host, summed))
        except OSError:
            failed += 1
        time.sleep(max(0.0, every - (time.monotonic() - at)))
    took.sort()
    pick = lambda q: took[min(len(took) - 1, int(q * len(took)))] * 1e3 if took else float("nan")
    print(f"scrape-host (nice {niceness}): {len(took)} answers ({failed} not answered), "
          f"ms p50 {pick(0.5):.1f} p99 {pick(0.99):.1f} max {pick(1.0):.1f}; "
          f"sums equal to the instances' own in {equal} of {checks} checks "
          f"({moving} left out: the host's page moved meanwhile)"
          + (f" (first unequal: host {unequal[0][0]} instances {unequal[0][1]})" if unequal else ""))


if __name__ == "__main__":
    main()
