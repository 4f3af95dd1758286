#!/usr/bin/env python3
"""No public type name defined twice in smolbox-core (issue 11, item 5).

Scans core/src (test modules and test files excluded) for `pub struct`,
`pub enum`, `pub trait`, `pub type` and `pub union` items and prints every
name defined in more than one place. Exits 1 when there is one, else 0.

Usage: python3 scripts/core-type-names.py
"""
import collections
import os
import re
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PAT = re.compile(r"^\s*pub (?:struct|enum|trait|type|union) ([A-Z][A-Za-z0-9_]*)")


def main():
    defs = collections.defaultdict(list)
    src = os.path.join(ROOT, "core", "src")
    for d, _, names in os.walk(src):
        for f in sorted(names):
            path = os.path.join(d, f)
            if not f.endswith(".rs") or f == "tests.rs" or "/tests/" in path:
                continue
            with open(path, encoding="utf-8") as fh:
                for n, line in enumerate(fh, 1):
                    m = PAT.match(line)
                    if m:
                        defs[m.group(1)].append(f"{os.path.relpath(path, ROOT)}:{n}")
    twice = {k: v for k, v in defs.items() if len(v) > 1}
    print(f"{len(defs)} public type names in core; {len(twice)} defined twice")
    for name, places in sorted(twice.items()):
        print(f"  {name}: {', '.join(places)}")
    return 1 if twice else 0


if __name__ == "__main__":
    sys.exit(main())
