"""What a reading of sys.type_memory_usage() costs, by heap size and by
what changed since the reading before.

  python3 bench/readings.py [TRACKING_PYTHON]

For heaps of 1 and 2 million objects (tuples of an int and a str), the
median time of a reading after each of:

  quiet       nothing (another reading just before);
  temporary   100 ms of work on objects made and dropped (bench's alloc
              workload);
  replaced    1,000 (or 2,000 on the larger heap) of the tuples replaced,
              spread evenly over the heap;
  scattered   40,000 of them replaced at random.

Numbers only; no test depends on them.
"""

import json
import subprocess
import sys

WORKLOAD = """if 1:
    import json, random, statistics, sys, time
    sys.path.insert(0, sys.argv[1])
    import workloads

    def timed_reading():
        start = time.perf_counter()
        sys.type_memory_usage()
        return (time.perf_counter() - start) * 1e3

    def temporary():
        deadline = time.perf_counter() + 0.1
        while time.perf_counter() < deadline:
            workloads.alloc()

    out = {}
    rng = random.Random(1)
    for n in (1_000_000, 2_000_000):
        heap = [(i, str(i)) for i in range(n)]
        step = 1000 * n // 1_000_000

        def replaced():
            for i in range(rng.randrange(step), n, step):
                heap[i] = (i, str(i))

        def scattered():
            for _ in range(40_000):
                i = rng.randrange(n)
                heap[i] = (i, str(i))

        cases = {"quiet": lambda: None, "temporary": temporary,
                 "replaced": replaced, "scattered": scattered}
        for name, change in cases.items():
            times = []
            for _ in range(7):
                sys.type_memory_usage()
                change()
                times.append(timed_reading())
            out[f"{n // 1_000_000}M {name}"] = statistics.median(times)
        del heap
    print(json.dumps(out))
"""


def main():
    python = sys.argv[1] if len(sys.argv) > 1 else sys.executable
    bench = __file__.rpartition("/")[0] or "."
    out = json.loads(subprocess.run([python, "-c", WORKLOAD, bench],
                                    stdout=subprocess.PIPE, text=True,
                                    check=True).stdout)
    for case, ms in out.items():
        print(f"{case:14} {ms:7.3f} ms")


if __name__ == "__main__":
    main()
