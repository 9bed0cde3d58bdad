"""The sampling profiler's numbers: overhead, rates achieved, cost per sample.

  python3 bench/sampling.py [--python PY ...] [--rounds N] [--set programs]
                            [--sampler NAME ...]

For each interpreter given (default: this one), in a process of its own:

  overhead   each workload with and without the sampler, alternating in
             one process, the median of the per-round ratios: on one
             thread, and on four threads running it at once (the GIL
             contended); at 1 kHz and 10 kHz, all threads watched.
  rates      the rate achieved, as a share of the rate asked, and the
             share of ticks missed: at 1 and 10 kHz under a CPU-bound
             thread and under four contending for the GIL, and at 50 and
             100 kHz on one thread.
  sample     what one sample of a 32-frame stack costs the program (the
             time added, per tick taken) and the bytes a sample holds.

Sightglass's sampler is profiling.sampling.  On the others (and on
Sightglass too, for comparison) "pythread" is what a sampler written in
Python does: a thread that wakes every interval and reads
sys._current_frames().  "none" samples nothing: its ratios are those of
identical runs, the noise against which the others' are read.  With
--sampler, only the samplers named are measured (overhead and rates).
Numbers only; no test depends on them.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import workloads  # noqa: E402
from run import calibrate, geomean, interpreter_name, timed  # noqa: E402

THREADS = 4


class PythonThreadSampler:
    """A sampler in Python, as they are written: a thread that sleeps an
    interval, then reads every thread's frames."""

    def __init__(self, rate):
        self.interval = 1.0 / rate
        self.ticks = 0

    def _run(self):
        start = time.perf_counter()
        while not self._stop.is_set():
            time.sleep(self.interval)
            for frame in sys._current_frames().values():
                while frame is not None:
                    frame.f_code, frame.f_lineno
                    frame = frame.f_back
            self.ticks += 1
        self._duration = time.perf_counter() - start

    def start(self):
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def stop(self):
        self._stop.set()
        self._thread.join()

    def info(self):
        return {"achieved_rate": self.ticks / self._duration,
                "missed_share": None}


class NoSampler:
    """Nothing sampled: the same alternation with nothing switched on, so
    that its ratios show how far the others' stray by chance."""

    def start(self):
        pass

    def stop(self):
        pass


def sightglass(rate):
    import profiling.sampling
    return profiling.sampling.Sampler(rate, all_threads=True, memory_rate=0)


def samplers():
    made = {"none": NoSampler,
            "pythread-1k": lambda: PythonThreadSampler(1000)}
    try:
        import profiling.sampling  # noqa: F401
    except ImportError:
        return made
    made["sampling-1k"] = lambda: sightglass(1000)
    made["sampling-10k"] = lambda: sightglass(10_000)
    return made


def in_threads(func, n):
    """func n times in each of THREADS threads at once."""
    threads = [threading.Thread(target=timed, args=(func, n))
               for _ in range(THREADS)]
    start = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return time.perf_counter() - start


def overhead(mode, names, rounds):
    make = samplers()[mode]
    out = {}
    for name in names:
        func = workloads.ALL[name]
        n = calibrate(func)
        for label, run, count in (("1", timed, n),
                                  (f"{THREADS}", in_threads,
                                   max(1, n // THREADS))):
            ratios = []
            for r in range(rounds):
                plain_first = r % 2 == 0
                if plain_first:
                    plain = run(func, count)
                sampler = make()
                sampler.start()
                try:
                    sampled = run(func, count)
                finally:
                    sampler.stop()
                if not plain_first:
                    plain = run(func, count)
                ratios.append(sampled / plain)
            out[f"{name}/{label}"] = statistics.median(ratios)
    return out


def spin(seconds):
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        sum(i for i in range(100))


def rates(mode, rounds):
    make = samplers()[mode]
    rate = {"1k": 1000, "10k": 10_000}[mode.rpartition("-")[2]]
    out = {}
    for label, threads in (("cpu-bound", 1), ("gil-contended", THREADS)):
        achieved, missed = [], []
        for _ in range(rounds):
            sampler = make()
            sampler.start()
            workers = [threading.Thread(target=spin, args=(0.5,))
                       for _ in range(threads)]
            for t in workers:
                t.start()
            for t in workers:
                t.join()
            sampler.stop()
            info = sampler.info()
            achieved.append(info["achieved_rate"] / rate)
            missed.append(info["missed_share"])
        out[label] = {"achieved": statistics.median(achieved),
                      "missed": (statistics.median(missed)
                                 if None not in missed else None)}
    return out


def top_rates(rounds):
    import profiling.sampling
    out = {}
    for rate in (50_000, 100_000):
        achieved = []
        for _ in range(rounds):
            sampler = profiling.sampling.Sampler(rate, memory_rate=0)
            sampler.run(spin, 0.5)
            achieved.append(sampler.info()["achieved_rate"] / rate)
        out[f"{rate // 1000}k"] = statistics.median(achieved)
    return out


def at_depth(depth, then):
    return then() if depth <= 1 else at_depth(depth - 1, then)


def sample_cost(rounds):
    """Microseconds a 32-frame sample adds to the program, per tick."""
    import profiling.sampling
    func = workloads.ALL["loop"]
    n = calibrate(func) * 2
    costs, sizes = [], []
    for r in range(rounds):
        plain = at_depth(32, lambda: timed(func, n))
        sampler = profiling.sampling.Sampler(50_000, memory_rate=0)
        sampled = sampler.run(at_depth, 32, lambda: timed(func, n))
        info = sampler.info()
        costs.append((sampled - plain) / info["taken"] * 1e6)
        sizes.append(info["bytes_per_sample"])
    # The store's bytes per sample over five seconds of mixed programs.
    def programs(seconds=5.0):
        end = time.perf_counter() + seconds
        while time.perf_counter() < end:
            for name in workloads.SETS["programs"]:
                timed(workloads.ALL[name], 2)

    sampler = profiling.sampling.Sampler(10_000, all_threads=True,
                                         memory_rate=0)
    sampler.run(programs)
    return {"us_per_sample": statistics.median(costs),
            "bytes_per_sample_32": statistics.median(sizes),
            "bytes_per_sample_programs": sampler.info()["bytes_per_sample"]}


def child(ns, names):
    result = {"overhead": {}, "rates": {}}
    made = samplers()
    for mode in ns.sampler or made:
        if mode not in made:
            continue
        result["overhead"][mode] = overhead(mode, names, ns.rounds)
        if mode != "none":
            result["rates"][mode] = rates(mode, ns.rounds)
    if ns.sampler is None and "sampling-1k" in made:
        result["top_rates"] = top_rates(ns.rounds)
        result["sample"] = sample_cost(ns.rounds)
    print(json.dumps(result))


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--python", action="append",
                   help="interpreter to measure (repeatable)")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--sampler", action="append",
                   choices=["none", "pythread-1k", "sampling-1k",
                            "sampling-10k"],
                   help="measure only this sampler's overhead and rates "
                        "(repeatable); 'none' switches nothing on, for "
                        "the noise")
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    workloads.add_arguments(p)
    ns = p.parse_args()
    names = workloads.chosen(ns)
    if ns.child:
        child(ns, names)
        return
    for python in ns.python or [sys.executable]:
        args = [python, os.path.abspath(__file__), "--child",
                "--rounds", str(ns.rounds)]
        args += sum((["--sampler", m] for m in ns.sampler or ()), [])
        args += sum((["--workload", n] for n in names), [])
        proc = subprocess.run(args, stdout=subprocess.PIPE, text=True)
        if proc.returncode:
            raise SystemExit(f"{python} failed")
        result = json.loads(proc.stdout)
        print(f"== {interpreter_name(python)}")
        columns = [f"{n}/{t}" for t in ("1", f"{THREADS}") for n in names]
        for mode, ratios in result["overhead"].items():
            print(f"overhead {mode} (workload/threads):")
            for column in columns:
                print(f"  {column:<16} {ratios[column]:.3f}")
            for t in ("1", f"{THREADS}"):
                print(f"  geomean/{t:<8} "
                      f"{geomean(ratios[f'{n}/{t}'] for n in names):.3f}")
            print(f"  max              {max(ratios.values()):.3f}")
        for mode, loads in result["rates"].items():
            for load, r in loads.items():
                missed = ("" if r["missed"] is None
                          else f", missed {100 * r['missed']:.2f}%")
                print(f"rate {mode} {load}: achieved "
                      f"{100 * r['achieved']:.1f}% of asked{missed}")
        for rate, share in result.get("top_rates", {}).items():
            print(f"rate {rate} one thread: achieved {100 * share:.1f}%")
        if "sample" in result:
            s = result["sample"]
            print(f"32-frame sample: {s['us_per_sample']:.3f} us added "
                  f"per tick; {s['bytes_per_sample_32']:.2f} B/sample; "
                  f"5 s of programs at 10 kHz: "
                  f"{s['bytes_per_sample_programs']:.2f} B/sample")


if __name__ == "__main__":
    main()
