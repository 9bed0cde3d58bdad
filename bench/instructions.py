"""Instructions executed per workload, build B against build A.

Timing two builds across processes varies by about 3% on these machines,
too coarse for a bar of 1.01.  Callgrind counts instructions exactly, so
this runs each workload a fixed number of times under it, in each build,
and prints B / A.  Start-up is subtracted: a run with no workload is
counted too.  With --mode, it counts one build with a mode of modes.py
(a tool switched on around the workload) against the same build without.

A count is still that of one heap layout: where a workload's blocks fall
decides how many pools it sets up and how often an arena is given back
and mapped again (see README.md).  In a tracking build, exc counts 0.2%
more with a few hundred strings allocated before it.  Such a ratio says
little alone; a set's geomean says more.

    python3 bench/instructions.py build/stock/python ./python
    python3 bench/instructions.py --mode cprofile ./python
"""

import argparse
import os
import re
import subprocess
import sys
import tempfile

import workloads
from run import geomean

HERE = os.path.dirname(os.path.abspath(__file__))

# Calls of each workload: enough that start-up is a small part.
REPEAT = 20

IMPORT = f"import sys; sys.path.insert(0, {HERE!r}); import workloads"

# String hashes are randomized per process, and the dicts' probing with
# them moves a workload's count by up to 0.2% from run to run: the seed is
# fixed.  -I would ignore it, so the runs get an environment of their own,
# and -P and -s for the rest of what -I does.
FLAGS = ["-P", "-s", "-S"]
ENV = {"PATH": os.environ["PATH"], "PYTHONHASHSEED": "0"}


def instructions(python, name, repeat, mode=None):
    code = f"{IMPORT}; f = workloads.ALL[{name!r}]\n"
    if mode is not None:
        code += f"import modes; start, stop, _ = modes.MODES[{mode!r}]\n"
        code += f"start()\nfor _ in range({repeat}): f()\nstop()"
    else:
        code += f"for _ in range({repeat}): f()"
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "callgrind.out")
        res = subprocess.run(
            ["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}",
             python, *FLAGS, "-c", code],
            capture_output=True, text=True, check=True, env=ENV)
    match = re.search(r"Collected : (\d+)", res.stderr)
    return int(match.group(1))


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("a")
    p.add_argument("b", nargs="?")
    p.add_argument("--mode", help="count A with this mode against A")
    workloads.add_arguments(p)
    ns = p.parse_args()
    if (ns.b is None) == (ns.mode is None):
        p.error("give two builds, or one build and --mode")
    # Each side of the ratio: a build, and the mode it runs or None.
    if ns.mode is not None:
        a, b = (ns.a, None), (ns.a, ns.mode)
        print(f"instructions, {ns.mode} / none; {ns.a}")
    else:
        a, b = (ns.a, None), (ns.b, None)
        print(f"instructions, B / A; A = {ns.a}, B = {ns.b}")
    for py in {ns.a, ns.b} - {None}:
        # Compiled here, not in a counted run: a run that writes the
        # bytecode of workloads.py or of what it imports counts the
        # compiler too.
        check = (f"\nimport modes\n"
                 f"if {ns.mode!r} not in (None, *modes.MODES): sys.exit(2)")
        res = subprocess.run([py, *FLAGS, "-c", IMPORT + check], env=ENV)
        if res.returncode == 2:
            p.error(f"{py} has no mode {ns.mode!r}")
        res.check_returncode()
    base = {side: instructions(side[0], "fib", 0, side[1])
            for side in (a, b)}
    ratios = []
    for name in workloads.chosen(ns):
        counts = {side: instructions(side[0], name, REPEAT, side[1])
                  - base[side] for side in (a, b)}
        ratios.append(counts[b] / counts[a])
        print(f"{name:10s} {ratios[-1]:8.4f}")
        sys.stdout.flush()
    if len(ratios) > 1:
        print(f"{'geomean':10s} {geomean(ratios):8.4f}")


if __name__ == "__main__":
    main()
