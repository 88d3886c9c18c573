#!/usr/bin/env python3
"""Copies result JSON into the repository with directories dropped from the absolute paths in it
(the command line, the model path), so that a committed record names files, not machines.

    python scripts/sanitize_json.py IN.json OUT.json
"""
import json
import os
import re
import sys

ABS = re.compile(r"(?<![\w.])/(?:[\w.+-]+/)+([\w.+-]+)")


def clean(v):
    if isinstance(v, str):
        return ABS.sub(lambda m: m.group(1), v)
    if isinstance(v, list):
        return [clean(x) for x in v]
    if isinstance(v, dict):
        return {k: clean(x) for k, x in v.items()}
    return v


def main(argv):
    if len(argv) != 3:
        print(__doc__, file=sys.stderr)
        return 2
    with open(argv[1]) as f:
        d = json.load(f)
    tmp = argv[2] + ".tmp"
    with open(tmp, "w") as f:
        json.dump(clean(d), f, indent=1)
        f.write("\n")
    os.replace(tmp, argv[2])
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
