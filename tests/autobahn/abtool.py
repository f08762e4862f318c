# -*- coding: utf-8 -*-
"""Helpers for tests/autobahn/run.sh (runs under Python 2.7 and Python 3).

  abtool.py spec TEMPLATE OUT --url URL --outdir DIR [--cases "1.*,2.1"]
      Write the wstest fuzzingclient spec: TEMPLATE with servers/outdir (and,
      when --cases is given, cases) replaced.

  abtool.py summary INDEX_JSON [--expect N]
      Print per-behavior counts for `behavior` and `behaviorClose`, list every
      case that is not OK/INFORMATIONAL, and exit 1 if there is any such case
      or if N > 0 and the number of cases run is not N.

  abtool.py pypi-fetch PROJECT VERSION FILENAME SHA256 OUT
      Download one release file from PyPI (located through the simple index)
      to OUT, verifying its SHA-256; used to bootstrap pip.
"""
from __future__ import print_function

import argparse
import hashlib
import json
import os
import re
import sys

GOOD = ("OK", "INFORMATIONAL")

# Column -> behaviors counted in it (Autobahn's own names).
COLUMNS = [
    ("Pass", ("OK",)),
    ("Non-Strict", ("NON-STRICT",)),
    ("Informational", ("INFORMATIONAL",)),
    ("Unclean", ("UNCLEAN",)),
    ("Failed", ("FAILED", "FAILED BY CLIENT", "WRONG CODE")),
    ("Unimplemented", ("UNIMPLEMENTED",)),
]


def case_key(case_id):
    return tuple(int(p) if p.isdigit() else p for p in re.split(r"[.]", case_id))


def cmd_spec(args):
    with open(args.template) as f:
        spec = json.load(f)
    spec["outdir"] = args.outdir
    spec["servers"] = [{"url": args.url}]
    if args.cases:
        spec["cases"] = [c for c in re.split(r"[\s,]+", args.cases) if c]
    spec.setdefault("exclude-cases", [])
    spec.setdefault("exclude-agent-cases", {})
    with open(args.out, "w") as f:
        json.dump(spec, f, indent=2, sort_keys=True)
        f.write("\n")
    return 0


def count(results, field):
    counts = dict((name, 0) for name, _ in COLUMNS)
    counts["Other"] = 0
    for r in results.values():
        b = r.get(field)
        for name, bs in COLUMNS:
            if b in bs:
                counts[name] += 1
                break
        else:
            counts["Other"] += 1
    return counts


def cmd_summary(args):
    try:
        with open(args.index) as f:
            index = json.load(f)
    except (IOError, OSError, ValueError) as e:
        print("autobahn: cannot read report index %s: %s" % (args.index, e))
        index = {}
    agents = sorted(index)
    if len(agents) > 1:
        print("autobahn: expected one agent in %s, found %d: %s"
              % (args.index, len(agents), ", ".join(agents)))
        results = {}
        agent = "?"
    elif agents:
        agent = agents[0]
        results = index[agent]
    else:
        agent = "(none)"
        results = {}
    total = len(results)

    print("")
    print("Autobahn|Testsuite fuzzingclient: agent '%s', %d cases (report: %s)"
          % (agent, total, os.path.dirname(os.path.abspath(args.index))))
    names = [name for name, _ in COLUMNS] + ["Other"]
    print("  %-14s %s" % ("", " ".join("%*s" % (max(len(n), 5), n) for n in names)))
    for field in ("behavior", "behaviorClose"):
        c = count(results, field)
        print("  %-14s %s" % (field, " ".join("%*d" % (max(len(n), 5), c[n]) for n in names)))

    bad = []
    for cid in sorted(results, key=case_key):
        r = results[cid]
        if r.get("behavior") not in GOOD or r.get("behaviorClose") not in GOOD:
            bad.append((cid, r))
    if bad:
        print("")
        print("Cases not OK/INFORMATIONAL (%d):" % len(bad))
        for cid, r in bad:
            print("  %-8s behavior=%-14s behaviorClose=%-14s remoteCloseCode=%s  %s"
                  % (cid, r.get("behavior"), r.get("behaviorClose"),
                     r.get("remoteCloseCode"), r.get("reportfile", "")))

    problems = []
    if bad:
        problems.append("%d case(s) not OK/INFORMATIONAL" % len(bad))
    missing = 0
    if args.expect and total != args.expect:
        problems.append("%d cases run, expected %d" % (total, args.expect))
        missing = max(0, args.expect - total)
    if total == 0:
        problems.append("no case was run")
    print("")
    if problems:
        print("autobahn: FAIL: " + "; ".join(problems))
    else:
        print("autobahn: PASS: all %d cases OK or INFORMATIONAL" % total)
    print("autobahn: %d passed, %d failed" % (total - len(bad), len(bad) + missing))
    return 1 if problems else 0


def cmd_pypi_fetch(args):
    try:
        from urllib.request import urlopen  # Python 3
    except ImportError:
        from urllib2 import urlopen  # Python 2

    def get(url):
        last = None
        for _ in range(3):
            try:
                return urlopen(url, timeout=120).read()
            except Exception as e:  # network hiccup: retry
                last = e
        raise last

    try:
        from urllib.parse import urljoin  # Python 3
    except ImportError:
        from urlparse import urljoin  # Python 2

    # PEP 503 simple index (what pip itself reads).
    index = os.environ.get("PIP_INDEX_URL") or "https://pypi.org/simple/"
    page_url = urljoin(index.rstrip("/") + "/", args.project + "/")
    page = get(page_url).decode("utf-8", "replace")
    urls = [urljoin(page_url, href.split("#", 1)[0].replace("&amp;", "&"))
            for href, name in re.findall(r'<a\s[^>]*href="([^"]+)"[^>]*>([^<]+)</a>', page)
            if name.strip() == args.filename]
    if not urls:
        print("abtool pypi-fetch: no file %s in %s" % (args.filename, page_url), file=sys.stderr)
        return 1
    data = get(urls[0])
    digest = hashlib.sha256(data).hexdigest()
    if digest != args.sha256:
        print("abtool pypi-fetch: %s: sha256 %s, expected %s" % (urls[0], digest, args.sha256),
              file=sys.stderr)
        return 1
    tmp = args.out + ".part"
    with open(tmp, "wb") as f:
        f.write(data)
    os.rename(tmp, args.out)
    return 0


def main(argv):
    p = argparse.ArgumentParser(prog="abtool.py")
    sub = p.add_subparsers(dest="cmd")
    s = sub.add_parser("spec")
    s.add_argument("template")
    s.add_argument("out")
    s.add_argument("--url", required=True)
    s.add_argument("--outdir", required=True)
    s.add_argument("--cases", default="")
    s = sub.add_parser("summary")
    s.add_argument("index")
    s.add_argument("--expect", type=int, default=0)
    s = sub.add_parser("pypi-fetch")
    s.add_argument("project")
    s.add_argument("version")
    s.add_argument("filename")
    s.add_argument("sha256")
    s.add_argument("out")
    args = p.parse_args(argv)
    if args.cmd == "spec":
        return cmd_spec(args)
    if args.cmd == "summary":
        return cmd_summary(args)
    if args.cmd == "pypi-fetch":
        return cmd_pypi_fetch(args)
    p.print_help()
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
