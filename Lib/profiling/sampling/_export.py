"""The sampler's timeline formats: Chrome's .cpuprofile and the Firefox
Profiler's gecko profile."""

import json
import os
import sys

from .. import _formats
from . import STATUSES, _STATUS_FRAMES

# DevTools' names for time with no JavaScript frame.
_ROOT = ("(root)", "", 0)
_IDLE = ("(idle)", "", 0)


def write_cpuprofile(f, data, thread):
    """DevTools' Profiler.Profile of one thread (index `thread`): a node per
    path of calls, samples at their ticks' start, times in microseconds.
    A gap between samples (a thread not sampled in cpu mode) is "(idle)"."""
    us = data.interval * 1e6
    nodes = [_cpuprofile_node(1, _ROOT, {})]
    children = {}
    script_ids = {}

    def node_id(parent, frame):
        key = (parent, frame)
        found = children.get(key)
        if found is None:
            found = children[key] = len(nodes) + 1
            nodes.append(_cpuprofile_node(found, frame, script_ids))
            nodes[parent - 1]["children"].append(found)
        return found

    entries = []                       # (start tick, node id, line)
    samples = sorted((s for s in data.samples if s[2] == thread),
                     key=lambda s: s[0])
    for tick, node, _, status, weight in samples:
        leaf = 1
        for frame in data.function_stack(node):
            leaf = node_id(leaf, frame)
        line = data.frames[node][4] if node >= 0 else -1
        if status:
            leaf = node_id(leaf, _STATUS_FRAMES[STATUSES[status]])
            line = -1
        start = tick - weight
        if entries and entries[-1][3] < start:
            entries.append((entries[-1][3], node_id(1, _IDLE), -1, start))
        entries.append((start, leaf, line, tick))
    ticks = {}
    for _, leaf, line, _ in entries:
        node = nodes[leaf - 1]
        node["hitCount"] += 1
        if line > 0:
            ticks.setdefault(leaf, {}).setdefault(line, 0)
            ticks[leaf][line] += 1
    for leaf, lines in ticks.items():
        nodes[leaf - 1]["positionTicks"] = [
            {"line": line, "ticks": count} for line, count in lines.items()]
    start_us = round(data.start_time * 1e6)
    previous = 0
    deltas = []
    for start, _, _, _ in entries:
        deltas.append(round((start - previous) * us))
        previous = start
    end = entries[-1][3] if entries else 0
    json.dump({
        "nodes": nodes,
        "startTime": start_us,
        "endTime": start_us + round(end * us),
        "samples": [leaf for _, leaf, _, _ in entries],
        "timeDeltas": deltas,
    }, f)


def _cpuprofile_node(node_id, frame, script_ids):
    name, filename, first = frame
    if filename in ("", "~"):
        url, script, line = "", "0", -1
    else:
        url = filename
        script = script_ids.setdefault(filename, str(len(script_ids) + 1))
        line = first - 1
    return {"id": node_id,
            "callFrame": {"functionName": name, "scriptId": script,
                          "url": url, "lineNumber": line,
                          "columnNumber": 0 if line >= 0 else -1},
            "hitCount": 0, "children": []}


# The Firefox Profiler reads gecko profiles of this version and upgrades
# them; its later versions only add what this file does not use.
GECKO_VERSION = 31
_CATEGORIES = [
    {"name": "Other", "color": "grey", "subcategories": ["Other"]},
    {"name": "Python", "color": "yellow", "subcategories": ["Other"]},
    {"name": "Native", "color": "blue", "subcategories": ["Other"]},
    {"name": "Idle", "color": "transparent", "subcategories": ["Other"]},
]
_STATUS_CATEGORY = {"<in C>": 2, "<waiting for the GIL>": 3, "<idle>": 3}


def write_gecko(f, data):
    """A gecko profile: a thread per thread sampled, a sample per tick (the
    profiler counts samples, not weights), the memory samples as a counter
    of the process."""
    ms = data.interval * 1e3
    pid = os.getpid()
    threads = []
    for thread, timeline in data.timelines():
        native_id = data.threads[thread][1]
        string = _formats.Strings()
        frames, frame_index = [], {}
        table, stack_index = [], {}

        def frame(entry):
            i = frame_index.get(entry)
            if i is None:
                fname, filename, first = entry
                location = fname if filename == "~" else (
                    f"{fname} ({filename}:{first})")
                category = _STATUS_CATEGORY.get(fname, 1) \
                    if filename == "~" else 1
                i = frame_index[entry] = len(frames)
                frames.append([string(location), False, None, None,
                               first if filename != "~" else None, None,
                               category, 0])
            return i

        def stack(path):
            prefix = None
            for entry in path:
                key = (prefix, frame(entry))
                i = stack_index.get(key)
                if i is None:
                    i = stack_index[key] = len(table)
                    table.append([prefix, key[1]])
                prefix = i
            return prefix

        samples = []
        for end, path, weight in timeline:
            index = stack(path)
            for tick in range(end - weight + 1, end + 1):
                samples.append([index, round(tick * ms, 3), 0])
        threads.append({
            "name": data.thread_name(thread),
            "processType": "default",
            "processName": "python",
            "registerTime": 0,
            "unregisterTime": None,
            "tid": native_id,
            "pid": pid,
            "markers": {"schema": {"name": 0, "startTime": 1, "endTime": 2,
                                   "phase": 3, "category": 4, "data": 5},
                        "data": []},
            "samples": {"schema": {"stack": 0, "time": 1, "eventDelay": 2},
                        "data": samples},
            "stackTable": {"schema": {"prefix": 0, "frame": 1},
                           "data": table},
            "frameTable": {"schema": {"location": 0, "relevantForJS": 1,
                                      "innerWindowID": 2,
                                      "implementation": 3, "line": 4,
                                      "column": 5, "category": 6,
                                      "subcategory": 7},
                           "data": frames},
            "stringTable": string.table,
        })
    counters = []
    if data.memory:
        values = data.memory_values()._values
        previous = 0
        points = []
        for (tick, *_), value in zip(data.memory, values):
            if value is None:
                continue
            points.append([round(tick * ms, 3), value - previous, 1])
            previous = value
        if points:
            counters.append({
                "name": "Memory",
                "category": "Memory",
                "description": "The bytes in use: counted by the tracking "
                               "build, else the resident set",
                "samples": {"schema": {"time": 0, "count": 1, "number": 2},
                            "data": points},
            })
    json.dump({
        "meta": {
            "version": GECKO_VERSION,
            "startTime": data.start_time * 1e3,
            "shutdownTime": None,
            "interval": ms,
            "stackwalk": 0,
            "debug": 0,
            "gcpoison": 0,
            "asyncstack": 0,
            "processType": 0,
            "product": f"Python {sys.version.split()[0]} (Sightglass)",
            "presymbolicated": True,
            "categories": _CATEGORIES,
            "markerSchema": [],
        },
        "libs": [],
        "threads": threads,
        "counters": counters,
        "pausedRanges": [],
        "processes": [],
    }, f)

