"""Instrumentation modes: what a tool switches on, measured against nothing.

A mode is a pair of functions (start, stop) that the runner calls around a
timed workload.  Only the modes the running interpreter supports are
offered, so the same runner measures stock 3.11, 3.12+ and Sightglass.
"""

import sys


def _noop(*args):
    return None


def _tracer(frame, event, arg):
    return _tracer


def _setprofile():
    sys.setprofile(_noop)


def _unsetprofile():
    sys.setprofile(None)


def _settrace():
    sys.settrace(_tracer)


def _unsettrace():
    sys.settrace(None)


_profiler = None


def _cprofile():
    global _profiler
    import cProfile
    _profiler = cProfile.Profile()
    _profiler.enable()


def _uncprofile():
    _profiler.disable()


def _tracemalloc():
    import tracemalloc
    tracemalloc.start()


def _untracemalloc():
    import tracemalloc
    tracemalloc.stop()


MODES = {
    "setprofile": (_setprofile, _unsetprofile,
                   "sys.setprofile with a Python no-op"),
    "settrace": (_settrace, _unsettrace,
                 "sys.settrace line tracing, Python no-op"),
    "cprofile": (_cprofile, _uncprofile, "cProfile.Profile enabled"),
    "tracemalloc": (_tracemalloc, _untracemalloc, "tracemalloc.start()"),
}


try:
    import profiling.tracing as _tracing
except ImportError:
    _tracing = None

if _tracing is not None:
    # Sightglass: the profiler without its memory counts (on a tracking
    # build they are on by default), and one whose filter leaves the
    # workloads out.
    def _tracing_profile(**kwargs):
        def start():
            global _profiler
            _profiler = _tracing.Profile(**kwargs)
            _profiler.enable()
        return start, _uncprofile

    MODES["cprofile-nomem"] = _tracing_profile(memory=False) + (
        "profiling.tracing.Profile(memory=False)",)
    MODES["cprofile-filtered"] = _tracing_profile(
        include=["/nonexistent/path"]) + (
        "profiling.tracing.Profile whose include leaves the code out",)

if hasattr(sys, "monitoring"):
    _mon = sys.monitoring
    _TOOL = _mon.PROFILER_ID

    def _monitor(events, callback):
        def start():
            _mon.use_tool_id(_TOOL, "bench")
            for event in events:
                _mon.register_callback(_TOOL, event, callback)
            mask = 0
            for event in events:
                mask |= event
            _mon.set_events(_TOOL, mask)

        def stop():
            _mon.set_events(_TOOL, 0)
            for event in events:
                _mon.register_callback(_TOOL, event, None)
            _mon.free_tool_id(_TOOL)
        return start, stop

    def _disable(*args):
        return _mon.DISABLE

    _E = _mon.events
    MODES["mon-calls"] = _monitor((_E.PY_START, _E.PY_RETURN), _noop) + (
        "sys.monitoring PY_START+PY_RETURN, Python no-op",)

    MODES["mon-line"] = _monitor((_E.LINE,), _noop) + (
        "sys.monitoring LINE, Python no-op",)

    # DISABLE lasts until restart_events(), which is never called: the
    # runner's warm-up pass disables every line, the timed rounds measure
    # what is left.  (Each mode runs in a process of its own.)
    MODES["mon-line-disable"] = _monitor((_E.LINE,), _disable) + (
        "sys.monitoring LINE returning DISABLE (after the first pass)",)

    # How coverage.py's sysmon core records lines: PY_START for all code
    # sets LINE on each code object the first time it starts, and every
    # callback returns DISABLE once it has recorded its place.  Started
    # anew each round, as a test runner starts coverage per test.
    _covered = set()
    _started = set()

    def _coverage_start(code, offset):
        _started.add(code)
        _mon.set_local_events(_TOOL, code, _E.LINE)
        return _mon.DISABLE

    def _coverage_line(code, line):
        _covered.add((code, line))
        return _mon.DISABLE

    def _coverage():
        _mon.use_tool_id(_TOOL, "bench")
        _mon.register_callback(_TOOL, _E.PY_START, _coverage_start)
        _mon.register_callback(_TOOL, _E.LINE, _coverage_line)
        _mon.set_events(_TOOL, _E.PY_START)
        _mon.restart_events()

    def _uncoverage():
        # 3.12's free_tool_id() keeps local events and callbacks: undone
        # one by one, so that the rounds without the mode run clean there.
        for code in _started:
            _mon.set_local_events(_TOOL, code, 0)
        _mon.set_events(_TOOL, 0)
        _mon.register_callback(_TOOL, _E.PY_START, None)
        _mon.register_callback(_TOOL, _E.LINE, None)
        _mon.free_tool_id(_TOOL)
        _started.clear()
        _covered.clear()

    MODES["mon-coverage"] = (_coverage, _uncoverage,
                             "coverage.py's sysmon line mode")

if hasattr(sys, "monitoring") and hasattr(sys.monitoring, "insert_marker"):
    # Sightglass: a debugger's breakpoints, on lines that never run.
    def _breakpoint_home():
        return None

    _start_markers, _stop_markers = _monitor((_E.MARKER,), _noop)

    def _markers():
        _start_markers()
        _mon.insert_marker(_TOOL, _breakpoint_home.__code__, 2)

    def _unmarkers():
        _mon.remove_marker(_TOOL, _breakpoint_home.__code__, 2)
        _stop_markers()

    MODES["mon-markers"] = (_markers, _unmarkers,
                            "sys.monitoring MARKER set, markers never hit")
