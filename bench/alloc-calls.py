#!/usr/bin/env python3
"""Calls to the C allocator (malloc, calloc, realloc, posix_memalign,
aligned_alloc) in a callgrind profile, for bench/instructions.sh.

Usage: bench/alloc-calls.py PROFILE   # prints the total number of calls
"""
import re
import sys

ALLOCATORS = {"malloc", "calloc", "realloc", "posix_memalign", "aligned_alloc"}

names = {}
total = 0
callee = None
with open(sys.argv[1], encoding="utf-8", errors="replace") as f:
    for line in f:
        if line.startswith(("fn=", "cfn=", "cfi=", "cob=")):
            key, _, rest = line.partition("=")
            m = re.match(r"\((\d+)\)(?: (.*))?", rest.strip())
            if key in ("fn", "cfn") and m:
                ident, name = m.group(1), m.group(2)
                if name is not None:
                    names[ident] = name
                if key == "cfn":
                    callee = names.get(ident)
            elif key == "cfn":
                callee = rest.strip()
        elif line.startswith("calls="):
            if callee in ALLOCATORS:
                total += int(line[6:].split()[0])
            callee = None
print(total)
