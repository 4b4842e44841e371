#!/usr/bin/env python3
"""ncu_summary.py - where a GPU step's kernel time goes, from Nsight Compute's raw CSV.

    ncu_summary.py NCU.csv STEPS [TOP]

NCU.csv is what `ncu --csv --page raw --print-units base --metrics gpu__time_duration.sum,
sm__throughput.avg.pct_of_peak_sustained_elapsed,gpu__compute_memory_throughput.avg.pct_of_peak_
sustained_elapsed --log-file NCU.csv <program>` wrote (lines that are not CSV records, such as
ncu's ==PROF== messages, are skipped). STEPS is how many policy steps the program ran, to give
the kernel time per step. Kernels are grouped by function name; each group's compute (sm) and
memory throughput are time-weighted means, in % of the GPU's peak ("speed of light").
Prints one line (the device check's row figure) and then the TOP groups (default 15), one per
line. Exit status 1 when the file holds no kernel record (ncu could not profile)."""

from __future__ import annotations

import collections
import csv
import sys

TIME = "gpu__time_duration.sum"
SM = "sm__throughput.avg.pct_of_peak_sustained_elapsed"
MEM = "gpu__compute_memory_throughput.avg.pct_of_peak_sustained_elapsed"
TO_US = {"nsecond": 1e-3, "ns": 1e-3, "usecond": 1.0, "us": 1.0, "msecond": 1e3, "ms": 1e3,
         "second": 1e6, "s": 1e6}


def number(text: str) -> float | None:
    try:
        return float(text.replace(",", ""))
    except ValueError:
        return None


def short(name: str) -> str:
    """`void ns::kern<float, 4>(Args)` -> `ns::kern`; long library kernel names are cut."""
    name = name.strip()
    if name.startswith("void "):
        name = name[5:]
    for stop in ("(", "<"):
        name = name.split(stop)[0]
    return name[:48] or "?"


def summarize(path: str, steps: int, top: int = 15):
    with open(path, errors="replace") as f:
        records = list(csv.reader(line for line in f if line.startswith('"')))
    header = next((r for r in records if "Kernel Name" in r and TIME in r), None)
    if header is None:
        return None
    at = {k: header.index(k) for k in ("Kernel Name", TIME, SM, MEM) if k in header}
    body = records[records.index(header) + 1:]
    scale = 1e-3   # --print-units base: nanoseconds
    if body and number(body[0][at[TIME]]) is None:   # the units row
        scale = TO_US.get(body[0][at[TIME]].strip(), 1e-3)
        body = body[1:]
    groups = collections.defaultdict(lambda: [0, 0.0, 0.0, 0.0])   # launches, us, sm*us, mem*us
    for r in body:
        if len(r) != len(header) or number(r[at[TIME]]) is None:
            continue
        us = number(r[at[TIME]]) * scale
        g = groups[short(r[at["Kernel Name"]])]
        g[0] += 1
        g[1] += us
        for i, k in ((2, SM), (3, MEM)):
            v = number(r[at[k]]) if k in at else None
            g[i] += (v or 0.0) * us
    if not groups:
        return None
    total = sum(g[1] for g in groups.values()) or 1e-9
    launches = sum(g[0] for g in groups.values())
    ranked = sorted(groups.items(), key=lambda kv: -kv[1][1])

    def describe(name, g):
        return (f"{name} {100 * g[1] / total:.0f}% (x{g[0]}, sm {g[2] / max(g[1], 1e-9):.0f}%, "
                f"mem {g[3] / max(g[1], 1e-9):.0f}%)")

    line = (f"{launches / steps:.0f} kernels, {total / steps:.1f} us of kernel time per step; "
            + "; ".join(describe(n, g) for n, g in ranked[:3]))
    return line, [describe(n, g) for n, g in ranked[:top]]


def main(argv) -> int:
    if len(argv) < 3:
        print(__doc__, file=sys.stderr)
        return 2
    res = summarize(argv[1], max(int(argv[2]), 1), int(argv[3]) if len(argv) > 3 else 15)
    if res is None:
        print(f"ncu_summary: no kernel records in {argv[1]}", file=sys.stderr)
        return 1
    print(res[0])
    for line in res[1]:
        print("  " + line)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
