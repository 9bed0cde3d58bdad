"""Memory that sys.monitoring keeps per code object, over the whole stdlib.

    python3 bench/monitoring_memory.py [--python PY ...] [--verbose]

Each (interpreter, scenario) runs in a fresh child process, since monitoring
data, once made, lives as long as its code object.  The child imports every
stdlib module that imports cleanly, gathers every code object reachable
(functions found by the gc, their nested co_consts, the frames running),
and only then starts tracemalloc, so that nothing but what the scenario
allocates is traced.  Code units are len(co_code) // 2 on every version.

Instrumentation is lazy everywhere: code is brought up to date when it
next runs (RESUME); only executing frames are done at once.  To instrument
every code object alike on every interpreter without running it, each is
entered once with a LINE callback that raises at its first line: RESUME
has instrumented it by then and no statement has run.  Where that LINE
never comes (3.13 gives none when the body starts on the `def` line), the
code runs with empty globals, no builtins, None arguments, empty cells.

Columns: bytes still alive in tracemalloc (bytes asked for, before the
allocator rounds them) per code unit and in total; "set only": the same
after set_events/set_local_events, before any code is entered; "stopped":
share of code objects stopped at their first LINE (or running anyway);
"memtrack": what sys.type_memory_usage() charged to the code type
meanwhile (Sightglass tracking builds; block sizes), a cross-check.
"""
import argparse
import gc
import json
import os
import subprocess
import sys
import tracemalloc
import types
import warnings

SKIP = {'test', 'tests', 'idle_test', 'idlelib', 'tkinter', 'turtle',
        'turtledemo', 'antigravity', 'this', '__main__', '__hello__',
        '__phello__', 'lib2to3',  # lib2to3 writes grammar pickles
        'site-packages', 'dist-packages', '__pycache__'}
BARE = {'__builtins__': {}}
SCENARIOS = {'local': 'LINE set locally', 'global': 'LINE set globally',
             'branch': 'LINE+BRANCH locally', 'two': '2 tools, LINE locally'}


def stdlib_modules():
    """Names of the stdlib's .py modules and packages, minus SKIP."""
    root = os.path.dirname(os.__file__)
    names = []
    for top, dirs, files in os.walk(root):
        pkg = os.path.relpath(top, root).replace(os.sep, '.').strip('.')
        dirs[:] = [d for d in dirs if d not in SKIP and d.isidentifier()
                   and os.path.exists(os.path.join(top, d, '__init__.py'))]
        for stem in (f[:-3] for f in files if f.endswith('.py')):
            if stem == '__init__' and pkg:
                names.append(pkg)
            elif stem.isidentifier() and stem not in SKIP | {'__init__'}:
                names.append(f'{pkg}.{stem}'.strip('.'))
    return sorted(names)


def stack_codes(frame):
    codes = []
    while frame is not None:
        codes.append(frame.f_code)
        frame = frame.f_back
    return codes


def gather_code():
    """Every code object reachable from a function or a running frame."""
    found, todo = {}, [f.__code__ for f in gc.get_objects()
                       if isinstance(f, types.FunctionType)]
    todo += stack_codes(sys._getframe())
    while todo:
        co = todo.pop()
        if id(co) not in found:
            found[id(co)] = co
            todo += [c for c in co.co_consts if isinstance(c, types.CodeType)]
    return list(found.values())


class Stop(Exception):
    pass


def call_plan(codes):
    """How to enter each code object: (code, function or None, args, kwargs).

    The code of the frames running here is left out: it is instrumented
    because it runs, and entering it would stop the driver itself."""
    running = set(map(id, stack_codes(sys._getframe(1))))
    plan = []
    for co in codes:
        if id(co) in running:
            continue
        cells = tuple(types.CellType() for _ in co.co_freevars) or None
        if not co.co_flags & 0x02:  # CO_NEWLOCALS off: a module or class body
            plan.append((co, None, cells, None))
            continue
        fn = types.FunctionType(co, BARE, co.co_name, None, cells)
        # '.0', a comprehension's iterator, is iterated with no check of
        # its type: 3.13 crashes on None (and runs FOR_ITER before LINE).
        args = tuple(iter(()) if name == '.0' else None
                     for name in co.co_varnames[:co.co_argcount])
        kwonly = co.co_varnames[co.co_argcount:][:co.co_kwonlyargcount]
        plan.append((co, fn, args, dict.fromkeys(kwonly)))
    return plan


def enter(co, fn, args, kwargs):
    if fn is None:
        return exec(co, BARE, {}, closure=args)
    result = fn(*args, **kwargs)
    if co.co_flags & 0x200:  # CO_ASYNC_GENERATOR
        result.asend(None).send(None)
    elif co.co_flags & 0x80:  # CO_COROUTINE
        result.send(None)
    elif co.co_flags & 0x20:  # CO_GENERATOR
        next(result)


def child(scenario):
    warnings.simplefilter('ignore')
    failed = 0
    for name in json.load(sys.stdin):
        try:
            __import__(name)
        except BaseException:  # ImportError, SystemExit, platform errors...
            failed += 1
    import _tracemalloc
    mon, ev = sys.monitoring, sys.monitoring.events
    branch = getattr(ev, 'BRANCH_LEFT', 0) | getattr(ev, 'BRANCH_RIGHT', 0)
    branch = branch or ev.BRANCH
    target = stopped = ran = 0

    def on_line(code, line):
        if code is target:
            raise Stop
    tools = (0, 1) if scenario == 'two' else (0,)
    for tool in tools:  # registered before tracemalloc starts
        mon.use_tool_id(tool, 'bench')
        mon.register_callback(tool, ev.LINE, on_line)
        for event in {branch & -branch, branch & (branch - 1)} - {0}:
            mon.register_callback(tool, event, lambda *a: None)
    gc.collect()
    codes = gather_code()
    units = sum(len(co.co_code) // 2 for co in codes)  # caches co_code: now
    adaptive = sum(len(getattr(co, '_co_code_adaptive', co.co_code)) // 2
                   for co in codes)
    plan = call_plan(codes)
    local = {'local': ev.LINE, 'two': ev.LINE, 'branch': ev.LINE | branch}
    usage = getattr(sys, 'type_memory_usage', None)  # memory-tracking builds
    gc.collect()
    tracemalloc.start(1)
    code0 = usage().get('code', 0) if usage else 0
    # get_traced_memory is C: it leaves no Python objects behind to count.
    base = _tracemalloc.get_traced_memory()[0]
    if scenario == 'global':
        mon.set_events(0, ev.LINE)
    else:
        for co in codes:
            for tool in tools:
                mon.set_local_events(tool, co, local[scenario])
    after_set = _tracemalloc.get_traced_memory()[0] - base
    for co, fn, args, kwargs in plan:
        target = co
        try:
            enter(co, fn, args, kwargs)
        except Stop:
            stopped += 1
        except BaseException:  # 3.13 skips some first LINEs: see above
            ran += 1
        else:
            ran += 1
    target = None
    gc.collect()
    total = _tracemalloc.get_traced_memory()[0] - base
    code1 = usage().get('code', 0) if usage else 0
    # Blocks alive (a sanity check: about 2 per code object with LINE).
    blocks = len(tracemalloc.take_snapshot().filter_traces(
        [tracemalloc.Filter(False, tracemalloc.__file__)]).traces)
    print(json.dumps(dict(
        codes=len(codes), units=units, adaptive=adaptive, failed=failed,
        blocks=blocks, stopped=stopped + len(codes) - len(plan),
        ran=ran, after_set=after_set, total=total,
        memtrack=code1 - code0 if usage else None,
        version=sys.version.split()[0] + ' sightglass' * ('sightglass'
                                                         in sys.version))))


def run(python, mode, modules=()):
    """The JSON a child prints.  -B: write no .pyc into the stdlib."""
    out = subprocess.run([python, '-I', '-B', os.path.abspath(__file__),
                          '--child', mode], input=json.dumps(modules),
                         capture_output=True, text=True, check=True).stdout
    return json.loads(out.splitlines()[-1])


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('--python', action='append',
                        help='interpreter to measure (repeatable)')
    parser.add_argument('--child', choices=[*SCENARIOS, 'list'])
    parser.add_argument('--verbose', action='store_true')
    opts = parser.parse_args()
    if opts.child == 'list':
        return print(json.dumps(stdlib_modules()))
    if opts.child:
        return child(opts.child)
    pythons = opts.python or [sys.executable]
    # The modules every interpreter has, so that the sets are comparable.
    modules = sorted(set.intersection(*(set(run(py, 'list'))
                                        for py in pythons)))
    print(f'{len(modules)} stdlib modules common to all; bytes per code unit'
          ' (units = len(co_code) // 2); total in KiB')
    print(f'{"interpreter":<22} {"scenario":<22} {"codes":>6} {"units":>8}'
          f' {"B/unit":>7} {"KiB":>7} {"set only":>8} {"stopped":>7}'
          f' {"memtrack":>8}')
    for py in pythons:
        for scenario, title in SCENARIOS.items():
            r = run(py, scenario, modules)
            u, mt = r['units'], r['memtrack']
            print(f'{r["version"]:<22} {title:<22} {r["codes"]:>6} {u:>8}'
                  f' {r["total"] / u:>7.2f} {r["total"] / 1024:>7.0f}'
                  f' {r["after_set"] / u:>8.2f}'
                  f' {r["stopped"] / r["codes"]:>7.1%}'
                  f' {"-" if mt is None else round(mt / 1024):>8}')
            if r['adaptive'] != u:
                print(f'    adaptive/instrumented length: {r["adaptive"]}')
            if opts.verbose:
                print('   ', r)


if __name__ == '__main__':
    main()
