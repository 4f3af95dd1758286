#!/usr/bin/env python3
"""docs/decisions.md lists every decision: each `## ` section title of each
topic file under docs/decisions/ appears, once, as a `- ` item under that
file's heading in the index, and the index names no section that is gone.
Exit 1 with the differences otherwise."""
import os
import re
import sys

root = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
index_path = os.path.join(root, "docs", "decisions.md")
index = open(index_path, encoding="utf-8").read()

# Split the index by `## [Title](decisions/file.md)` headings.
listed = {}
current = None
for line in index.splitlines():
    m = re.match(r"^## \[[^\]]+\]\(decisions/([^)]+)\)\s*$", line)
    if m:
        current = m.group(1)
        listed.setdefault(current, [])
        continue
    if line.startswith("## "):
        current = None
        continue
    if current and line.startswith("- "):
        listed[current].append(line[2:].strip())

bad = []
topic_dir = os.path.join(root, "docs", "decisions")
for name in sorted(os.listdir(topic_dir)):
    if not name.endswith(".md"):
        continue
    text = open(os.path.join(topic_dir, name), encoding="utf-8").read()
    sections = [l[3:].strip() for l in text.splitlines() if l.startswith("## ")]
    items = listed.get(name)
    if items is None:
        bad.append(f"docs/decisions.md has no heading for decisions/{name}")
        continue
    for s in sections:
        n = items.count(s)
        if n != 1:
            bad.append(f"decisions/{name}: section {s!r} listed {n} times in the index")
    for i in items:
        if i not in sections:
            bad.append(f"decisions/{name}: the index lists {i!r}, which is no section there")
for name in listed:
    if not os.path.exists(os.path.join(topic_dir, name)):
        bad.append(f"docs/decisions.md names decisions/{name}, which does not exist")

for b in bad:
    print(b, file=sys.stderr)
if bad:
    sys.exit(1)
print(f"decisions index: {sum(len(v) for v in listed.values())} sections, all listed")
