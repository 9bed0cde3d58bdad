"""The heap scanner's numbers: scan rate, analysis and export times, memory.

  build/obj/python bench/heap.py [--objects N] [--rounds N] [--devtools]

Builds a heap of about N objects (default one million) besides the
interpreter's own, then, the median of the rounds:

  scan        profiling.heap.snapshot(): objects per second
  scratch     the snapshot's own bytes per record (records, edges, table),
              after the scan, and at its peak: on a build with memory
              tracking, the most sys.total_memory_used() rose over what it
              was before (else what the arrays held at the scan's end,
              before they are cut to size); for the first snapshot, and
              for the next ones, which size their arrays from the one
              before
  dominators  dominators and retained sizes of every record
  summary     the summary by type
  export      writing the .heapsnapshot (and, with --devtools, DevTools'
              loader reading it)
  referents   the same walk in Python: breadth first from the same roots
              with gc.get_referents(), a set of ids as the seen table
  objgraph    objgraph.typestats() (counts by type over gc.get_objects(),
              no walk) and objgraph.find_backref_chain() to one object
              (Debian's python3-objgraph)

Numbers only; no test depends on them.
"""

import argparse
import gc
import os
import statistics
import sys
import tempfile
import time

import profiling.heap

HEAP = None


class Item:
    def __init__(self, i):
        self.name = f"item {i}"
        self.values = [i * 1000, i * 1000 + 1]


def build(objects):
    # An Item is 5 objects: itself (its dict folds into it), its name, its
    # list and two ints.
    return [Item(i) for i in range(objects // 5)]


def timed(function):
    start = time.perf_counter()
    result = function()
    return time.perf_counter() - start, result


TRACKS_MEMORY = hasattr(sys, "total_memory_used")


def memory_used():
    """The tracked bytes now, the peak reset to them; None untracked."""
    if not TRACKS_MEMORY:
        return None
    gc.collect()
    sys.reset_peak_memory_used()
    return sys.total_memory_used()


def python_walk(roots):
    """What a scanner in Python does: breadth first, get_referents."""
    seen = {id(r) for r in roots}
    queue = list(roots)
    get_referents = gc.get_referents
    for obj in queue:
        for child in get_referents(obj):
            if id(child) not in seen:
                seen.add(id(child))
                queue.append(child)
    return len(queue)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--objects", type=int, default=1_000_000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--devtools", action="store_true",
                        help="also time DevTools' loader on the export")
    ns = parser.parse_args()

    global HEAP
    heap = HEAP = build(ns.objects)
    target = heap[len(heap) // 2].values
    gc.collect()
    rows = {}

    def record(name, seconds, note=""):
        rows.setdefault(name, []).append((seconds, note))

    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "bench.heapsnapshot")
        snap = None
        for round_ in range(ns.rounds):
            # The snapshot before is kept, as for a diff: the scan sizes
            # its arrays from it.
            before = memory_used()
            seconds, snap = timed(lambda: profiling.heap.snapshot([heap]))
            info = snap.info()
            peak = (sys.peak_memory_used() - before if TRACKS_MEMORY
                    else info["scan_peak_bytes"])
            record("scan", seconds, info["records"])
            record("scratch", info["scanner_bytes"] / info["records"])
            record("scratch at peak" if round_ else
                   "scratch at peak, first", peak / info["records"])
            record("dominators", timed(lambda: snap._data.retained(0))[0])
            record("summary", timed(snap.summary)[0])
            record("export",
                   timed(lambda: snap.write_heapsnapshot(path))[0])
            seconds, count = timed(
                lambda: python_walk(list(sys.modules.values()) + [heap]))
            record("referents", seconds, count)
        if ns.devtools:
            sys.path.insert(0, os.path.join(os.path.dirname(
                os.path.abspath(__file__)), "..", "Lib"))
            from test.support import viewers
            seconds, shown = timed(
                lambda: viewers.devtools_heapsnapshot(path, timeout=600))
            record("devtools", seconds, shown["node_count"])
    try:
        sys.path.append("/usr/lib/python3/dist-packages")
        import objgraph
    except ImportError:
        objgraph = None
    if objgraph is not None:
        for _ in range(ns.rounds):
            record("objgraph typestats", timed(objgraph.typestats)[0])
        seconds, chain = timed(lambda: objgraph.find_backref_chain(
            target, objgraph.is_proper_module, max_depth=20))
        record("objgraph backref chain", seconds, len(chain))
        snap = profiling.heap.snapshot([heap])
        seconds, path_ = timed(lambda: snap.path(target))
        record("profiling.heap path", seconds, len(path_))

    records = rows["scan"][0][1]
    print(f"heap: {records} records ({ns.objects} built), "
          f"{ns.rounds} rounds, median")
    for name, values in rows.items():
        value = statistics.median(v for v, _ in values)
        note = values[0][1]
        if name.startswith("scratch"):
            print(f"  {name:24} {value:10.1f} bytes per record")
        elif name == "scan":
            print(f"  {name:24} {value * 1000:10.1f} ms "
                  f"({records / value / 1e6:.2f} M objects/s)")
        elif name == "referents":
            scan = statistics.median(v for v, _ in rows["scan"])
            print(f"  {name:24} {value * 1000:10.1f} ms "
                  f"({note / value / 1e6:.2f} M objects/s, "
                  f"{value / scan:.1f}x the scan)")
        else:
            print(f"  {name:24} {value * 1000:10.1f} ms"
                  + (f" ({note})" if note != "" else ""))


if __name__ == "__main__":
    main()
