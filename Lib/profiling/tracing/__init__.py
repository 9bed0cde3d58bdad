"""The deterministic profiler: every call and return, timed.

profiling.tracing is cProfile (its name in CPython 3.15, PEP 799), with
more to it: its Profile records several threads, each on its own stack,
several profilers can run at once, and it writes folded stacks, speedscope
JSON and callgrind files besides pstats dumps.  On a build configured
--with-memory-tracking it also counts the bytes each function allocates
and retains.

    import profiling.tracing
    profiling.tracing.run("main()")

    with profiling.tracing.Profile(all_threads=True) as profile:
        main()
    profile.dump_speedscope("main.speedscope.json")
"""

import cProfile
import io
import marshal
import os
import sys

from .. import _formats

__all__ = ["run", "runctx", "Profile"]


def label(code):
    """What pstats calls a function: (filename, lineno, name)."""
    return cProfile.label(code)


class Profile(cProfile.Profile):
    """Profile(timer=None, timeunit=0.0, subcalls=True, builtins=True, *,
               all_threads=False, include=None, memory=None)

    cProfile.Profile, with:

    all_threads: record every thread, each on its own stack (by default,
        as in 3.11, the thread that calls enable()); threads() lists them,
        and stats, dumps and exports take a thread= argument.
    include: a sequence of module names and paths: only the code of those
        modules and packages, and of files under those paths, is recorded.
        Other code runs as if not profiled once it has run once.
    memory: on a build configured --with-memory-tracking (where it is the
        default), count the bytes each function allocates and retains.
    """

    def __init__(self, timer=None, timeunit=0.0, subcalls=True,
                 builtins=True, *, all_threads=False, include=None,
                 memory=None):
        if isinstance(include, str):
            raise TypeError("include must be a sequence of module names "
                            "and paths, not a str")
        prefixes = None if include is None else _prefixes(include)
        super().__init__(timer, timeunit, subcalls, builtins,
                         all_threads=all_threads, include=prefixes,
                         memory=memory)
        self._clock = (timer, timeunit)
        self.memory = memory if memory is not None else _tracks_memory()

    def calibrate(self, calls=100_000, rounds=5):
        """Measure what this profiler's recording adds to a call of a
        Python function and of a built-in, here, and take it out of the
        times reported from now on (set_overhead(None) puts it back).
        Call it while no profiler is enabled.
        Times never go below zero.  Returns the overheads in seconds, as
        set_overhead() takes them.

        The share that shows in the callee's own time is the own time of
        a function that does nothing; the rest, what the calls cost more
        than unprofiled, goes to the caller."""
        import time

        def nothing():
            pass

        def python_calls(n):
            for _ in range(n):
                nothing()

        def builtin_calls(n):
            empty = ()
            for _ in range(n):
                len(empty)

        def seconds(loop):
            start = time.perf_counter()
            loop(calls)
            return time.perf_counter() - start

        overhead = []
        len_name = "<built-in method builtins.len>"
        for loop, callee in ((python_calls, nothing.__code__),
                             (builtin_calls, len_name)):
            plain = min(seconds(loop) for _ in range(rounds))
            profiled = callee_time = float("inf")
            for _ in range(rounds):
                probe = Profile(*self._clock, memory=False)
                with probe:
                    spent = seconds(loop)
                profiled = min(profiled, spent)
                callee_time = min(callee_time, sum(
                    e.inlinetime for e in probe.getstats()
                    if e.code == callee))
            per_call = max(0.0, (profiled - plain) / calls)
            callee_share = min(per_call, callee_time / calls)
            overhead.append((callee_share, per_call - callee_share))
        overhead = tuple(overhead)
        self.set_overhead(overhead)
        return overhead

    def snapshot_stats(self, thread=None):
        """Make self.stats (pstats' dict) from what was recorded, in every
        thread or in the one of ident `thread`; and self.memory_stats, a
        dict of (allocated, retained, inline allocated, inline retained)
        bytes per function, where memory is counted."""
        self.stats, self.memory_stats = _stats(self.getstats(thread),
                                               self.memory)

    def create_stats(self, thread=None):
        self.disable()
        self.snapshot_stats(thread)

    def dump_stats(self, file, thread=None):
        """Write a pstats file: readable by every version of pstats, the
        memory counts after the statistics, where only Sightglass's pstats
        looks."""
        self.create_stats(thread)
        with open(file, "wb") as f:
            marshal.dump(self.stats, f)
            if self.memory_stats is not None:
                marshal.dump({"sightglass.memory": self.memory_stats}, f)

    def stacks(self, thread=None, *, weight="inlinetime"):
        """(thread ident, [(stack, weight), ...]) per thread recorded: a
        stack is a tuple of frames (name, filename, lineno), outermost
        first, for each path of calls; its weight is the time spent there
        outside callees (in seconds), or with weight="inlineallocated"
        the bytes allocated there."""
        field = _NODE_FIELDS.index(weight)
        if field >= 5 and not self.memory:
            raise ValueError(f"{weight} needs memory counted")
        result = []
        for ident, nodes in self.calltree(thread):
            paths = []
            stacks = []
            for node in nodes:
                parent = node[0]
                path = (paths[parent] if parent >= 0 else ()) + (
                    _formats.frame_of(node[1]),)
                paths.append(path)
                stacks.append((path, node[field]))
            result.append((ident, stacks))
        return result

    def dump_folded(self, file, thread=None):
        """Write folded stacks, the time outside callees in nanoseconds:
        for flamegraph.pl, speedscope and other flame-graph viewers.  With
        several threads, each stack starts with the thread."""
        per_thread = self.stacks(thread)
        with open(file, "w", encoding="utf-8") as f:
            for ident, stacks in per_thread:
                root = ((f"thread {ident}", "~", 0),)
                if len(per_thread) == 1:
                    root = ()
                _formats.write_folded(
                    f, ((root + stack, seconds * 1e9)
                        for stack, seconds in stacks))

    def dump_speedscope(self, file, thread=None):
        """Write speedscope's JSON file format: a profile per thread, each
        path of calls weighted by the time spent there outside callees."""
        profiles = [(f"thread {ident}", stacks)
                    for ident, stacks in self.stacks(thread)]
        with open(file, "w", encoding="utf-8") as f:
            _formats.write_speedscope(
                f, profiles, name="profiling.tracing", unit="seconds",
                exporter=f"Sightglass {sys.version.split()[0]} "
                         "profiling.tracing")

    def dump_callgrind(self, file, thread=None):
        """Write callgrind's format, for KCachegrind and QCachegrind: the
        time of each function, its calls and their inclusive time, in
        nanoseconds; with memory counted, the bytes allocated too."""
        entries = self.getstats(thread)
        with open(file, "w", encoding="utf-8") as f:
            _write_callgrind(f, entries, self.memory)


# The fields of a node of Profile.calltree().
_NODE_FIELDS = ("parent", "code", "calls", "totaltime", "inlinetime",
                "allocated", "inlineallocated", "retained", "inlineretained")


def _tracks_memory():
    import sysconfig
    return bool(sysconfig.get_config_var("Py_TRACK_MEMORY"))


def _prefixes(include):
    """Path prefixes for module names and paths: a package's directory, a
    module's file, a directory given, each made absolute."""
    import importlib.util
    prefixes = []
    for item in include:
        if not isinstance(item, str):
            raise TypeError(f"include must be a sequence of str, not of "
                            f"{type(item).__name__}")
        if os.sep in item or (os.altsep and os.altsep in item) \
                or os.path.exists(item):
            path = os.path.abspath(item)
            prefixes.append(path + os.sep if os.path.isdir(path) else path)
            continue
        spec = importlib.util.find_spec(item)
        if spec is None:
            raise ValueError(f"include: no module named {item!r}")
        if spec.submodule_search_locations:
            prefixes.extend(os.path.join(location, "")
                            for location in spec.submodule_search_locations)
        elif spec.origin and spec.has_location:
            prefixes.append(spec.origin)
        else:
            raise ValueError(f"include: module {item!r} has no source file "
                             f"(built in or frozen)")
    return prefixes


def _stats(entries, memory):
    """pstats' dict from getstats() entries: per function (primitive calls,
    calls, inline time, total time, callers), callers per caller the
    same four; and the memory counts per function, or None."""
    stats = {}
    memory_stats = {} if memory else None
    for entry in entries:
        func = label(entry.code)
        stats[func] = [entry.callcount - entry.reccallcount,
                       entry.callcount, entry.inlinetime, entry.totaltime,
                       {}]
        if memory:
            memory_stats[func] = (entry.allocated, entry.retained,
                                  entry.inlineallocated,
                                  entry.inlineretained)
    for entry in entries:
        caller = label(entry.code)
        for sub in entry.calls or ():
            callee = stats.get(label(sub.code))
            if callee is None:
                continue
            totals = (sub.callcount - sub.reccallcount, sub.callcount,
                      sub.inlinetime, sub.totaltime)
            previous = callee[4].get(caller)
            if previous is not None:
                totals = tuple(a + b for a, b in zip(previous, totals))
            callee[4][caller] = totals
    return {func: tuple(value) for func, value in stats.items()}, \
        memory_stats


def _write_callgrind(f, entries, memory):
    names = {}

    def name_of(kind, value):
        # Each name once in full, then by number (the format's compression).
        key = (kind, value)
        if key in names:
            return f"({names[key]})"
        names[key] = len(names) + 1
        return f"({names[key]}) {value}"

    def nanoseconds(seconds):
        return max(0, round(seconds * 1e9))

    events = "Time_ns Allocated_bytes" if memory else "Time_ns"
    f.write(f"# callgrind format\nversion: 1\n"
            f"creator: Sightglass profiling.tracing\n"
            f"positions: line\nevents: {events}\n\n")
    for entry in entries:
        name, filename, lineno = _formats.frame_of(entry.code)
        cost = f"{nanoseconds(entry.inlinetime)}"
        if memory:
            cost += f" {max(0, entry.inlineallocated)}"
        f.write(f"fl={name_of('fl', filename)}\n"
                f"fn={name_of('fn', f'{name} ({filename}:{lineno})')}\n"
                f"{lineno} {cost}\n")
        for sub in entry.calls or ():
            cname, cfile, cline = _formats.frame_of(sub.code)
            ccost = f"{nanoseconds(sub.totaltime)}"
            if memory:
                ccost += f" {max(0, sub.allocated)}"
            f.write(f"cfl={name_of('fl', cfile)}\n"
                    f"cfn={name_of('fn', f'{cname} ({cfile}:{cline})')}\n"
                    f"calls={sub.callcount} {cline}\n"
                    f"{lineno} {ccost}\n")
        f.write("\n")


def runctx(statement, globals, locals, filename=None, sort=-1):
    """Profile exec(statement, globals, locals); print the statistics
    sorted by `sort`, or save them to `filename`."""
    profile = Profile()
    try:
        profile.runctx(statement, globals, locals)
    except SystemExit:
        pass
    finally:
        if filename is not None:
            profile.dump_stats(filename)
        else:
            profile.print_stats(sort)
    return profile


def run(statement, filename=None, sort=-1):
    """Profile statement in the namespace of __main__; print the statistics
    sorted by `sort`, or save them to `filename`."""
    import __main__
    return runctx(statement, __main__.__dict__, __main__.__dict__,
                  filename, sort)
