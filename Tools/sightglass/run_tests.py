#!/usr/bin/env python3
"""Build Sightglass in both configurations and run its tests.

  1. build/test-tracking: ./configure --with-memory-tracking; runs the whole
     upstream regression suite, which includes the project's own tests
     (the test modules under Lib/test/ of this repository).
  2. build/test-plain: plain ./configure; runs the project's own tests and
     a core slice of the upstream suite.
  3. build/test-debug: ./configure --with-pydebug --with-memory-tracking;
     runs the project's own tests hunting reference and block leaks
     (-R 3:3; not those that exercise no C code of ours), then
     test_embed, whose test_no_memleak checks that a run ends with
     nothing left allocated, then the memory tests with
     PYTHONMALLOC=pymalloc (PYMALLOC_TESTS).  Assertions are on in this
     build.
  4. build/test-sanitizers: ./configure --with-address-sanitizer
     --with-undefined-behavior-sanitizer --with-memory-tracking, and as if
     the C library had no malloc_usable_size(), so that the tracking's
     fallback (a size prefix on each malloc()ed block) runs under the
     sanitizers; runs the project's own tests and the upstream modules
     that exercise tracing, frames and generators (SANITIZED_SLICE).  Any
     report fails the test that made it.

Failures known to happen on stock 3.11.2 on our machines (KNOWN_FAILURES)
are reported but not counted; every other failure fails the run.  The last
line is the total over every test case run: 'N passed, N failed, N skipped'.
"""

import argparse
import glob
import os
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ET

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import sgtree  # noqa: E402

# Failures of stock 3.11.2 on these machines, not of Sightglass: CI runs as
# root with the machine's environment.  Each is a test case id; anything
# else failing in these modules still fails the run.
KNOWN_FAILURES = {
    # PYTHONUNBUFFERED=1 in the environment reaches the child interpreter.
    "test_cmd_line.CmdLineTest.test_non_interactive_output_buffering",
    # PYTHONDONTWRITEBYTECODE=1 in the environment: no .pyc to deduplicate.
    "test_compileall.HardlinkDedupTestsNoSourceEpoch.test_import",
    "test_compileall.HardlinkDedupTestsWithSourceEpoch.test_import",
    # Its venv does not work here, as root: ensurepip fails, or (in a fresh
    # clone) the module pip built cannot be imported.  The extension itself
    # compiles cleanly against our headers as C++03 and C++11.
    "test_cppext.TestCPPExt.test_build_cpp03",
    "test_cppext.TestCPPExt.test_build_cpp11",
}

# Tests that hang on stock 3.11 on our machines, so are not run at all
# (regrtest --ignore).  The summary lists them.
KNOWN_HANGS = {
    # The VMs have a vsock device, but a connection to their own CID never
    # arrives: accept() in setUp waits forever.
    "test_socket.ThreadedVSOCKSocketStreamTest":
        "vsock connection to the VM's own CID never arrives",
}

# Upstream modules run on the plain build too: those that exercise what
# Sightglass changes (the eval loop, tracing and profiling, frames and
# generators, allocation of core types), then those that come with the
# carried Debian fixes.
CORE_SLICE = """
    test_sys test_sys_settrace test_sys_setprofile test_cprofile test_profile
    test_pstats
    test_bdb test_pdb test_trace test_generators test_coroutines
    test_asyncgen test_exceptions test_frame test_code test_dis test_gc
    test_weakref test_capi test_descr test_class test_dict test_list
    test_set test_tuple test_bytes test_unicode test_int test_float
    test_threading test_tracemalloc test_audit test_platform test_sysconfig
""".split() + """
    test_codeccallbacks test_codecs test_email test_genericpath
    test_htmlparser test_http_cookies test_httplib test_ipaddress
    test_minidom test_ntpath test_plistlib test_pyexpat test_ssl
    test_tarfile test_tempfile test_urllib test_urlparse test_venv
    test_webbrowser test_wsgiref test_zipfile test_py_compile
""".split()


# Upstream modules run under the sanitizers besides our own: those that
# poke the eval loop the way debuggers, coverage tools and profilers do.
SANITIZED_SLICE = """
    test_sys_settrace test_sys_setprofile test_generators test_coroutines
    test_asyncgen test_pdb test_bdb test_frame test_cprofile test_profile
    test_trace test_exceptions test_gc
""".split()

# Tests whose work is all in child processes: a leak there is the child's,
# which -R does not count, so the leak hunt skips them rather than repeat
# them six times (test_upstream_test_modules alone took ten of the
# hunt's minutes).  The other builds run them.
CHILD_PROCESS_ONLY = [
    "*.test_monitoring.TestLineCoverage.test_upstream_test_modules",
]

# Our test modules that exercise no C code of ours, which the debug and
# sanitizer builds leave out: test_viewers tests the harness and the
# viewers (Node.js and Chromium), test_sightglass_build the Python tool
# that makes the tree (four minutes of the leak hunt, ten under the
# sanitizers).
NO_C_CODE = {"test_viewers", "test_sightglass_build"}

# Our modules that take minutes in the debug and sanitizer builds,
# slowest first.  regrtest hands out modules in the order it is given
# them: in alphabetical order, test_profiling_sampling (7 minutes of the
# leak hunt) started after test_memtrack, and ran alone at the end.
# (Started first in the whole upstream suite, the modules that take a
# minute there ran beside each other, slower, and the suite took as
# long: it keeps its own order.)
SLOWEST = ["test_profiling_sampling", "test_profiling_heap", "test_memtrack"]

# The debug build runs under its debug hooks, which pymalloc's own paths
# (its fast paths with the tracking's hooks, the owned buffers it hands out
# directly) never take: the memory tests run on it once more with
# PYTHONMALLOC=pymalloc, so that its assertions check those paths too.
PYMALLOC_TESTS = ["test_long_freelist", "test_memtrack", "test_memtrack_fuzz",
                  "test_tracemalloc"]

# A sanitizer report aborts the process, so that the test that made it
# fails.  Leaks are the debug build's business: the interpreter does not
# free everything at exit by design.
SANITIZER_ENV = {
    "ASAN_OPTIONS": "detect_leaks=0:abort_on_error=1",
    "UBSAN_OPTIONS": "halt_on_error=1:abort_on_error=1:print_stacktrace=1",
}


def slowest_first(tests):
    """tests, the SLOWEST among them first; the others keep their order."""
    rank = {name: i for i, name in enumerate(SLOWEST)}
    return sorted(tests, key=lambda name: rank.get(name, len(SLOWEST)))


def own_tests(lay):
    pattern = os.path.join(lay.repo, "Lib", "test", "test_*.py")
    return sorted(os.path.basename(p)[:-3] for p in glob.glob(pattern))


def build(lay, name, configure_args, jobs):
    """Configure (once) and build one configuration; return its python."""
    obj = os.path.join(lay.build, name)
    wanted = " ".join(configure_args)
    stamp = os.path.join(obj, ".sightglass-configure-args")
    if not (os.path.exists(os.path.join(obj, "Makefile"))
            and os.path.exists(stamp) and open(stamp).read() == wanted):
        print(f"== configure {name}: {wanted or '(defaults)'}", flush=True)
        if sgtree.configure_build_dir(lay, obj, configure_args):
            raise SystemExit(f"configure failed in {obj}")
        with open(stamp, "w") as f:
            f.write(wanted)
    print(f"== build {name}", flush=True)
    log = os.path.join(lay.build, name + ".build.log")
    with open(log, "w") as out:
        for targets in (["regen-opcode", "regen-opcode-targets", "clinic"],
                        ["all"]):
            rc = subprocess.call(["make", f"-j{jobs}"] + targets, cwd=obj,
                                 stdout=out, stderr=subprocess.STDOUT)
            if rc:
                os.system(f"tail -40 {log}")
                raise SystemExit(f"build of {name} failed; see {log}")
    return os.path.join(obj, "python")


# Run by the installed interpreter: the modules that need the system
# libraries the build dependencies provide, each doing real work.
INSTALL_CHECKS = {
    "ssl": "import ssl; ssl.create_default_context()",
    "ctypes": "import ctypes; assert ctypes.CDLL(None).strlen(b'abc') == 3",
    "sqlite3": "import sqlite3; "
               "assert sqlite3.connect(':memory:').execute('select 6*7')"
               ".fetchone() == (42,)",
    "zlib": "import zlib; assert zlib.decompress(zlib.compress(b'x'*99)) "
            "== b'x'*99",
    "bz2": "import bz2; assert bz2.decompress(bz2.compress(b'y')) == b'y'",
    "lzma": "import lzma; assert lzma.decompress(lzma.compress(b'y')) "
            "== b'y'",
    "identity": "import sys, platform; "
                "assert sys.version.startswith('3.11.2 (sightglass/'); "
                "assert platform.python_version() == '3.11.2'",
    "stdlib": "import sys, os; assert os.__file__.startswith(sys.prefix)",
}


def install_check(lay, name, tally, jobs):
    """make install into a scratch DESTDIR; the installed python works."""
    obj = os.path.join(lay.build, name)
    dest = os.path.join(lay.build, name + "-install")
    subprocess.call(["rm", "-rf", dest])
    print(f"== install {name} into {dest}", flush=True)
    log = os.path.join(lay.build, name + ".install.log")
    with open(log, "w") as out:
        rc = subprocess.call(["make", f"-j{jobs}", "install",
                              f"DESTDIR={dest}"], cwd=obj, stdout=out,
                             stderr=subprocess.STDOUT)
    prefix = sysconfig_of(os.path.join(obj, "python"), "prefix")
    python = os.path.join(dest + prefix, "bin", "python3")
    for check, code in INSTALL_CHECKS.items():
        ok = rc == 0 and subprocess.call(
            [python, "-I", "-c", code], cwd=dest) == 0
        if ok:
            tally.passed += 1
        else:
            tally.failed += 1
            tally.failures.append(f"install: {check}"
                                  + ("" if rc == 0 else f" (see {log})"))
    print(f"   installed python: {python}", flush=True)


def sysconfig_of(python, var):
    return subprocess.run(
        [python, "-c", f"import sysconfig; print(sysconfig.get_config_var("
                       f"{var!r}))"],
        stdout=subprocess.PIPE, text=True, check=True).stdout.strip()


class Tally:
    def __init__(self):
        self.passed = self.failed = self.skipped = 0
        self.known = []
        self.failures = []

    def add_junit(self, path, label):
        """Count the test cases of a regrtest --junit-xml file; a file
        regrtest did not write (it died) is one failure."""
        if not os.path.exists(path):
            self.failed += 1
            self.failures.append(f"{label}: regrtest wrote no results")
            return
        root = ET.parse(path).getroot()
        for case in root.iter("testcase"):
            ident = case_id(case)
            bad = case.find("failure") is not None or \
                case.find("error") is not None
            if bad and ident in KNOWN_FAILURES:
                self.known.append(f"{label}: {ident}")
            elif bad:
                self.failed += 1
                self.failures.append(f"{label}: {ident}")
            elif case.find("skipped") is not None:
                self.skipped += 1
            else:
                self.passed += 1


def regrtest(python, label, tests, jobs, tally, workdir, where, env=None):
    """Run regrtest, in the directory `where` gives; failed modules are run
    once more on their own.

    A module that fails without a failing test case (a crash, an import
    error, a leaked thread) counts as one failure.
    """
    xml = os.path.join(workdir, f"{label}.xml")
    cmd = [python, "-m", "test", f"-j{jobs}", "--timeout", "1200",
           "--junit-xml", xml] + where + IGNORE + slowest_first(tests)
    print(f"== {label}: {' '.join(cmd[1:])}", flush=True)
    proc = run_streaming(cmd, env)
    out = proc.stdout
    failed_modules = parse_failed_modules(out)
    rerun = sorted(m for m in failed_modules
                   if not all_known(m, xml))
    if rerun:
        print(f"== {label}: running {' '.join(rerun)} again on its own",
              flush=True)
        xml2 = os.path.join(workdir, f"{label}.rerun.xml")
        proc2 = run_streaming([python, "-m", "test", "--timeout", "1200",
                               "-v", "--junit-xml", xml2]
                              + where + IGNORE + rerun, env)
        still = parse_failed_modules(proc2.stdout)
        drop_modules(xml, rerun)
        tally.add_junit(xml, label)
        tally.add_junit(xml2, label + " (run again)")
        for mod in still:
            if not module_has_failing_case(xml2, mod):
                tally.failed += 1
                tally.failures.append(f"{label}: {mod} (whole module)")
        for mod in set(rerun) - set(still):
            print(f"   NOTE: {mod} failed in the parallel run, passed alone")
    else:
        tally.add_junit(xml, label)
    if proc.returncode not in (0, 2) and not failed_modules:
        tally.failed += 1
        tally.failures.append(f"{label}: regrtest exit {proc.returncode}")


def leak_hunt(python, tests, jobs, tally, where):
    """Run tests with -R 3:3; each module that leaks or fails counts as one
    failure, each skipped one as one skip, each clean one as one pass.  (No
    --junit-xml here: the results it keeps across the repetitions read as
    leaks.)"""
    cmd = [python, "-m", "test", f"-j{jobs}", "--timeout", "1200",
           "-R", "3:3"] + where + slowest_first(tests)
    print(f"== debug-leaks: {' '.join(cmd[1:])}", flush=True)
    proc = run_streaming(cmd)
    failed = parse_failed_modules(proc.stdout)
    skipped = listed_modules(proc.stdout, (" skipped:",))
    for mod in tests:
        if mod in failed:
            tally.failed += 1
            tally.failures.append(f"debug-leaks: {mod}")
        elif mod in skipped:
            tally.skipped += 1
        else:
            tally.passed += 1
    if proc.returncode not in (0, 2) and not failed:
        tally.failed += 1
        tally.failures.append(f"debug-leaks: regrtest exit {proc.returncode}")


def ignoring(patterns):
    """regrtest's arguments that leave out the tests matching patterns."""
    return [arg for pattern in patterns for arg in ("--ignore", pattern)]


IGNORE = ignoring(f"*.{name}.*" for name in KNOWN_HANGS)


def run_streaming(cmd, env=None):
    """Run cmd, with env added to the environment, showing its output as it
    comes, and keep it."""
    lines = []
    with subprocess.Popen(cmd, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True,
                          errors="replace",
                          env=dict(os.environ, **(env or {}))) as proc:
        for line in proc.stdout:
            sys.stdout.write(line)
            sys.stdout.flush()
            lines.append(line)
    return subprocess.CompletedProcess(cmd, proc.returncode, "".join(lines))


def parse_failed_modules(out):
    """Module names regrtest lists under 'N tests failed:' and the like."""
    return listed_modules(out, (" failed:", " failed again:", "crashed:"))


def listed_modules(out, headings):
    """Module names regrtest lists under a line with one of headings."""
    mods, grab = set(), False
    for line in out.splitlines():
        stripped = line.strip()
        if (any(heading in line for heading in headings)
                and not line.startswith(" ")):
            grab = True
            continue
        if grab:
            if line.startswith("    ") and stripped:
                mods.update(stripped.split())
                continue
            grab = False
    return mods


def case_id(case):
    """'test_mod.Class.method' of a regrtest junit testcase element."""
    return case.get("name", "").removeprefix("test.")


def in_module(ident, mod):
    return ident == mod or ident.startswith(mod + ".")


def cases_of(xml, mod):
    if not os.path.exists(xml):
        return
    root = ET.parse(xml).getroot()
    for case in root.iter("testcase"):
        if in_module(case_id(case), mod):
            yield case_id(case), case


def all_known(mod, xml):
    bad = [i for i, c in cases_of(xml, mod)
           if c.find("failure") is not None or c.find("error") is not None]
    return bool(bad) and all(i in KNOWN_FAILURES for i in bad)


def module_has_failing_case(xml, mod):
    return any(c.find("failure") is not None or c.find("error") is not None
               for _, c in cases_of(xml, mod))


def drop_modules(xml, mods):
    if not os.path.exists(xml):
        return
    tree = ET.parse(xml)
    root = tree.getroot()
    for suite in list(root):
        for case in list(suite):
            if any(in_module(case_id(case), m) for m in mods):
                suite.remove(case)
    tree.write(xml)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("-j", "--jobs", type=int, default=2)
    p.add_argument("--quick", action="store_true",
                   help="skip the full upstream suite (the core slice runs "
                        "on the tracking and plain builds instead)")
    ns = p.parse_args()

    lay = sgtree.Layout()
    if sgtree.load_state(lay) is None:
        sgtree.materialize(lay)
    else:
        sgtree.sync(lay)
    tracking = build(lay, "test-tracking", ["--with-memory-tracking"],
                     ns.jobs)
    plain = build(lay, "test-plain", [], ns.jobs)
    debug = build(lay, "test-debug",
                  ["--with-pydebug", "--with-memory-tracking"], ns.jobs)
    sanitized = build(lay, "test-sanitizers",
                      ["--with-address-sanitizer",
                       "--with-undefined-behavior-sanitizer",
                       "--with-memory-tracking",
                       "ac_cv_func_malloc_usable_size=no"], ns.jobs)

    tally = Tally()
    mine = own_tests(lay)
    workdir = os.path.join(lay.build, "test-results")
    os.makedirs(workdir, exist_ok=True)
    slice_ = sorted(set(mine) | set(CORE_SLICE))
    install_check(lay, "test-tracking", tally, ns.jobs)
    # regrtest works in a short directory, not its default inside the
    # build: the tests that bind AF_UNIX sockets there (test_socket's,
    # test_pathlib's) skip when the socket's path passes the 108 bytes an
    # AF_UNIX address holds, so where the clone lies would decide whether
    # they run.
    with tempfile.TemporaryDirectory(prefix="sg-") as short:
        where = ["--tempdir", short]
        regrtest(tracking, "tracking", slice_ if ns.quick else [], ns.jobs,
                 tally, workdir, where)
        regrtest(plain, "plain", slice_, ns.jobs, tally, workdir, where)
        # The debug and sanitizer builds leave out NO_C_CODE, and the
        # tests elsewhere that load our files into the viewers: like
        # test_viewers, they test the viewers, none of our C code, and
        # take minutes repeated.
        no_viewers = where + ignoring(["*.ViewerTests.*"])
        leak_hunt(debug, sorted(set(mine) - NO_C_CODE), ns.jobs, tally,
                  no_viewers + ignoring(CHILD_PROCESS_ONLY))
        regrtest(debug, "debug", ["test_embed"], ns.jobs, tally, workdir,
                 where)
        regrtest(debug, "debug-pymalloc", PYMALLOC_TESTS, ns.jobs, tally,
                 workdir, where, {"PYTHONMALLOC": "pymalloc"})
        regrtest(sanitized, "sanitizers",
                 sorted(set(mine) - NO_C_CODE | set(SANITIZED_SLICE)),
                 ns.jobs, tally, workdir, no_viewers, SANITIZER_ENV)

    print()
    for name, why in KNOWN_HANGS.items():
        print(f"not run here (hangs on stock 3.11 too): {name}: {why}")
    for line in tally.known:
        print(f"known environment failure (not counted): {line}")
    for line in tally.failures:
        print(f"FAILED: {line}")
    print(f"total: {tally.passed} passed, {tally.failed} failed, "
          f"{tally.skipped} skipped")
    return 1 if tally.failed else 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except sgtree.Error as exc:
        sgtree.log(str(exc))
        sys.exit(1)
