"""Peak RSS of a tracking build against a plain one, and the anonymous
share of what the tracking build counted.

  python3 bench/memory.py PLAIN_PYTHON TRACKING_PYTHON

The workload keeps objects of core types and of a class alive at once;
memory tracking must not make it bigger (no per-block header), and should
leave little of it unclaimed.
"""

import json
import statistics
import subprocess
import sys

WORKLOAD = """if 1:
    import json, resource, sys
    class Node:
        def __init__(self, i):
            self.i = i
            self.tags = (i, str(i))
    data = [Node(i) for i in range(300_000)]
    table = {i: [i] for i in range(200_000)}
    names = {str(i) for i in range(200_000)}
    out = {"maxrss_kib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss}
    if hasattr(sys, "type_memory_usage"):
        usage = sys.type_memory_usage()
        out["total"] = sum(usage.values())
        out["anonymous"] = usage[""]
        out["raw"] = usage["<raw>"]
    print(json.dumps(out))
"""


def run(python):
    return json.loads(subprocess.run([python, "-c", WORKLOAD],
                                     stdout=subprocess.PIPE, text=True,
                                     check=True).stdout)


def main():
    plain, tracking = sys.argv[1:3]
    rounds = [(run(plain), run(tracking)) for _ in range(5)]
    ratio = statistics.median(t["maxrss_kib"] / p["maxrss_kib"]
                              for p, t in rounds)
    last = rounds[-1][1]
    print(f"peak RSS, tracking / plain: {ratio:.3f}")
    print(f"anonymous share: {100 * last['anonymous'] / last['total']:.3f}%"
          f"  (raw domain: {100 * last['raw'] / last['total']:.1f}%)")


if __name__ == "__main__":
    main()
