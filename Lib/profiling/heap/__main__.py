"""python -m profiling.heap run [options] (script.py | -m module) [args]

Runs a program and takes a heap snapshot when it ends (and at each
signal given with --signal), then prints the top types by retained size.
"""

import argparse
import os
import runpy
import signal
import sys

from . import snapshot


def main(argv=None):
    parser = argparse.ArgumentParser(
        prog="python -m profiling.heap",
        description="Heap snapshots of a Python program.")
    commands = parser.add_subparsers(dest="command", required=True)
    run = commands.add_parser(
        "run", help="run a program, snapshot its heap at exit")
    run.add_argument("-o", "--output", metavar="FILE",
                     help="write a Chrome DevTools .heapsnapshot")
    run.add_argument("--summary", metavar="FILE",
                     help="write the summary by type (.json or .csv)")
    run.add_argument("--top", type=int, default=20,
                     help="types to print (default: 20)")
    run.add_argument("--signal", metavar="NAME", action="append",
                     default=[],
                     help="also snapshot at this signal (e.g. SIGUSR1); "
                          "each writes FILE.N")
    run.add_argument("-m", dest="module", action="store_true",
                     help="run a module, as python -m does")
    run.add_argument("target", help="the script or module")
    run.add_argument("args", nargs=argparse.REMAINDER)
    ns = parser.parse_args(argv)

    taken = []

    def take(globals_):
        snap = snapshot([globals_], progress=True)
        out = sys.stderr
        snap.print_summary(ns.top, file=out)
        if ns.output:
            path = (ns.output if not taken
                    else f"{ns.output}.{len(taken)}")
            snap.write_heapsnapshot(path)
            print(f"heap snapshot written to {path}", file=out)
        if ns.summary:
            snap.write_summary(ns.summary, "csv" if ns.summary.endswith(
                ".csv") else "json")
        taken.append(snap)

    main_globals = {}
    for name in ns.signal:
        number = getattr(signal, name, None)
        if not isinstance(number, signal.Signals):
            parser.error(f"no signal named {name}")
        signal.signal(number, lambda *_: take(main_globals))
    sys.argv = [ns.target] + ns.args
    try:
        if ns.module:
            main_globals.update(runpy.run_module(
                ns.target, run_name="__main__", alter_sys=True))
        else:
            sys.path.insert(0, os.path.dirname(os.path.abspath(ns.target)))
            main_globals.update(runpy.run_path(ns.target,
                                               run_name="__main__"))
    finally:
        take(main_globals)


if __name__ == "__main__":
    main()
