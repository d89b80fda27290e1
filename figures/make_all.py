"""Rebuild every figure from the code and the saved results: ``python -m figures.make_all``.

Each figure module exposes ``main(out_dir) -> list[paths]``. A module whose saved results are
missing raises ``FileNotFoundError``; it is reported and skipped so the others still build.
"""

from __future__ import annotations

import argparse
import importlib
import sys

MODULES = ["figures.theory"]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", help="output folder (default figures/out)")
    args = p.parse_args(argv)
    missing = 0
    for name in MODULES:
        try:
            paths = importlib.import_module(name).main(args.out)
        except FileNotFoundError as exc:
            print(f"{name}: skipped, saved results not found ({exc})", file=sys.stderr)
            missing += 1
            continue
        for path in paths:
            print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
