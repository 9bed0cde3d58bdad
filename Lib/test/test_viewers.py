"""The viewer harness (test.support.viewers) on hand-written files.

Each viewer gets files it must accept, written here from the formats'
published descriptions, with the names it must then show, and broken files
it must reject.  Without the viewers installed (Tools/sightglass/install-deps)
those tests skip and say what is missing; UnavailableTests checks that.
"""

import json
import os
import re
import tempfile
import unittest
from unittest import mock

from test.support import os_helper, viewers

# speedscope recognises its own format by exactly this "$schema" value.
SPEEDSCOPE_SCHEMA = "https://www.speedscope.app/file-format-schema.json"

# speedscope's own format: frames shared by an evented profile (open and
# close events) and a sampled one (stacks, outermost frame first).
SPEEDSCOPE = {
    "$schema": SPEEDSCOPE_SCHEMA,
    "name": "two threads",
    "exporter": "test_viewers",
    "activeProfileIndex": 0,
    "shared": {"frames": [
        {"name": "main", "file": "app.py", "line": 1},
        {"name": "parse", "file": "app.py", "line": 10},
        {"name": "emit", "file": "out.py", "line": 3},
    ]},
    "profiles": [
        {"type": "evented", "name": "MainThread", "unit": "milliseconds",
         "startValue": 0, "endValue": 10, "events": [
             {"type": "O", "frame": 0, "at": 0},
             {"type": "O", "frame": 1, "at": 2},
             {"type": "C", "frame": 1, "at": 7},
             {"type": "C", "frame": 0, "at": 10},
         ]},
        {"type": "sampled", "name": "Thread-1", "unit": "nanoseconds",
         "startValue": 0, "endValue": 30,
         "samples": [[0, 2], [0, 2], [0]], "weights": [10, 10, 10]},
    ],
}

FOLDED = "main;parse;tokenize 5\nmain;parse 3\nmain;emit 2\n"

# A Chrome DevTools Protocol Profiler.Profile: a call tree of nodes, then
# which node was on top at each sample and the microseconds between them.
CPUPROFILE = {
    "nodes": [
        {"id": 1, "callFrame": {"functionName": "(root)", "scriptId": "0",
                                "url": "", "lineNumber": -1,
                                "columnNumber": -1},
         "hitCount": 0, "children": [2]},
        {"id": 2, "callFrame": {"functionName": "main", "scriptId": "1",
                                "url": "app.py", "lineNumber": 0,
                                "columnNumber": 0},
         "hitCount": 1, "children": [3, 4]},
        {"id": 3, "callFrame": {"functionName": "parse", "scriptId": "1",
                                "url": "app.py", "lineNumber": 9,
                                "columnNumber": 0},
         "hitCount": 2, "children": []},
        {"id": 4, "callFrame": {"functionName": "emit", "scriptId": "2",
                                "url": "out.py", "lineNumber": 2,
                                "columnNumber": 0},
         "hitCount": 1, "children": []},
    ],
    "startTime": 1_000_000,
    "endTime": 1_005_000,
    "samples": [2, 3, 3, 4, 2],
    "timeDeltas": [0, 1000, 1000, 1000, 1000],
}

# A V8 heap snapshot: "nodes" and "edges" are flat arrays of the fields the
# header names; an edge's to_node is the offset of its node in "nodes", and
# names index "strings". Each node: type, name, id, self_size, edge_count,
# trace_node_id, detachedness; its edge_count edges follow those of the
# nodes before it.
NODE_TYPES = ["hidden", "array", "string", "object", "code", "closure",
              "regexp", "number", "native", "synthetic",
              "concatenated string", "sliced string", "symbol", "bigint",
              "object shape"]
EDGE_TYPES = ["context", "element", "property", "internal", "hidden",
              "shortcut", "weak"]
HEAPSNAPSHOT = {
    "snapshot": {
        "meta": {
            "node_fields": ["type", "name", "id", "self_size", "edge_count",
                            "trace_node_id", "detachedness"],
            "node_types": [NODE_TYPES, "string", "number", "number",
                           "number", "number", "number"],
            "edge_fields": ["type", "name_or_index", "to_node"],
            "edge_types": [EDGE_TYPES, "string_or_number", "node"],
            "trace_function_info_fields": ["function_id", "name",
                                           "script_name", "script_id",
                                           "line", "column"],
            "trace_node_fields": ["id", "function_info_index", "count",
                                  "size", "children"],
            "sample_fields": ["timestamp_us", "last_assigned_id"],
            "location_fields": ["object_index", "script_id", "line",
                                "column"],
        },
        "node_count": 5,
        "edge_count": 5,
        "trace_function_count": 0,
    },
    "nodes": [
        9, 0, 1, 0, 2, 0, 0,     # 0: the (synthetic) root
        3, 1, 3, 32, 2, 0, 0,    # 7: a Point
        3, 1, 5, 32, 1, 0, 0,    # 14: another Point
        7, 2, 7, 16, 0, 0, 0,    # 21: a heap number
        2, 3, 9, 24, 0, 0, 0,    # 28: the string "origin"
    ],
    "edges": [
        1, 1, 7,                 # root [1] -> Point
        1, 2, 14,                # root [2] -> Point
        2, 4, 21,                # Point .x -> number
        2, 5, 28,                # Point .label -> "origin"
        2, 5, 28,                # Point .label -> "origin"
    ],
    "trace_function_infos": [],
    "trace_tree": [],
    "samples": [],
    "locations": [],
    "strings": ["", "Point", "heap number", "origin", "x", "label"],
}

FLAME_PAGE = """<!DOCTYPE html>
<html><head><meta charset="utf-8"><title>flame graph</title></head>
<body><div id="graph"></div>
<script>
  const stacks = {"main;parse": 5, "main;emit": 2};
  const graph = document.getElementById("graph");
  for (const [stack, count] of Object.entries(stacks)) {
    const bar = document.createElement("div");
    bar.className = "frame";
    bar.textContent = stack.split(";").pop() + " " + count;
    graph.appendChild(bar);
  }
</script></body></html>
"""


def copy(data):
    return json.loads(json.dumps(data))


class ViewerTestCase(unittest.TestCase):

    def setUp(self):
        self.tmp = tempfile.mkdtemp()
        self.addCleanup(os_helper.rmtree, self.tmp)

    def write(self, name, content):
        path = os.path.join(self.tmp, name)
        if not isinstance(content, str):
            content = json.dumps(content)
        with open(path, "w", encoding="utf-8") as f:
            f.write(content)
        return path

    def assertRejected(self, check, path, reason, **kwargs):
        with self.assertRaises(viewers.ViewerRejected) as caught:
            check(path, **kwargs)
        self.assertIsInstance(caught.exception, AssertionError)
        self.assertIn(reason, str(caught.exception))
        return caught.exception.result


def frames(profile):
    return {frame["name"]: frame for frame in profile["frames"]}


class SpeedscopeTests(ViewerTestCase):

    def test_speedscope_json(self):
        result = viewers.speedscope_import(
            self.write("profile.speedscope.json", SPEEDSCOPE))
        self.assertEqual(result["name"], "two threads")
        main_thread, thread_1 = result["profiles"]
        self.assertEqual(main_thread["name"], "MainThread")
        self.assertEqual(thread_1["name"], "Thread-1")
        shown = frames(main_thread)
        self.assertEqual(set(shown), {"main", "parse"})
        self.assertEqual(shown["main"]["file"], "app.py")
        self.assertEqual(shown["main"]["total"], "10.00ms (100%)")
        self.assertEqual(shown["main"]["self"], "5.00ms (50%)")
        self.assertEqual(shown["parse"]["self"], "5.00ms (50%)")
        shown = frames(thread_1)
        self.assertEqual(set(shown), {"main", "emit"})
        self.assertEqual(shown["emit"]["self"], "20.00ns (67%)")

    def test_folded_stacks(self):
        result = viewers.speedscope_import(self.write("stacks.txt", FOLDED))
        profile, = result["profiles"]
        shown = frames(profile)
        self.assertEqual(set(shown), {"main", "parse", "tokenize", "emit"})
        self.assertEqual(shown["main"]["total"], "10 (100%)")
        self.assertEqual(shown["parse"]["total"], "8 (80%)")
        self.assertEqual(shown["tokenize"]["self"], "5 (50%)")

    def test_cpuprofile(self):
        result = viewers.speedscope_import(
            self.write("profile.cpuprofile", CPUPROFILE))
        profile, = result["profiles"]
        shown = frames(profile)
        self.assertEqual(set(shown), {"main", "parse", "emit"})
        self.assertEqual(shown["parse"]["file"], "app.py")
        self.assertEqual(shown["parse"]["self"], "2.00ms (50%)")

    def test_every_frame_of_a_long_table(self):
        # More rows than the window holds: speedscope draws only those in
        # view, so they must all be scrolled through.
        lines = [f"main;f{i:03};g{i:03} {i + 1}" for i in range(100)]
        result = viewers.speedscope_import(
            self.write("long.folded", "\n".join(lines) + "\n"))
        profile, = result["profiles"]
        expected = ({"main"} | {f"f{i:03}" for i in range(100)}
                    | {f"g{i:03}" for i in range(100)})
        self.assertEqual(len(profile["frames"]), len(expected))
        self.assertEqual(set(frames(profile)), expected)

    def test_unknown_frame_rejected(self):
        bad = copy(SPEEDSCOPE)
        bad["profiles"][1]["samples"][0] = [0, 9]
        self.assertRejected(viewers.speedscope_import,
                            self.write("bad.speedscope.json", bad),
                            "speedscope could not import the file")

    def test_unbalanced_events_rejected(self):
        bad = copy(SPEEDSCOPE)
        events = bad["profiles"][0]["events"]
        events[2]["frame"], events[3]["frame"] = 0, 1
        self.assertRejected(viewers.speedscope_import,
                            self.write("bad.speedscope.json", bad),
                            'Tried to leave frame "main"')

    def test_unrecognised_file_rejected(self):
        result = self.assertRejected(
            viewers.speedscope_import,
            self.write("notes.txt", "not a profile at all\n"),
            "Unrecognized format")
        self.assertFalse(result["imported"])


class DevToolsHeapSnapshotTests(ViewerTestCase):

    def test_accepted(self):
        result = viewers.devtools_heapsnapshot(
            self.write("heap.heapsnapshot", HEAPSNAPSHOT))
        self.assertEqual(result["node_count"], 5)
        self.assertEqual(result["edge_count"], 5)
        classes = {c["name"]: c for c in result["classes"]}
        self.assertEqual(classes["Point"]["count"], 2)
        self.assertEqual(classes["Point"]["self_size"], 64)
        self.assertEqual(classes["(string)"]["count"], 1)
        self.assertEqual(result["statistics"]["total"], 104)
        self.assertEqual(result["statistics"]["v8heap"]["strings"], 24)

    def test_edge_between_nodes_rejected(self):
        bad = copy(HEAPSNAPSHOT)
        bad["edges"][2] = 8     # not the start of a node
        result = self.assertRejected(
            viewers.devtools_heapsnapshot, self.write("bad.heapsnapshot", bad),
            "DevTools rejected the snapshot: Error: Invalid toNodeIndex 8")
        self.assertIn("edge 0: to_node 8 is not a node's offset",
                      result["format_errors"])

    def test_truncated_file_rejected(self):
        text = json.dumps(HEAPSNAPSHOT)
        self.assertRejected(
            viewers.devtools_heapsnapshot,
            self.write("cut.heapsnapshot", text[:len(text) // 2]),
            "DevTools rejected the snapshot")

    def test_wrong_node_count_rejected(self):
        # DevTools reads a node past the end as zeroes, and only says that
        # this node is unreachable.
        bad = copy(HEAPSNAPSHOT)
        bad["snapshot"]["node_count"] = 6
        result = self.assertRejected(
            viewers.devtools_heapsnapshot, self.write("bad.heapsnapshot", bad),
            "nodes has 35 numbers, node_count 6 x 7 fields needs 42")
        self.assertTrue(any("unreachable from the root" in warning
                            for warning in result["warnings"]))

    def test_unreachable_node_rejected(self):
        # Consistent counts, but nothing retains the string any more.
        bad = copy(HEAPSNAPSHOT)
        bad["nodes"][7 + 4] = 1        # the first Point keeps only .x
        bad["nodes"][14 + 4] = 0       # the second Point nothing
        bad["edges"] = bad["edges"][:9]
        bad["snapshot"]["edge_count"] = 3
        result = self.assertRejected(
            viewers.devtools_heapsnapshot, self.write("bad.heapsnapshot", bad),
            "DevTools logged: Heap snapshot: 1 nodes are unreachable")
        self.assertEqual(result["format_errors"], [])


class DevToolsCpuProfileTests(ViewerTestCase):

    def test_accepted(self):
        result = viewers.devtools_cpuprofile(
            self.write("profile.cpuprofile", CPUPROFILE))
        self.assertEqual(set(result["function_names"]),
                         {"(root)", "main", "parse", "emit"})
        thread, = result["threads"]
        calls = [(c["name"], c["start_us"], c["duration_us"])
                 for c in thread["calls"]]
        self.assertEqual(calls, [("main", 0, 5000), ("parse", 1000, 2000),
                                 ("emit", 3000, 1000)])
        self.assertEqual(thread["calls"][1]["url"], "app.py")

    def test_not_json_rejected(self):
        self.assertRejected(
            viewers.devtools_cpuprofile,
            self.write("bad.cpuprofile", json.dumps(CPUPROFILE)[:-1]),
            "DevTools cannot read the file: not JSON")

    def test_not_a_profile_rejected(self):
        self.assertRejected(
            viewers.devtools_cpuprofile,
            self.write("bad.cpuprofile", {"samples": [], "timeDeltas": []}),
            'DevTools would not take the file for a CPU profile: no "nodes"')

    def test_unknown_sample_rejected(self):
        bad = copy(CPUPROFILE)
        bad["samples"][1] = 99
        self.assertRejected(viewers.devtools_cpuprofile,
                            self.write("bad.cpuprofile", bad),
                            "format: a sample names unknown node 99")

    def test_no_samples_nor_hit_counts_rejected(self):
        bad = copy(CPUPROFILE)
        del bad["samples"], bad["timeDeltas"]
        for node in bad["nodes"]:
            del node["hitCount"]
        self.assertRejected(
            viewers.devtools_cpuprofile, self.write("bad.cpuprofile", bad),
            "CPUProfileDataModel rejected the profile: Error: Error: Neither"
            " hitCount nor samples are present in profile.")


class HtmlPageTests(ViewerTestCase):

    def test_page_text(self):
        result = viewers.html_page(self.write("flame.html", FLAME_PAGE),
                                   wait_for=".frame")
        self.assertEqual(result["title"], "flame graph")
        self.assertEqual(result["text"].split("\n"), ["parse 5", "emit 2"])

    def test_script_error_rejected(self):
        page = FLAME_PAGE.replace('getElementById("graph")',
                                  'getElementById("graph").missing.x')
        result = self.assertRejected(
            viewers.html_page, self.write("flame.html", page),
            "page error: TypeError: Cannot read properties of undefined")
        self.assertEqual(result["text"], "")

    def test_outside_request_rejected(self):
        page = FLAME_PAGE.replace(
            "<title>", '<link rel="stylesheet" href="../style.css"><title>')
        self.assertRejected(viewers.html_page, self.write("flame.html", page),
                            "the page requested file://")

    def test_deadline(self):
        self.assertRejected(viewers.html_page,
                            self.write("flame.html", FLAME_PAGE),
                            "timed out after 3 s", wait_for=".absent",
                            timeout=3)


class UnavailableTests(unittest.TestCase):
    """Without a viewer the checks skip, saying what is missing."""

    CHECKS = [viewers.speedscope_import, viewers.devtools_heapsnapshot,
              viewers.devtools_cpuprofile, viewers.html_page]

    def setUp(self):
        manifest = os.path.join(viewers.SCRIPTS, "package.json")
        if not os.path.exists(manifest):
            self.skipTest(f"no viewer scripts in {viewers.SCRIPTS}")
        with open(manifest, encoding="utf-8") as f:
            self.pinned = json.load(f)["dependencies"]
        self.tmp = tempfile.mkdtemp()
        self.addCleanup(os_helper.rmtree, self.tmp)
        self.profile = os.path.join(self.tmp, "profile.json")

    def fake_install(self, versions):
        for package, version in versions.items():
            directory = os.path.join(self.tmp, "node_modules", package)
            os.makedirs(directory)
            with open(os.path.join(directory, "package.json"), "w",
                      encoding="utf-8") as f:
                json.dump({"name": package, "version": version}, f)

    def assertSkips(self, check, reason):
        with self.assertRaisesRegex(unittest.SkipTest, reason):
            check(self.profile)

    def test_packages_missing(self):
        with mock.patch.dict(os.environ, SIGHTGLASS_VIEWERS=self.tmp):
            for check in self.CHECKS:
                with self.subTest(check.__name__):
                    self.assertSkips(
                        check, "not installed in " + re.escape(self.tmp))

    def test_other_version_installed(self):
        self.fake_install(dict.fromkeys(self.pinned, "0.0.1"))
        with mock.patch.dict(os.environ, SIGHTGLASS_VIEWERS=self.tmp):
            for check in self.CHECKS:
                with self.subTest(check.__name__):
                    self.assertSkips(check, "0.0.1 installed .* pinned")

    def test_chromium_missing(self):
        self.fake_install(self.pinned)
        with mock.patch.dict(os.environ, SIGHTGLASS_VIEWERS=self.tmp,
                             SIGHTGLASS_CHROMIUM="/nonexistent/chromium"):
            for check in (viewers.speedscope_import, viewers.html_page):
                with self.subTest(check.__name__):
                    self.assertSkips(check, "Chromium not found")

    def test_node_missing(self):
        with mock.patch.dict(os.environ, PATH=self.tmp):
            for check in self.CHECKS:
                with self.subTest(check.__name__):
                    self.assertSkips(check, r"Node\.js \(node\) not found")


if __name__ == "__main__":
    unittest.main()
