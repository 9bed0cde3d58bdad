"""Line coverage on sys.monitoring.

Records which lines of Python code run.  Each line costs one LINE event the
first time it runs in a code object; the callback then returns DISABLE, and
the line runs at full speed from then on.

    cov = linecov.LineCoverage()
    with cov:
        run_the_program()
    cov.lines()   # {filename: {line numbers that ran}}

Command line:

    python -m linecov [-o FILE] script.py [args...]
    python -m linecov [-o FILE] -m module [args...]

prints, per file, how many lines ran; -o writes the lines themselves as
JSON.
"""

import sys

__all__ = ["LineCoverage", "main"]

_monitoring = sys.monitoring


class LineCoverage:
    """Collect the lines that run while started.

    The tool takes `tool_id` (sys.monitoring.COVERAGE_ID by default) while
    it is started.  Lines that ran before a restart are kept; lines that
    ran once are not reported again until restart_events() is called by
    someone, which this tool does when it starts.
    """

    def __init__(self, tool_id=_monitoring.COVERAGE_ID):
        self.tool_id = tool_id
        self._lines = {}      # filename -> set of line numbers
        self._started = False

    def _line(self, code, line):
        try:
            self._lines[code.co_filename].add(line)
        except KeyError:
            self._lines[code.co_filename] = {line}
        return _monitoring.DISABLE

    def start(self):
        if self._started:
            raise RuntimeError("coverage is already started")
        _monitoring.use_tool_id(self.tool_id, "linecov")
        try:
            _monitoring.register_callback(
                self.tool_id, _monitoring.events.LINE, self._line)
            # Lines disabled by an earlier run are wanted again.
            _monitoring.restart_events()
            _monitoring.set_events(self.tool_id, _monitoring.events.LINE)
        except BaseException:
            _monitoring.free_tool_id(self.tool_id)
            raise
        self._started = True

    def stop(self):
        if not self._started:
            raise RuntimeError("coverage is not started")
        _monitoring.set_events(self.tool_id, 0)
        _monitoring.free_tool_id(self.tool_id)
        self._started = False

    def __enter__(self):
        self.start()
        return self

    def __exit__(self, *exc_info):
        self.stop()

    def lines(self):
        """Return {filename: set of line numbers that ran}."""
        return {name: set(lines) for name, lines in self._lines.items()}


def _run(argv):
    import runpy
    if argv[0] == "-m":
        if len(argv) < 2:
            raise SystemExit("linecov: -m needs a module name")
        sys.argv = argv[1:]
        runpy.run_module(argv[1], run_name="__main__", alter_sys=True)
    else:
        sys.argv = argv
        runpy.run_path(argv[0], run_name="__main__")


def main(args=None):
    import argparse
    import json
    parser = argparse.ArgumentParser(
        prog="python -m linecov",
        description="Run a Python program and report the lines that ran.")
    parser.add_argument("-o", "--output", metavar="FILE",
                        help="write {filename: [lines]} as JSON to FILE")
    parser.add_argument("program", nargs=argparse.REMAINDER,
                        help="script.py [args...] or -m module [args...]")
    options = parser.parse_args(args)
    if not options.program:
        parser.error("no program to run")
    saved_argv = sys.argv[:]
    cov = LineCoverage()
    status = None
    try:
        with cov:
            _run(options.program)
    except SystemExit as exc:
        status = exc.code
    finally:
        sys.argv = saved_argv
    lines = cov.lines()
    if options.output:
        with open(options.output, "w", encoding="utf-8") as f:
            json.dump({name: sorted(found) for name, found in lines.items()},
                      f, indent=1, sort_keys=True)
    else:
        for name in sorted(lines):
            print(f"{len(lines[name]):6d}  {name}")
    if status not in (None, 0):
        sys.exit(status)


if __name__ == "__main__":
    main()
