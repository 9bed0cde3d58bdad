"""The sampling profiler: where a program spends its time, at a few percent.

A thread of the sampler's own, in C, wakes at a fixed rate and records the
stack of each thread it watches, with what the thread was doing (running
bytecode, in C code, waiting for the GIL, idle).  It never takes the GIL
and the threads it samples run on.  profiling.sampling is the name CPython
3.15 gives its sampling profiler (PEP 799); this one runs inside the
interpreter, so it needs no permission to read another process.

    import profiling.sampling

    with profiling.sampling.Sampler(rate=1000, all_threads=True) as s:
        main()
    s.print_stats()
    s.dump_speedscope("main.speedscope.json")
    pstats.Stats(s).sort_stats("cumulative").print_callers()
"""

import marshal
import os
import sys
import threading
import time

import _sampling

from .. import _formats

__all__ = ["Sampler", "STATUSES", "FORMATS"]

# What a thread was doing at a sample.
STATUSES = _sampling.STATUSES
RUNNING, IN_C, WAITING_FOR_GIL, IDLE = STATUSES

# The file formats Sampler.dump() writes.
FORMATS = ("pstats", "collapsed", "flamegraph", "gecko", "speedscope",
           "cpuprofile")

DEFAULT_RATE = 1000
DEFAULT_MEMORY_RATE = 10
MAX_RATE = 100_000

# What flame graphs show under a stack of a thread not running bytecode.
_STATUS_FRAMES = {
    IN_C: ("<in C>", "~", 0),
    WAITING_FOR_GIL: ("<waiting for the GIL>", "~", 0),
    IDLE: ("<idle>", "~", 0),
}


class Sampler:
    """Sampler(rate=1000, *, interval=None, mode="wall", all_threads=False,
               thread=None, memory_rate=None)

    A sampling profiler.  rate is the samples per second (at most
    100,000), or interval the seconds between them.  mode "wall" samples
    the threads watched whatever they do; "cpu" only while they use a CPU.
    The threads watched: the one that calls start() by default, all of
    them with all_threads=True, or the one of ident `thread`.  memory_rate
    is the memory samples per second (0 for none; by default 10, or the
    rate if lower): the process's resident set, and on a build configured
    --with-memory-tracking the bytes sys.total_memory_used() counts.

    start() and stop() it, or use it as a context manager, or run(f, ...);
    once stopped, results() and the statistics and exports tell what it
    saw.  pstats.Stats(sampler) takes the samples as time.  Only one
    sampler runs at a time.
    """

    def __init__(self, rate=None, *, interval=None, mode="wall",
                 all_threads=False, thread=None, memory_rate=None):
        if rate is not None and interval is not None:
            raise TypeError("give rate or interval, not both")
        if interval is None:
            rate = DEFAULT_RATE if rate is None else _number("rate", rate)
            if not 0 < rate <= MAX_RATE:
                raise ValueError(f"rate must be above 0 and at most "
                                 f"{MAX_RATE:,} samples per second, "
                                 f"not {rate!r}")
            interval = 1.0 / rate
        else:
            interval = _number("interval", interval)
            if not 1.0 / MAX_RATE <= interval <= 3600:
                raise ValueError(f"interval must be between 10 microseconds "
                                 f"and an hour, not {interval!r}")
        if mode not in ("wall", "cpu"):
            raise ValueError(f"mode must be 'wall' or 'cpu', not {mode!r}")
        if thread is not None:
            if all_threads:
                raise ValueError("give all_threads or thread, not both")
            if not isinstance(thread, int) or isinstance(thread, bool):
                raise TypeError(f"thread must be a thread's ident (an int), "
                                f"not {type(thread).__name__}")
        if memory_rate is None:
            memory_rate = min(DEFAULT_MEMORY_RATE, 1.0 / interval)
        memory_rate = _number("memory_rate", memory_rate)
        if not 0 <= memory_rate <= 1.0 / interval:
            raise ValueError(f"memory_rate must be between 0 and the rate, "
                             f"not {memory_rate!r}")
        self.interval = interval
        self.rate = 1.0 / interval
        self.mode = mode
        self.all_threads = bool(all_threads)
        self.thread = thread
        self.memory_rate = memory_rate
        self._engine = None
        self._data = None
        self._stats = None

    def __repr__(self):
        state = "running" if self.running else "stopped"
        return (f"<{type(self).__qualname__} {self.rate:g} Hz {self.mode} "
                f"{state}>")

    @property
    def running(self):
        """Whether the sampler runs."""
        return self._engine is not None and self._engine.running

    def start(self):
        """Start sampling.  What an earlier run recorded is dropped."""
        if self.running:
            raise RuntimeError("the sampler is already running")
        watched = None if self.all_threads else (
            self.thread if self.thread is not None
            else threading.get_ident())
        engine = _sampling.Sampler(
            self.interval, mode=self.mode, thread=watched,
            memory_interval=(min(1.0 / self.memory_rate, 3600.0)
                             if self.memory_rate else 0.0))
        self._names = _thread_names()
        self._start_time = time.time()
        engine.start()
        self._engine = engine
        self._data = self._stats = None

    def stop(self):
        """Stop sampling, after a last sample of the threads watched."""
        if not self.running:
            raise RuntimeError("the sampler is not running")
        try:
            self._engine.stop()
        finally:
            self._names.update(_thread_names())

    def __enter__(self):
        self.start()
        return self

    def __exit__(self, *exc_info):
        self.stop()

    def run(self, function, /, *args, **kwargs):
        """Call function(*args, **kwargs) while sampling; return its result."""
        self.start()
        try:
            return function(*args, **kwargs)
        finally:
            self.stop()

    # What the engine recorded, read once it stopped.

    def _read(self):
        if self._data is None:
            if self._engine is None:
                raise RuntimeError("the sampler has not run")
            if self._engine.running:
                raise RuntimeError("the sampler is running: stop() it first")
            self._data = _Data(self._engine, self._names, self._start_time)
        return self._data

    def info(self):
        """How the run went: a dict of interval, rate (asked), duration
        (seconds), ticks (intervals from start to stop), taken (ticks the
        sampler woke for), missed (ticks that passed while it was late:
        weight of the next sample, not lost), achieved_rate (ticks taken
        per second), missed_share, samples (records, each standing for one
        tick or several), bytes (the store) and bytes_per_sample (per tick
        of each thread)."""
        data = self._read()
        info = dict(data.info)
        duration = info["duration"]
        ticks = sum(s[4] for s in data.samples)
        info["rate"] = self.rate
        info["achieved_rate"] = info["taken"] / duration if duration else 0.0
        info["missed_share"] = (info["missed"] / info["ticks"]
                                if info["ticks"] else 0.0)
        info["bytes_per_sample"] = info["bytes"] / ticks if ticks else 0.0
        return info

    def threads(self):
        """The threads sampled: a list of (ident, native_id, name)."""
        data = self._read()
        return [(ident, native_id, data.thread_name(i))
                for i, (ident, native_id, _) in enumerate(data.threads)]

    def results(self):
        """Everything recorded, in plain data (for a web page, say): a dict
        of

        - frames: a list of {name, file, first_line, line, column,
          end_line, end_column}, each a place in a function (lines from 1,
          columns from 0, None where unknown);
        - samples: a list of {time, thread, status, weight, frames,
          memory}: the seconds from the start to the sample's end, the
          index of its thread in threads, what the thread was doing (one
          of STATUSES), the ticks it stands for (a thread that does the
          same at consecutive ticks has one sample), the indexes of its
          frames outermost first, and the memory then (the last memory
          sample's, or None);
        - threads: a list of {ident, native_id, name}, one per thread (an
          ident may be used again by a thread that starts after another
          ends);
        - memory: a list of {time, rss, tracked, types} (bytes; tracked is
          None without memory tracking; types the ten tags of
          sys.type_memory_usage() holding the most bytes then, a dict,
          largest first, or None without memory tracking, where no
          thread ran Python code before the next memory sample, and where
          the last reading was too recent);
        - start_memory, max_memory, end_memory: of the memory samples (the
          tracked bytes where counted, else the resident set), or None;
        - interval, start_time (time.time() at start), duration, total
          (the ticks of all samples).
        """
        data = self._read()
        places = {}
        frames = []
        node_place = []
        for node in data.frames:
            key = node[1:]
            index = places.get(key)
            if index is None:
                index = places[key] = len(frames)
                (name, filename, first, line, end_line, col,
                 end_col) = key
                frames.append({
                    "name": name, "file": filename, "first_line": first,
                    "line": _known(line), "column": _known(col),
                    "end_line": _known(end_line),
                    "end_column": _known(end_col)})
            node_place.append(index)
        memory = data.memory_values()
        samples = []
        for tick, node, thread, status, weight in data.samples:
            samples.append({
                "time": tick * data.interval,
                "thread": thread,
                "status": STATUSES[status],
                "weight": weight,
                "frames": [node_place[n] for n in data.path(node)],
                "memory": memory.at(tick),
            })
        totals = memory.totals()
        return {
            "interval": data.interval,
            "start_time": data.start_time,
            "duration": data.info["duration"],
            "total": sum(s["weight"] for s in samples),
            "frames": frames,
            "samples": samples,
            "threads": [{"ident": ident, "native_id": native_id,
                         "name": data.thread_name(i)}
                        for i, (ident, native_id, _)
                        in enumerate(data.threads)],
            "memory": [{"time": tick * data.interval, "rss": _known(rss),
                        "tracked": _known(tracked), "types": types}
                       for tick, rss, tracked, types in data.memory],
            "start_memory": totals[0],
            "max_memory": totals[1],
            "end_memory": totals[2],
        }

    # Statistics, as pstats reads them.

    def create_stats(self):
        """Make self.stats, pstats' dict, from the samples: a function's
        time is the ticks it was sampled in times the interval (its own
        time where it was the innermost frame), and its "calls" are those
        ticks, there being no calls counted.  pstats.Stats(sampler) calls
        this."""
        if self._stats is None:
            self._stats = _stats(self._read())
        self.stats = self._stats

    def print_stats(self, sort="tottime", limit=None, *, file=None):
        """Print a table of the functions sampled: the ticks each was the
        innermost frame in (own) and on the stack at all (total), as
        shares of all ticks and as seconds.  sort is "tottime" (own
        time), "cumtime", "name" or "file"; limit, the most rows."""
        keys = {"tottime": lambda r: (-r[1][2], r[0]),
                "cumtime": lambda r: (-r[1][3], r[0]),
                "name": lambda r: (r[0][2], r[0]),
                "file": lambda r: r[0]}
        if sort not in keys:
            raise ValueError(f"sort must be one of {', '.join(keys)}, "
                             f"not {sort!r}")
        self.create_stats()
        data = self._read()
        rows = sorted(self.stats.items(), key=keys[sort])
        if limit is not None:
            rows = rows[:limit]
        ticks = sum(s[4] for s in data.samples)
        threads = len(data.threads)
        out = sys.stdout if file is None else file
        print(f"{ticks:,} samples of {threads} thread"
              f"{'s' if threads != 1 else ''} in "
              f"{data.info['duration']:.3f} s ({self.mode} time, "
              f"{self.rate:,.0f} Hz)\n", file=out)
        print(f"{'own':>9} {'own%':>6} {'owntime':>9} {'total':>9} "
              f"{'total%':>6} {'tottime':>9}  function (file:line)", file=out)
        for (filename, line, name), (own_ticks, _, own, total, _) in rows:
            own_ticks = round(own / self.interval)
            print(f"{own_ticks:>9} {_share(own_ticks, ticks):>6} "
                  f"{own:>9.3f} {total / self.interval:>9.0f} "
                  f"{_share(total / self.interval, ticks):>6} "
                  f"{total:>9.3f}  {name} "
                  f"({os.path.basename(filename)}:{line})", file=out)

    def dump_stats(self, file):
        """Write the statistics as a pstats file (marshal), which pstats,
        snakeviz, gprof2dot and the like read."""
        self.create_stats()
        with open(file, "wb") as f:
            marshal.dump(self.stats, f)

    # Exports for viewers.

    def stacks(self, *, statuses=True):
        """[(thread name, [(stack, ticks), ...]), ...] per thread, in the
        order sampled: a stack is a tuple of frames (name, filename,
        first line), outermost first; with statuses, a stack not running
        bytecode ends in a frame saying what it did instead ("<in C>",
        "<waiting for the GIL>", "<idle>")."""
        data = self._read()
        return [(data.thread_name(thread),
                 [(stack, weight) for _, stack, weight in samples])
                for thread, samples in data.timelines(statuses)]

    def dump_collapsed(self, file):
        """Write folded stacks, "frame;frame;frame ticks" a line, for
        flamegraph.pl, inferno and speedscope; with several threads each
        stack starts with its thread."""
        per_thread = self.stacks()
        with _open_text(file) as f:
            for name, stacks in per_thread:
                root = () if len(per_thread) == 1 else (
                    (f"thread {name}", "~", 0),)
                totals = {}
                for stack, weight in stacks:
                    totals[stack] = totals.get(stack, 0) + weight
                _formats.write_folded(f, ((root + stack, weight)
                                          for stack, weight in totals.items()))

    def dump_speedscope(self, file):
        """Write speedscope's JSON format: a "sampled" profile per thread,
        its samples in order, weighted in seconds."""
        interval = self.interval
        profiles = [(f"thread {name}",
                     [(stack, weight * interval) for stack, weight in stacks])
                    for name, stacks in self.stacks()]
        with _open_text(file) as f:
            _formats.write_speedscope(
                f, profiles, name="profiling.sampling", unit="seconds",
                exporter=f"Sightglass {sys.version.split()[0]} "
                         "profiling.sampling")

    def dump_cpuprofile(self, file, thread=None):
        """Write a Chrome .cpuprofile (DevTools' Performance panel, VS
        Code, speedscope) of one thread: the one of ident `thread`, or the
        one that started the sampler (else the first sampled)."""
        from ._export import write_cpuprofile
        data = self._read()
        with _open_text(file) as f:
            write_cpuprofile(f, data, data.thread_of(thread))

    def dump_gecko(self, file):
        """Write the Firefox Profiler's "gecko" format: a track per thread,
        and the memory samples as a counter."""
        from ._export import write_gecko
        with _open_text(file) as f:
            write_gecko(f, self._read())

    def dump_flamegraph(self, file):
        """Write a flame graph: one HTML page, needing no network, with a
        graph per thread, a search box, and zoom on click."""
        from ._flamegraph import write_flamegraph
        with _open_text(file) as f:
            write_flamegraph(f, self.stacks(), self.interval,
                             title="profiling.sampling")

    def dump(self, file, format="pstats"):
        """Write in one of FORMATS."""
        if format not in FORMATS:
            raise ValueError(f"format must be one of {', '.join(FORMATS)}, "
                             f"not {format!r}")
        if format == "pstats":
            self.dump_stats(file)
        else:
            getattr(self, f"dump_{format}")(file)


def _number(name, value):
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{name} must be a number, not "
                        f"{type(value).__name__}")
    return value


def _share(part, whole):
    return f"{100 * part / whole:.1f}" if whole else "-"


def _known(value):
    return None if value is None or value < 0 else value


def _thread_names():
    """The names of the threads threading knows of, by ident and native
    id (idents are reused): those running, and those that ran and are
    still referred to."""
    threads = list(threading._dangling) + threading.enumerate()
    return {(t.ident, t.native_id): t.name
            for t in threads if t.ident is not None}


def _open_text(file):
    return open(file, "w", encoding="utf-8")


class _Memory:
    """The memory samples, by tick."""

    def __init__(self, samples):
        import bisect
        self._bisect = bisect.bisect_right
        self._ticks = [tick for tick, *_ in samples]
        self._values = [tracked if tracked >= 0 else (rss if rss >= 0
                                                      else None)
                        for _, rss, tracked, _ in samples]

    def at(self, tick):
        i = self._bisect(self._ticks, tick)
        return self._values[i - 1] if i else None

    def totals(self):
        known = [v for v in self._values if v is not None]
        if not known:
            return None, None, None
        return known[0], max(known), known[-1]


class _Data:
    """What the engine recorded, with the derived views the exports
    share."""

    def __init__(self, engine, names, start_time):
        self.info = engine.info()
        self.interval = self.info["interval"]
        self.frames = engine.frames()
        self.samples = engine.samples()
        self.threads = engine.threads()
        self.memory = engine.memory()
        self.start_time = start_time
        self.started_by = None
        self._names = names
        self._paths = {}
        self._function_stacks = {}

    def memory_values(self):
        return _Memory(self.memory)

    def thread_name(self, index):
        ident, native_id, name = self.threads[index]
        return (self._names.get((ident, native_id)) or name
                or f"{native_id}")

    def thread_of(self, ident):
        # The latest of the threads that had the ident: the one that has
        # it now, if it runs.
        wanted = threading.main_thread().ident if ident is None else ident
        for i in reversed(range(len(self.threads))):
            if self.threads[i][0] == wanted:
                return i
        if ident is not None:
            raise ValueError(f"no thread of ident {ident} was sampled")
        if not self.threads:
            raise ValueError("no thread was sampled")
        return 0

    def path(self, node):
        """The nodes from the outermost frame to `node`."""
        paths = self._paths
        # Iterative: stacks may be deeper than the recursion limit.
        missing = []
        while node >= 0 and node not in paths:
            missing.append(node)
            node = self.frames[node][0]
        path = paths[node] if node >= 0 else ()
        for node in reversed(missing):
            path = paths[node] = path + (node,)
        return path

    def function(self, node):
        _, name, filename, first = self.frames[node][:4]
        return (name, filename, first)

    def timelines(self, statuses=True):
        """[(thread index, [(tick, stack, ticks), ...]), ...]: the samples
        of each thread sampled, in order, the main thread first, as in
        Sampler.stacks()."""
        per_thread = [[] for _ in self.threads]
        for tick, node, thread, status, weight in self.samples:
            stack = self.function_stack(node)
            if statuses and status != 0:
                stack += (_STATUS_FRAMES[STATUSES[status]],)
            per_thread[thread].append((tick, stack, weight))
        main = threading.main_thread().ident
        order = sorted(range(len(per_thread)),
                       key=lambda i: self.threads[i][0] != main)
        return [(thread, sorted(per_thread[thread], key=lambda s: s[0]))
                for thread in order if per_thread[thread]]

    def function_stack(self, node):
        stack = self._function_stacks.get(node)
        if stack is None:
            stack = tuple(self.function(n) for n in self.path(node))
            self._function_stacks[node] = stack
        return stack


def _stats(data):
    """pstats' dict: per function (file, line, name) the ticks it was on a
    stack (as both call counts), its own and its cumulative time, and the
    same per caller."""
    interval = data.interval
    stats = {}
    for tick, node, thread, status, weight in data.samples:
        stack = [(f[1], f[2], f[0]) for f in data.function_stack(node)]
        if not stack:
            continue
        seconds = weight * interval
        for func in stack:
            if func not in stats:
                stats[func] = [0, 0, 0.0, 0.0, {}]
        # A function, or a call from one function to another, counts once
        # in a sample however often it recurs there.
        for func in set(stack):
            entry = stats[func]
            entry[0] += weight
            entry[1] += weight
            entry[3] += seconds
        for caller, func in set(zip(stack, stack[1:])):
            callers = stats[func][4]
            nc, cc, tt, ct = callers.get(caller, (0, 0, 0.0, 0.0))
            callers[caller] = (nc + weight, cc + weight, tt, ct + seconds)
        leaf = stats[stack[-1]]
        leaf[2] += seconds
        if len(stack) > 1:
            nc, cc, tt, ct = leaf[4][stack[-2]]
            leaf[4][stack[-2]] = (nc, cc, tt + seconds, ct)
    return {func: tuple(entry) for func, entry in stats.items()}
