"""Check profile files with the real viewers' own code.

speedscope's built app (in headless Chromium) and Chrome DevTools' own
loaders (run in Node) load a file and report what they show; the scripts
doing it are in Tools/sightglass/viewers/.  Each function here returns that
report as a dict, raises ViewerRejected (an AssertionError, so a test fails
with the viewer's words) when the viewer does not accept the file, and
raises unittest.SkipTest, saying what is missing, when the viewer is not
installed.  Tools/sightglass/install-deps installs Chromium and the npm
packages, in $SIGHTGLASS_VIEWERS or else ~/.cache/sightglass/viewers.
"""

import json
import os
import shutil
import signal
import subprocess
import tempfile
import unittest

__all__ = [
    "ViewerRejected", "ViewerError",
    "speedscope_import", "devtools_heapsnapshot", "devtools_cpuprofile",
    "html_page",
]

# Through the link build/src has to our file, back to the source tree.
SCRIPTS = os.path.join(
    os.path.dirname(os.path.realpath(__file__)),
    os.pardir, os.pardir, os.pardir, "Tools", "sightglass", "viewers")
SCRIPTS = os.path.normpath(SCRIPTS)

# Beyond a check's own deadline, time to close Chromium and the server.
CLEANUP_SECONDS = 30

INSTALL_SCRIPT = "Tools/sightglass/install-deps"
INSTALL_HINT = f"{INSTALL_SCRIPT} installs it"


class ViewerRejected(AssertionError):
    """The viewer did not accept the file; .result is its full report."""

    def __init__(self, viewer, path, result):
        self.result = result
        problems = "\n  ".join(result.get("problems") or ["(no reason given)"])
        super().__init__(f"{viewer} rejected {path}:\n  {problems}")


class ViewerError(RuntimeError):
    """The checking script itself failed (not a verdict on the file)."""


def viewers_dir():
    return (os.environ.get("SIGHTGLASS_VIEWERS")
            or os.path.expanduser("~/.cache/sightglass/viewers"))


def chromium_path():
    return os.environ.get("SIGHTGLASS_CHROMIUM") or shutil.which("chromium")


def _require(packages, browser):
    """Raise SkipTest unless node, the pinned packages (and Chromium) are
    there; return node's path and the environment to run a script in."""
    node = shutil.which("node")
    if node is None:
        raise unittest.SkipTest(f"Node.js (node) not found; {INSTALL_HINT}"
                                " with the viewers")
    manifest = os.path.join(SCRIPTS, "package.json")
    if not os.path.exists(manifest):
        raise unittest.SkipTest(f"viewer scripts not found in {SCRIPTS}"
                                " (they are in the source tree only)")
    with open(manifest, encoding="utf-8") as f:
        pinned = json.load(f)["dependencies"]
    directory = viewers_dir()
    for package in packages:
        installed = os.path.join(directory, "node_modules", package,
                                 "package.json")
        try:
            with open(installed, encoding="utf-8") as f:
                version = json.load(f)["version"]
        except FileNotFoundError:
            raise unittest.SkipTest(
                f"npm package {package} not installed in {directory};"
                f" {INSTALL_HINT}") from None
        if version != pinned[package]:
            raise unittest.SkipTest(
                f"npm package {package} {version} installed in {directory},"
                f" {pinned[package]} pinned; run {INSTALL_SCRIPT}")
    env = dict(os.environ, SIGHTGLASS_VIEWERS=directory)
    if browser:
        chromium = chromium_path()
        if not chromium or not os.access(chromium, os.X_OK):
            raise unittest.SkipTest("Chromium not found (Debian package"
                                    f" chromium); {INSTALL_HINT}")
        env["SIGHTGLASS_CHROMIUM"] = chromium
    return node, env


def _kill_processes_naming(directory):
    """Kill the processes whose command line names directory, a private
    temporary one: Chromium's profile lives there."""
    try:
        pids = [int(name) for name in os.listdir("/proc") if name.isdigit()]
    except FileNotFoundError:
        return
    needle = os.fsencode(directory)
    for pid in pids:
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                if needle not in f.read():
                    continue
            os.kill(pid, signal.SIGKILL)
        except (FileNotFoundError, PermissionError, ProcessLookupError):
            pass  # gone meanwhile, or not ours


def _check(viewer, script, args, path, packages, timeout, browser=True):
    node, env = _require(packages, browser)
    path = os.path.abspath(path)
    with tempfile.TemporaryDirectory(prefix="sightglass-viewers-") as tmp:
        # Chromium's profile and anything else temporary goes under tmp,
        # removed below even if the script had to be killed.
        env["TMPDIR"] = tmp
        command = [node, os.path.join(SCRIPTS, script),
                   "--timeout", str(timeout), *args, path]
        with subprocess.Popen(
                command, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                env=env, start_new_session=True,
                encoding="utf-8", errors="replace") as proc:
            try:
                out, err = proc.communicate(
                    timeout=timeout + CLEANUP_SECONDS)
            except subprocess.TimeoutExpired:
                out = None
            finally:
                # However the script ended, end what it left: its own
                # session (esbuild's service, say) and Chromium, which
                # Playwright starts in a session of its own.
                try:
                    os.killpg(proc.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                _kill_processes_naming(tmp)
    if out is None:
        raise ViewerError(f"{script} did not finish within"
                          f" {timeout + CLEANUP_SECONDS} seconds")
    if proc.returncode != 0:
        raise ViewerError(f"{script} failed (exit code {proc.returncode}):\n"
                          f"{err.strip()}")
    try:
        result = json.loads(out)
    except ValueError:
        report = ViewerError(f"{script} printed no report:\n{out}\n{err}")
        raise report from None
    if not result["ok"]:
        raise ViewerRejected(viewer, path, result)
    return result


def speedscope_import(path, *, timeout=60):
    """Import a profile into speedscope: its own JSON format, a Chrome
    .cpuprofile or folded stacks (one "frame;frame;frame count" a line).

    Returns {"name": ..., "profiles": [{"name": ..., "frames": [{"name",
    "file", "total", "self"}]}], ...}: one profile a thread, with the frames
    its sandwich view lists and the times as shown.  Rejected when the
    import fails or the page reports an error.
    """
    return _check("speedscope", "speedscope.mjs", [], path,
                  ["speedscope", "playwright-core"], timeout)


def devtools_heapsnapshot(path, *, timeout=60):
    """Load a .heapsnapshot with DevTools' heap snapshot loader.

    Returns {"node_count", "edge_count", "classes": [{"name", "count",
    "self_size", "max_retained_size"}], "statistics", ...}, the classes as
    the Memory panel's Summary lists them.  Rejected when DevTools throws or
    warns (unreachable nodes, say), or when the counts and references it
    takes on trust are wrong ("format_errors").
    """
    return _check("DevTools", "devtools.mjs", ["heapsnapshot"], path,
                  ["chrome-devtools-frontend", "esbuild"], timeout,
                  browser=False)


def devtools_cpuprofile(path, *, timeout=60):
    """Load a .cpuprofile as DevTools' Performance panel does.

    Returns {"function_names": [...], "threads": [{"pid", "tid", "calls":
    [{"name", "url", "start_us", "duration_us"}]}], ...}: the names in
    CPUProfileDataModel's tree, and the calls the trace engine builds for
    the flame chart.  Rejected as devtools_heapsnapshot() is.
    """
    return _check("DevTools", "devtools.mjs", ["cpuprofile"], path,
                  ["chrome-devtools-frontend", "esbuild"], timeout,
                  browser=False)


def html_page(path, *, wait_for=None, timeout=60):
    """Open a self-contained HTML page in headless Chromium.

    Returns {"title", "text", ...}, text being the page's visible text
    once loaded (and once the CSS selector wait_for matches, if given).
    Rejected on a page error, a console error or any request for something
    other than the page itself.
    """
    args = ["--wait-for", wait_for] if wait_for else []
    return _check("Chromium", "page.mjs", args, path, ["playwright-core"],
                  timeout)
