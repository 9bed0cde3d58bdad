"""Instructions executed per workload, build B against build A.

Timing two builds across processes varies by about 3% on these machines,
too coarse for a bar of 1.01.  Callgrind counts instructions exactly, so
this runs each workload a fixed number of times under it, in each build,
and prints B / A.  Start-up is subtracted: a run with no workload is
counted too.

A count is still that of one heap layout: where a workload's blocks fall
decides how many pools it sets up and how often an arena is given back
and mapped again (see README.md).  In a tracking build, exc counts 0.2%
more with a few hundred strings allocated before it.  Such a ratio says
little alone; a set's geomean says more.

    python3 bench/instructions.py build/stock/python ./python
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


def instructions(python, name, repeat):
    code = (f"{IMPORT}; f = workloads.ALL[{name!r}]\n"
            f"for _ in range({repeat}): f()")
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
    p.add_argument("b")
    workloads.add_arguments(p)
    ns = p.parse_args()
    print(f"instructions, B / A; A = {ns.a}, B = {ns.b}")
    for py in (ns.a, ns.b):
        # Compiled here, not in a counted run: a run that writes the
        # bytecode of workloads.py or of what it imports counts the
        # compiler too.
        subprocess.run([py, *FLAGS, "-c", IMPORT], check=True, env=ENV)
    base = {py: instructions(py, "fib", 0) for py in (ns.a, ns.b)}
    ratios = []
    for name in workloads.chosen(ns):
        counts = {py: instructions(py, name, REPEAT) - base[py]
                  for py in (ns.a, ns.b)}
        ratios.append(counts[ns.b] / counts[ns.a])
        print(f"{name:10s} {ratios[-1]:8.4f}")
        sys.stdout.flush()
    if len(ratios) > 1:
        print(f"{'geomean':10s} {geomean(ratios):8.4f}")


if __name__ == "__main__":
    main()
