"""A heap growing past its peak, timed in fresh processes, B against A.

The workloads of workloads.py run many times in one process, so each
call after the first stays under the peak the first one set.  A program
loading its data grows past it at every allocation instead.  This builds
a table of records once per process, in processes that alternate between
the builds, and prints the median time of each and its ratio to the
first build's.

    python3 bench/growth.py build/test-plain/python build/test-tracking/python
"""

import argparse
import os
import statistics
import subprocess

CODE = """\
import time
start = time.perf_counter()
rows = [(i, str(i), {{"id": i}}) for i in range({records})]
print(time.perf_counter() - start)
"""


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("builds", nargs="+", metavar="PYTHON")
    p.add_argument("--rounds", type=int, default=21)
    p.add_argument("--records", type=int, default=300_000)
    ns = p.parse_args()
    code = CODE.format(records=ns.records)
    env = {"PATH": os.environ["PATH"], "PYTHONHASHSEED": "0"}
    times = {py: [] for py in ns.builds}
    for _ in range(ns.rounds):
        for py in ns.builds:
            res = subprocess.run([py, "-S", "-c", code], env=env,
                                 capture_output=True, text=True, check=True)
            times[py].append(float(res.stdout))
    first = statistics.median(times[ns.builds[0]])
    for py in ns.builds:
        median = statistics.median(times[py])
        print(f"{median * 1000:8.1f} ms {median / first:7.3f}  {py}")


if __name__ == "__main__":
    main()
