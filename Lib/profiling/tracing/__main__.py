"""python -m profiling.tracing [options] (-m module | script) [args]"""

import argparse
import os
import runpy
import sys

from . import Profile

FORMATS = ("pstats", "folded", "speedscope", "callgrind")


def main(argv=None):
    import pstats
    parser = argparse.ArgumentParser(
        prog="python -m profiling.tracing",
        description="Run a script or module under the deterministic "
                    "profiler, and print or save what it took.")
    parser.add_argument("-o", "--outfile",
                        help="save the profile to this file (by default "
                             "the statistics are printed)")
    parser.add_argument("-s", "--sort", default=2,
                        choices=sorted(pstats.Stats.sort_arg_dict_default),
                        help="sort order of the printed statistics")
    parser.add_argument("--format", choices=FORMATS, default="pstats",
                        help="the format of --outfile (default: pstats)")
    parser.add_argument("-a", "--all-threads", action="store_true",
                        help="record every thread, not only the main one")
    parser.add_argument("--include", action="append", metavar="MODULE_OR_PATH",
                        help="record only this module or package, or the "
                             "code under this path (repeatable)")
    parser.add_argument("-m", dest="module", action="store_true",
                        help="run a module, as python -m does")
    parser.add_argument("target", help="the script, or the module with -m")
    parser.add_argument("args", nargs=argparse.REMAINDER,
                        help="the script's arguments")
    options = parser.parse_args(argv)
    if options.format != "pstats" and options.outfile is None:
        parser.error(f"--format {options.format} needs --outfile")
    # The program may change directory: the output's path is taken now.
    outfile = options.outfile and os.path.abspath(options.outfile)
    sys.argv[:] = [options.target] + options.args
    if options.module:
        code = "_run_module(_name, run_name='__main__', alter_sys=True)"
        globs = {"_run_module": runpy.run_module, "_name": options.target}
    else:
        sys.path.insert(0, os.path.dirname(os.path.abspath(options.target)))
        with open(options.target, "rb") as f:
            code = compile(f.read(), options.target, "exec")
        globs = {"__file__": options.target, "__name__": "__main__",
                 "__package__": None, "__cached__": None}
    profile = Profile(all_threads=options.all_threads,
                      include=options.include)
    try:
        profile.runctx(code, globs, None)
    except SystemExit:
        pass
    except BrokenPipeError as exc:
        # No "Exception ignored" at shutdown for a closed pipe.
        sys.stdout = None
        sys.exit(exc.errno)
    finally:
        profile.disable()
    if outfile is None:
        profile.print_stats(options.sort)
        return
    dump = {"pstats": profile.dump_stats, "folded": profile.dump_folded,
            "speedscope": profile.dump_speedscope,
            "callgrind": profile.dump_callgrind}[options.format]
    dump(outfile)
    print(f"profiling.tracing: {options.format} profile written to "
          f"{outfile}", file=sys.stderr)


if __name__ == "__main__":
    main()
