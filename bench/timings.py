#!/usr/bin/env python3
"""Reads cargo's --timings report and prints `units=N` and the N heaviest
units as `unit=SECONDS NAME VERSION (TARGET)` lines, heaviest first.

    python3 bench/timings.py target/cargo-timings/cargo-timing.html 8
"""
import json
import re
import sys

html = open(sys.argv[1], encoding="utf-8").read()
top = int(sys.argv[2]) if len(sys.argv) > 2 else 8
match = re.search(r"const UNIT_DATA = (\[.*?\]);\s*$", html, re.S | re.M)
if not match:
    sys.exit("no UNIT_DATA in " + sys.argv[1])
units = json.loads(match.group(1))
print(f"units={len(units)}")
units.sort(key=lambda u: u["duration"], reverse=True)
for u in units[:top]:
    target = u.get("target", "").strip()
    name = f"{u['name']} {u['version']}" + (f" ({target})" if target else "")
    print(f"unit={u['duration']:.1f} {name}")
