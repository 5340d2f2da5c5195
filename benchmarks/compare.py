"""Compare two benchmark runs written by ``bench.py --json``: tcpy's time per case in each, their
ratio, and each run's ratio to NumPy (and to torch when both runs have it).

    python benchmarks/compare.py BEFORE.json AFTER.json [--tolerance 0.05]

``after/before`` is AFTER's tcpy time divided by BEFORE's (below 1: AFTER is faster); a case
beyond the tolerance either way is marked. The geometric mean over the cases both runs have
closes the table. Times of two runs on a shared machine differ by its load too: the ratios to
NumPy, measured in the same process as tcpy's, move less than the times.
"""
from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path


def load(path: Path) -> dict:
    """A run's JSON, its cases keyed by (name, shapes)."""
    report = json.loads(path.read_text())
    report["by_case"] = {(c["name"], c["shapes"]): c for c in report["cases"]}
    return report


def versus(case: dict, other: str) -> str:
    """``other``'s time over tcpy's in one run, or a dash."""
    seconds = case["seconds"]
    return f"{seconds[other] / seconds['tcpy']:5.2f}x" if other in seconds else "    -"


def compare(before: dict, after: dict, tolerance: float) -> list[str]:
    """The comparison table, one line per case of both runs, then the geometric mean."""
    lines = [f"before: {before['date']}, commit {before['commit']}, {before['threads']} threads, {before['machine']}",
             f"after:  {after['date']}, commit {after['commit']}, {after['threads']} threads, {after['machine']}",
             f"{'case':<10} {'shapes':<36} {'before ms':>10} {'after ms':>10} {'after/before':>12}"
             f"   numpy/tcpy before after   torch/tcpy before after"]
    logs = []
    for key, old in before["by_case"].items():
        new = after["by_case"].get(key)
        if new is None:
            continue
        t_old, t_new = old["seconds"]["tcpy"], new["seconds"]["tcpy"]
        ratio = t_new / t_old
        logs.append(math.log(ratio))
        mark = "  slower" if ratio > 1 + tolerance else "  faster" if ratio < 1 - tolerance else ""
        lines.append(f"{key[0]:<10} {key[1]:<36} {t_old * 1e3:10.3f} {t_new * 1e3:10.3f} {ratio:11.3f}x"
                     f"   {versus(old, 'numpy'):>17} {versus(new, 'numpy')}"
                     f"   {versus(old, 'torch'):>17} {versus(new, 'torch')}{mark}")
    only = [f"{k[0]} {k[1]}" for k in before["by_case"].keys() ^ after["by_case"].keys()]
    if logs:
        lines.append(f"geometric mean of after/before over {len(logs)} cases: {math.exp(sum(logs) / len(logs)):.3f}x")
    if only:
        lines.append("in one run only: " + ", ".join(sorted(only)))
    return lines


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("before", type=Path)
    parser.add_argument("after", type=Path)
    parser.add_argument("--tolerance", type=float, default=0.05,
                        help="mark cases whose time moved by more than this fraction (default 0.05)")
    args = parser.parse_args(argv)
    for line in compare(load(args.before), load(args.after), args.tolerance):
        print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
