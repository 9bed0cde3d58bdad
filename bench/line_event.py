"""Instructions per LINE event with a no-op callback, counted by callgrind.

    python3 bench/line_event.py ./python ~/.pyenv/versions/3.12.1/bin/python3

A ratio of monitored to unmonitored time mixes what an event costs with
how fast the plain loop runs.  This counts the event alone: each
interpreter runs a three-line loop ITERATIONS times with a no-op LINE
callback set locally, and once without it; the difference, divided by the
number of LINE events, is what one event costs there, the callback's own
call included.
"""

import argparse
import re
import subprocess

ITERATIONS = 20000
LINES_PER_ITERATION = 3

PROGRAM = f"""
import sys

def loop(n):
    total = 0
    for i in range(n):
        total += i
        total ^= 1
    return total

if sys.argv[1] == "line":
    M = sys.monitoring
    M.use_tool_id(3, "bench")
    M.register_callback(3, M.events.LINE, lambda code, line: None)
    M.set_local_events(3, loop.__code__, M.events.LINE)
loop({ITERATIONS})
"""


def instructions(python, mode):
    out = subprocess.run(
        ["valgrind", "--tool=callgrind", "--callgrind-out-file=/dev/null",
         python, "-c", PROGRAM, mode],
        capture_output=True, text=True, check=True).stderr
    return int(re.search(r"Collected : (\d+)", out).group(1))


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("pythons", nargs="+")
    args = parser.parse_args()
    events = ITERATIONS * LINES_PER_ITERATION
    for python in args.pythons:
        plain = instructions(python, "plain")
        line = instructions(python, "line")
        print(f"{python}: {(line - plain) / events:.0f} instructions "
              f"per LINE event")


if __name__ == "__main__":
    main()
