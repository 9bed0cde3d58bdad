"""Measure instrumentation overhead as ratios (instrumented / plain).

Two measurements, both printed as the median over rounds of a per-round
ratio, so that machine noise common to both sides cancels:

  modes    each workload with and without a mode, alternating, in one
           process (one process per mode, so no mode leaves state behind
           for another); for every interpreter given with --python.
  builds   each workload on interpreter B against interpreter A, with no
           tool active, alternating processes: e.g. Sightglass against a
           stock 3.11.2 build (--builds STOCK SIGHTGLASS).

  python3 bench/run.py --python build/stock/python --python ./python
  python3 bench/run.py --builds build/stock/python ./python

Numbers only; no test depends on them.
"""

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import workloads  # noqa: E402
from modes import MODES  # noqa: E402

TARGET = 0.15       # seconds one timed run should last


def calibrate(func):
    """How many calls of func make one timed run of about TARGET."""
    n = 1
    while True:
        t = timed(func, n)
        if t >= TARGET / 4 or n >= 1 << 16:
            return max(1, int(n * TARGET / t)) if t > 0 else n
        n *= 2


def heap_shift(r):
    """The shift of round r: rounds spread over an arena's 64 pools."""
    return r * 13 % 64


def ballast(pools):
    """Blocks kept for a whole timed run, about so many pools of them.

    Where a workload's blocks fall among pymalloc's 1 MiB arenas decides
    whether each call empties an arena that the next call maps again
    (json_io: 150 mmap/munmap pairs and a fifth more time in one process,
    none in another whose heap differed by a few strings).  Either build
    can draw that, so rounds shift the heap by different amounts, and the
    fastest round counts."""
    return [bytes(400) for _ in range(36 * pools)]


def timed(func, n):
    start = time.perf_counter()
    for _ in range(n):
        func()
    return time.perf_counter() - start


def measure_mode(mode, names, rounds):
    """{workload: median ratio} for one mode, in this process."""
    start, stop = MODES[mode][:2]
    out = {}
    for name in names:
        func = workloads.ALL[name]
        n = calibrate(func)
        start()
        try:
            timed(func, 1)          # first pass: lets DISABLE take effect
        finally:
            stop()
        ratios = []
        for r in range(rounds):
            plain_first = r % 2 == 0
            if plain_first:
                plain = timed(func, n)
            start()
            try:
                inst = timed(func, n)
            finally:
                stop()
            if not plain_first:
                plain = timed(func, n)
            ratios.append(inst / plain)
        out[name] = statistics.median(ratios)
    return out


def geomean(values):
    """The summary of a set of ratios, as pyperformance gives it."""
    return math.exp(statistics.mean(math.log(v) for v in values))


def run_child(python, args):
    proc = subprocess.run([python, os.path.abspath(__file__)] + args,
                          stdout=subprocess.PIPE, text=True)
    if proc.returncode:
        raise SystemExit(f"{python} {' '.join(args)} failed")
    return json.loads(proc.stdout)


def interpreter_name(python):
    return subprocess.run(
        [python, "-c", "import platform, sys; print(platform."
         "python_version(), sys.version.split('(')[1].split(',')[0])"],
        stdout=subprocess.PIPE, text=True).stdout.strip()


def table(rows, names):
    """One row of ratios per label; with several workloads, their
    geometric mean last."""
    summary = ["geomean"] if len(names) > 1 else []
    width = max(len(r[0]) for r in rows) + 2
    col = max(len(n) for n in names + summary) + 2
    print("".ljust(width) + "".join(n.rjust(col) for n in names + summary))
    for label, values in rows:
        if summary:
            values = dict(values, geomean=geomean(values[n] for n in names))
        print(label.ljust(width)
              + "".join(f"{values[n]:{col}.2f}" for n in names + summary))


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--python", action="append",
                   help="interpreter to measure modes on (repeatable)")
    p.add_argument("--mode", action="append",
                   help="mode to measure (default: all it supports)")
    workloads.add_arguments(p)
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--builds", nargs=2, metavar=("A", "B"),
                   help="time B against A with no tool active")
    p.add_argument("--child-mode", help=argparse.SUPPRESS)
    p.add_argument("--child-time", help=argparse.SUPPRESS)
    p.add_argument("--heap-shift", type=int, default=0,
                   help=argparse.SUPPRESS)
    p.add_argument("--child-modes", action="store_true",
                   help=argparse.SUPPRESS)
    ns = p.parse_args()
    names = workloads.chosen(ns)

    if ns.child_modes:
        print(json.dumps({m: MODES[m][2] for m in sorted(MODES)}))
        return
    if ns.child_mode:
        print(json.dumps(measure_mode(ns.child_mode, names, ns.rounds)))
        return
    if ns.child_time:
        func = workloads.ALL[ns.child_time]
        n = int(ns.rounds)
        kept = ballast(ns.heap_shift)
        timed(func, max(1, n // 4))                 # warm up
        print(json.dumps(min(timed(func, n) for _ in range(3))))
        del kept
        return

    if ns.builds:
        a, b = ns.builds
        print(f"B / A, no tool active; A = {interpreter_name(a)}, "
              f"B = {interpreter_name(b)}")
        ratios = {}
        for name in names:
            n = calibrate(workloads.ALL[name])
            per_round = []
            for r in range(ns.rounds):
                order = (a, b) if r % 2 == 0 else (b, a)
                t = {py: run_child(py, ["--child-time", name,
                                        "--rounds", str(n),
                                        "--heap-shift", str(heap_shift(r))])
                     for py in order}
                per_round.append(t[b] / t[a])
            ratios[name] = statistics.median(per_round)
        table([("B / A", ratios)], names)
        return

    rows, described = [], {}
    for python in ns.python or [sys.executable]:
        label = interpreter_name(python)
        supported = run_child(python, ["--child-modes"])
        described.update(supported)
        for mode in ns.mode or supported:
            if mode not in supported:
                continue
            ratios = run_child(python, ["--child-mode", mode,
                                        "--rounds", str(ns.rounds)]
                               + sum((["--workload", n] for n in names),
                                     []))
            rows.append((f"{label} {mode}", ratios))
    if not rows:
        raise SystemExit(f"no interpreter given supports "
                         f"{', '.join(ns.mode)}; "
                         f"modes: {', '.join(sorted(described))}")
    print("instrumented / plain, median of per-round ratios "
          f"({ns.rounds} rounds):")
    table(rows, names)
    print()
    for mode in sorted({r[0].split()[-1] for r in rows}):
        print(f"  {mode}: {described[mode]}")


if __name__ == "__main__":
    main()
