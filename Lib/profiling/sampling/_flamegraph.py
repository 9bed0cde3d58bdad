"""A flame graph as one HTML page: the data, the style and the script in
the page itself, so that it opens anywhere with no network."""

import html
import json

from .. import _formats

__all__ = ["write_flamegraph"]


def write_flamegraph(f, per_thread, interval, *, title):
    """Write the page: per_thread is [(thread name, [(stack, ticks), ...])]
    as Sampler.stacks() gives it."""
    string = _formats.Strings()

    threads = []
    for name, stacks in per_thread:
        # A node is [frame, ticks, children]; a frame [name, file, line]
        # of indexes into strings (file and line -1 when it has none).
        root = [[string(f"thread {name}"), -1, -1], 0, {}]
        for stack, ticks in stacks:
            root[1] += ticks
            node = root
            for fname, filename, line in stack:
                key = (fname, filename, line)
                child = node[2].get(key)
                if child is None:
                    frame = [string(fname), -1, -1] if filename == "~" else \
                        [string(fname), string(filename), line]
                    child = node[2][key] = [frame, 0, {}]
                child[1] += ticks
                node = child
        threads.append({"name": name, "root": _plain(root)})
    data = {"strings": string.table, "threads": threads,
            "interval": interval}
    # Nothing in the data may end the script element ("</script>", "<!--").
    payload = json.dumps(data, separators=(",", ":")).replace("<", "\\u003c")
    f.write(_PAGE.replace("{{title}}", html.escape(title))
            .replace("{{data}}", payload))


def _plain(node):
    frame, ticks, children = node
    return [frame, ticks, [_plain(child) for child in sorted(
        children.values(), key=lambda c: -c[1])]]


_PAGE = """<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<title>{{title}}</title>
<style>
body { font: 12px system-ui, sans-serif; margin: 0; color: #222; }
header { display: flex; gap: 1em; align-items: center; padding: 8px;
         background: #f4f4f4; border-bottom: 1px solid #ddd; }
header h1 { font-size: 14px; margin: 0; }
#status { margin-left: auto; color: #555; }
#graph { position: relative; margin: 8px; }
.frame { position: absolute; height: 17px; box-sizing: border-box;
         border: 1px solid #fff; overflow: hidden; white-space: nowrap;
         cursor: pointer; padding: 0 3px; line-height: 15px; }
.frame.match { background: #e0f !important; color: #fff; }
.frame.faded { opacity: 0.45; }
#details { margin: 8px; color: #333; min-height: 1.5em; }
</style>
</head>
<body>
<header>
<h1>{{title}}</h1>
<label>Thread <select id="thread"></select></label>
<label>Search <input id="search" type="search"
  placeholder="function or file"></label>
<button id="reset">Reset zoom</button>
<span id="status"></span>
</header>
<div id="details">Click a frame to zoom in; hover for details.</div>
<div id="graph"></div>
<script id="profile" type="application/json">{{data}}</script>
<script>
"use strict";
const data = JSON.parse(document.getElementById("profile").textContent);
const S = data.strings;
const ROW = 18;
const graph = document.getElementById("graph");
const select = document.getElementById("thread");
const search = document.getElementById("search");
const status = document.getElementById("status");
const details = document.getElementById("details");
let thread = 0, zoom = null;

data.threads.forEach((t, i) => {
  const option = document.createElement("option");
  option.value = i;
  option.textContent = t.name;
  select.appendChild(option);
});

function label(node) {
  const [name, file, line] = node[0];
  return file < 0 ? S[name] : S[name] + " (" + S[file] + ":" + line + ")";
}

function colour(node) {
  const [name, file] = node[0];
  if (file < 0) return "hsl(210, 15%, 78%)";
  let h = 0;
  for (const c of S[name]) h = (h * 31 + c.charCodeAt(0)) % 360;
  return "hsl(" + (20 + h % 40) + ", 85%, " + (55 + h % 15) + "%)";
}

function depthOf(node) {
  let d = 0;
  for (const child of node[2]) d = Math.max(d, depthOf(child));
  return d + 1;
}

function draw() {
  const root = data.threads[thread].root;
  const top = zoom || root;
  const width = graph.clientWidth || 800;
  const query = search.value.toLowerCase();
  let matched = 0;
  graph.textContent = "";
  graph.style.height = depthOf(top) * ROW + "px";
  const scale = width / Math.max(top[1], 1);
  function place(node, x, depth, counted) {
    const w = node[1] * scale;
    if (w < 0.5) return;
    const div = document.createElement("div");
    const text = label(node);
    const hit = query && text.toLowerCase().includes(query);
    if (hit && !counted) matched += node[1];
    div.className = "frame" + (hit ? " match" : query ? " faded" : "");
    div.style.left = x + "px";
    div.style.top = depth * ROW + "px";
    div.style.width = w + "px";
    div.style.background = colour(node);
    div.textContent = w > 30 ? text : "";
    div.title = text + "\\n" + node[1] + " samples, " +
      (100 * node[1] / root[1]).toFixed(2) + "%";
    div.onclick = () => { zoom = node; draw(); };
    div.onmouseenter = () => { details.textContent = div.title; };
    graph.appendChild(div);
    let cx = x;
    for (const child of node[2]) {
      place(child, cx, depth + 1, counted || hit);
      cx += child[1] * scale;
    }
  }
  place(top, 0, 0, false);
  const seconds = root[1] * data.interval;
  status.textContent = root[1] + " samples (" + seconds.toFixed(3) + " s)" +
    (query ? "; matched " + (100 * matched / Math.max(top[1], 1))
      .toFixed(1) + "%" : "");
}

select.onchange = () => { thread = +select.value; zoom = null; draw(); };
search.oninput = draw;
document.getElementById("reset").onclick = () => { zoom = null; draw(); };
window.onresize = draw;
if (data.threads.length) draw();
else status.textContent = "no samples";
</script>
</body>
</html>
"""
