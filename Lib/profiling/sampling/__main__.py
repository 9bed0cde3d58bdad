"""python -m profiling.sampling run [options] (-m module | script) [args]"""

import argparse
import os
import re
import runpy
import sys
import threading

from . import FORMATS, MAX_RATE, Sampler

# Where a format goes when no --outfile is given (pstats is printed).
_EXTENSIONS = {"collapsed": "txt", "flamegraph": "html", "gecko": "json",
               "speedscope": "speedscope.json", "cpuprofile": "cpuprofile"}


def parse_rate(text):
    """Samples per second: "1000", "1000hz", "10khz", "1.5k", "0.1mhz"."""
    match = re.fullmatch(r"\s*([0-9]*\.?[0-9]+(?:e[0-9]+)?)\s*([km]?)(hz)?\s*",
                         text, re.IGNORECASE)
    if match is None:
        raise argparse.ArgumentTypeError(
            f"not a rate: {text!r} (samples per second, like 1000 or 10khz)")
    rate = float(match[1]) * {"": 1, "k": 1e3, "m": 1e6}[match[2].lower()]
    if not 0 < rate <= MAX_RATE:
        raise argparse.ArgumentTypeError(
            f"the rate must be above 0 and at most {MAX_RATE:,} Hz, "
            f"not {text!r}")
    return rate


def _seconds(text):
    try:
        value = float(text)
    except ValueError:
        value = -1
    if not value > 0:
        raise argparse.ArgumentTypeError(
            f"not a duration in seconds: {text!r}")
    return value


def _parser():
    parser = argparse.ArgumentParser(
        prog="python -m profiling.sampling",
        description="Sample the stacks of a running Python program and "
                    "say where its time goes.")
    commands = parser.add_subparsers(dest="command", required=True)
    run = commands.add_parser(
        "run", help="run a script or module under the sampler",
        description="Run a script (or, with -m, a module) under the "
                    "sampler; print a table of where the time went, or "
                    "write a file for a viewer.")
    run.add_argument("-r", "--rate", type=parse_rate, default=1000.0,
                     help="samples per second: 1000 (the default), 10khz, "
                          "up to 100khz")
    run.add_argument("-d", "--duration", type=_seconds,
                     help="stop sampling after this many seconds (the "
                          "program runs on); by default, when it ends")
    run.add_argument("-a", "--all-threads", action="store_true",
                     help="sample every thread, not only the main one")
    run.add_argument("--mode", choices=("wall", "cpu"), default="wall",
                     help="wall: all the time, blocked threads included "
                          "(the default); cpu: time on a CPU only")
    run.add_argument("--memory-rate", type=float, default=10.0,
                     metavar="RATE",
                     help="memory samples per second (default 10; 0 for "
                          "none)")
    formats = run.add_mutually_exclusive_group()
    formats.add_argument("--format", choices=FORMATS, default=None,
                         help="what to write (default pstats: a table on "
                              "stdout, or a pstats file with -o)")
    for name in ("pstats", "collapsed", "flamegraph", "gecko"):
        formats.add_argument(f"--{name}", dest="format", action="store_const",
                             const=name, help=f"the same as --format {name}")
    run.add_argument("-o", "--outfile",
                     help="the file to write (by default: the table on "
                          "stdout, other formats to FORMAT.PID.EXT)")
    run.add_argument("-s", "--sort", default="tottime",
                     choices=("tottime", "cumtime", "name", "file"),
                     help="the order of the table: own time (the "
                          "default), total time, name or file")
    run.add_argument("-l", "--limit", type=int, default=30,
                     help="rows of the table (default 30; 0 for all)")
    run.add_argument("-m", dest="module", action="store_true",
                     help="run a module, as python -m does")
    run.add_argument("target", help="the script, or the module with -m")
    run.add_argument("args", nargs=argparse.REMAINDER,
                     help="the program's arguments")
    return parser


def main(argv=None):
    parser = _parser()
    options = parser.parse_args(argv)
    try:
        sampler = Sampler(options.rate, mode=options.mode,
                          all_threads=options.all_threads,
                          memory_rate=options.memory_rate)
    except (TypeError, ValueError) as exc:
        parser.error(str(exc))
    format = options.format or "pstats"
    outfile = options.outfile
    if outfile is None and format != "pstats":
        outfile = f"{format}.{os.getpid()}.{_EXTENSIONS[format]}"
    # The program may change directory: the output's path is taken now,
    # and checked before the program runs.
    if outfile is not None:
        outfile = os.path.abspath(outfile)
        try:
            with open(outfile, "ab"):
                pass
        except OSError as exc:
            parser.error(f"cannot write {outfile}: {exc.strerror}")

    if options.module:
        def program():
            runpy.run_module(options.target, run_name="__main__",
                             alter_sys=True)
    else:
        path = options.target
        try:
            with open(path, "rb") as f:
                source = f.read()
        except OSError as exc:
            parser.error(f"cannot read {path}: {exc.strerror}")
        code = compile(source, path, "exec")
        sys.path.insert(0, os.path.dirname(os.path.abspath(path)))
        globs = {"__file__": path, "__name__": "__main__",
                 "__package__": None, "__cached__": None,
                 "__builtins__": __builtins__}

        def program():
            exec(code, globs)

    sys.argv[:] = [options.target] + options.args
    report = _Report(sampler, format, outfile, options)
    sampler.start()
    timer = None
    if options.duration is not None:
        timer = threading.Timer(options.duration, report.finish)
        timer.daemon = True
        timer.start()
    try:
        program()
    except SystemExit as exc:
        status = exc.code
    except BaseException:
        report.finish()
        raise
    else:
        status = None
    finally:
        if timer is not None:
            timer.cancel()
    report.finish()
    sys.exit(status)


class _Report:
    """Stops the sampler once, and writes what it saw."""

    def __init__(self, sampler, format, outfile, options):
        self.sampler = sampler
        self.format = format
        self.outfile = outfile
        self.options = options
        self.lock = threading.Lock()
        self.done = False

    def finish(self):
        with self.lock:
            if self.done:
                return
            self.done = True
            self.sampler.stop()
            self._write()

    def _write(self):
        sampler = self.sampler
        info = sampler.info()
        where = ""
        if self.outfile is None:
            try:
                sampler.print_stats(self.options.sort,
                                    self.options.limit or None)
                sys.stdout.flush()
            except BrokenPipeError:
                sys.stdout = None
        else:
            sampler.dump(self.outfile, self.format)
            where = f"; {self.format} written to {self.outfile}"
        threads = len(sampler.threads())
        print(f"profiling.sampling: {info['taken']:,} ticks in "
              f"{info['duration']:.2f} s, {info['achieved_rate']:,.0f} Hz "
              f"of {info['rate']:,.0f} asked, "
              f"{100 * info['missed_share']:.1f}% missed, "
              f"{threads} thread{'s' if threads != 1 else ''}{where}",
              file=sys.stderr)


if __name__ == "__main__":
    main()
