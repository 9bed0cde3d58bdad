"""File formats the profilers write, for the viewers that read them.

Each writer takes stacks (sequences of frames, outermost first) with a
weight: a frame is (name, filename, lineno).  Formats:

- folded stacks, one line per stack: "a;b;c weight" (flamegraph.pl,
  speedscope, Brendan Gregg's collapsed format);
- speedscope's JSON file format, one "sampled" profile per thread.
"""

import json

__all__ = ["frame_of", "write_folded", "write_speedscope", "Strings"]


class Strings:
    """A table of strings, each kept once; calling it gives the index of
    a string, added where new.  .table is the list."""

    def __init__(self):
        self.table = []
        self._index = {}

    def __call__(self, text):
        i = self._index.get(text)
        if i is None:
            i = self._index[text] = len(self.table)
            self.table.append(text)
        return i


def frame_of(code):
    """The frame of a code object, or of a profiler's name of a built-in
    function (a str)."""
    if isinstance(code, str):
        return (code, "~", 0)
    return (code.co_name, code.co_filename, code.co_firstlineno)


def _folded_name(frame):
    name, filename, lineno = frame
    label = name if filename == "~" else f"{name} ({filename}:{lineno})"
    # The format's own separators cannot be in a name.
    return label.replace(";", ":").replace("\n", " ")


def write_folded(file, stacks):
    """Write (stack, weight) pairs as folded stacks; weights are rounded to
    ints, and stacks that round to nothing are left out."""
    for stack, weight in stacks:
        weight = round(weight)
        if weight > 0 and stack:
            file.write(";".join(map(_folded_name, stack)))
            file.write(f" {weight}\n")


def write_speedscope(file, profiles, *, name, unit, exporter):
    """Write speedscope's JSON: `profiles` is a list of (name, stacks) with
    stacks a list of (stack, weight), one profile per thread."""
    frames = []
    index = {}

    def frame_index(frame):
        i = index.get(frame)
        if i is None:
            i = index[frame] = len(frames)
            fname, filename, lineno = frame
            entry = {"name": fname}
            if filename != "~":
                entry["file"] = filename
                entry["line"] = lineno
            frames.append(entry)
        return i

    out = []
    for profile_name, stacks in profiles:
        samples = []
        weights = []
        for stack, weight in stacks:
            if weight > 0 and stack:
                samples.append([frame_index(f) for f in stack])
                weights.append(weight)
        out.append({
            "type": "sampled",
            "name": profile_name,
            "unit": unit,
            "startValue": 0,
            "endValue": sum(weights),
            "samples": samples,
            "weights": weights,
        })
    json.dump({
        "$schema": "https://www.speedscope.app/file-format-schema.json",
        "shared": {"frames": frames},
        "profiles": out,
        "name": name,
        "activeProfileIndex": 0,
        "exporter": exporter,
    }, file)
