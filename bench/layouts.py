"""Time build B against build A over several code layouts of each.

Rebuilding moves every function, and on these machines that alone moves a
workload's time by several percent (exc: 12 % between two links of the
same objects), so a ratio taken from one pair of builds says as much about
where the code landed as about what changed.  This relinks each build's
python once per seed with its functions in a shuffled order (lld's
--shuffle-sections), times every layout on every workload, alternating,
and reports B / A as the ratio of the geometric means over the layouts,
with the spread of each side.

Both builds must be configured for it, once:

  ../src/configure [--with-memory-tracking] CFLAGS=-ffunction-sections \\
      LDFLAGS=-fuse-ld=lld ...

  python3 bench/layouts.py build/lay-plain build/lay-track --seeds 4

The layouts are left beside each build's python as python-layout-SEED, and
python itself is relinked in its usual order at the end.
"""

import argparse
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import workloads  # noqa: E402
from run import calibrate, geomean, heap_shift, run_child  # noqa: E402

LINKER = "-fuse-ld=lld"


def check_build(build):
    with open(os.path.join(build, "Makefile")) as f:
        text = f.read()
    if "-ffunction-sections" not in text or LINKER not in text:
        raise SystemExit(f"{build}: configure it with "
                         f"CFLAGS=-ffunction-sections LDFLAGS={LINKER}")


def link(build, *make_args):
    """Relink build's python; configure's own LDFLAGS (lld) stay in force,
    and LDFLAGS given here are added to them."""
    python = os.path.join(build, "python")
    if os.path.exists(python):
        os.remove(python)
    subprocess.run(["make", "-C", build, "python", *make_args],
                   stdout=subprocess.DEVNULL, check=True)
    return python


def layouts(build, seeds):
    """Link one python per seed, each with its own order of functions."""
    out = []
    for seed in seeds:
        python = link(build, f"LDFLAGS=-Wl,--shuffle-sections=.text*={seed}")
        path = os.path.join(build, f"python-layout-{seed}")
        os.replace(python, path)
        out.append(path)
    link(build)
    return out


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("a")
    p.add_argument("b")
    p.add_argument("--seeds", type=int, default=4,
                   help="layouts per build (default 4)")
    p.add_argument("--rounds", type=int, default=3,
                   help="runs of each layout, each with the heap shifted "
                        "differently (see run.ballast); the fastest counts")
    workloads.add_arguments(p)
    ns = p.parse_args()
    names = workloads.chosen(ns)
    seeds = range(1, ns.seeds + 1)

    for build in (ns.a, ns.b):
        check_build(build)
    sides = {build: layouts(build, seeds) for build in (ns.a, ns.b)}
    pythons = sides[ns.a] + sides[ns.b]

    print(f"B / A over {ns.seeds} layouts each; A = {ns.a}, B = {ns.b}")
    print(f"{'':10}{'B / A':>8}   {'A layouts':>13}   {'B layouts':>13}")
    ratios = []
    for name in names:
        n = calibrate(workloads.ALL[name])
        best = {}
        for r in range(ns.rounds):
            for py in (pythons if r % 2 == 0 else pythons[::-1]):
                t = run_child(py, ["--child-time", name, "--rounds", str(n),
                                   "--heap-shift", str(heap_shift(r))])
                best[py] = min(best.get(py, t), t)
        base = geomean([best[py] for py in sides[ns.a]])
        spread = {build: [best[py] / base for py in sides[build]]
                  for build in sides}
        ranges = [f"{min(s):.3f}..{max(s):.3f}" for s in spread.values()]
        ratios.append(geomean(spread[ns.b]))
        print(f"{name:10}{ratios[-1]:8.3f}   " + "   ".join(ranges))
        sys.stdout.flush()
    if len(ratios) > 1:
        print(f"{'geomean':10}{geomean(ratios):8.3f}")


if __name__ == "__main__":
    main()
