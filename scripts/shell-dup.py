#!/usr/bin/env python3
"""Identical lines between the two shells (io-tokio vs io-blocking).

For each pair of corresponding source files, counts the lines of the tokio
side that belong to a run of at least MIN_RUN (6) consecutive lines found
identically, in the same order, in the blocking side. Before comparing, each
file is normalised: blank lines, comments (`//`, `///`, `//!`), lines of
lone punctuation (`}`, `});`, `)?;` ...), `use` declarations (also when they
span several lines) and `mod` lines are dropped, and runs of white space are
folded to one space. This is the same normalisation the `duplicates` tool
describes, restricted to identical (not "same shape") runs.

Usage: python3 scripts/shell-dup.py [--runs] [--min N] [--root DIR]
  --runs   also print every run (tokio lines ~ blocking lines)
  --root   measure another checkout (default: this one)
Prints one line per pair and the total; exits 0.
"""
import os
import re
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
T, B = "io-tokio/src", "io-blocking/src"

PAIRS = [
    ("client", [f"{T}/client.rs"], [f"{B}/client.rs"]),
    ("runtime", [f"{T}/runtime.rs"], [f"{B}/runtime.rs"]),
    ("managed_terminal", [f"{T}/managed_terminal.rs"], [f"{B}/managed_terminal.rs"]),
    ("stream", [f"{T}/stream.rs"], [f"{B}/stream.rs", f"{B}/callback.rs"]),
    ("runtime/stream", [f"{T}/runtime/stream.rs"], [f"{B}/runtime/stream.rs"]),
    ("tests", [f"{T}/tests.rs"], [f"{B}/tests"]),
    ("http", [f"{T}/http.rs"], [f"{B}/http.rs", f"{B}/errors.rs"]),
    ("terminal", [f"{T}/terminal.rs"], [f"{B}/terminal.rs"]),
    ("transport", [f"{T}/transport.rs"], [f"{B}/transport.rs", f"{B}/tls.rs"]),
    ("drive/conn", [f"{T}/drive.rs"], [f"{B}/conn.rs"]),
    ("pool", [f"{T}/pool.rs"], [f"{B}/pool.rs"]),
    ("lib", [f"{T}/lib.rs"], [f"{B}/lib.rs"]),
]

PUNCT = re.compile(r"^[\s{}()\[\];,?.|&]*$")


def files(paths):
    for p in paths:
        full = os.path.join(ROOT, p)
        if os.path.isdir(full):
            for name in sorted(os.listdir(full)):
                if name.endswith(".rs"):
                    yield os.path.join(full, name)
        elif os.path.exists(full):
            yield full


def normalise(paths):
    out = []  # (text, file, line number)
    for path in files(paths):
        in_use = False
        with open(path, encoding="utf-8") as f:
            for n, raw in enumerate(f, 1):
                s = raw.strip()
                if in_use:
                    in_use = not s.endswith(";")
                    continue
                if not s or s.startswith("//") or PUNCT.match(s):
                    continue
                if re.match(r"^(pub(\([a-z]+\))? )?(use|mod) ", s):
                    in_use = not s.endswith(";")
                    continue
                out.append((re.sub(r"\s+", " ", s), os.path.relpath(path, ROOT), n))
    return out


def runs(a, b, min_run):
    """Maximal identical runs (i_end, j_end, length) of a in b, length >= min_run."""
    n, m = len(a), len(b)
    prev = [0] * (m + 1)
    found = []
    for i in range(1, n + 1):
        cur = [0] * (m + 1)
        ai = a[i - 1][0]
        for j in range(1, m + 1):
            if ai == b[j - 1][0]:
                cur[j] = prev[j - 1] + 1
        for j in range(1, m + 1):
            k = cur[j]
            if k >= min_run and (i == n or j == m or a[i][0] != b[j][0]):
                found.append((i, j, k))
        prev = cur
    return found


def main():
    global ROOT
    if "--root" in sys.argv:
        ROOT = os.path.abspath(sys.argv[sys.argv.index("--root") + 1])
    show = "--runs" in sys.argv
    min_run = 6
    if "--min" in sys.argv:
        min_run = int(sys.argv[sys.argv.index("--min") + 1])
    total = 0
    for name, tp, bp in PAIRS:
        a, b = normalise(tp), normalise(bp)
        found = runs(a, b, min_run)
        marked = set()
        for i, _, k in found:
            marked.update(range(i - k, i))
        total += len(marked)
        print(f"{name:18} {len(marked):5}")
        if show:
            for i, j, k in found:
                print(f"    {k:3} lines  {a[i-k][1]}:{a[i-k][2]}-{a[i-1][2]}"
                      f" ~ {b[j-k][1]}:{b[j-k][2]}-{b[j-1][2]}")
    print(f"{'total':18} {total:5}")


if __name__ == "__main__":
    main()
