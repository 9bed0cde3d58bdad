"""Sightglass's build: its identity, and the tool that makes its tree.

The tree tests need a Sightglass checkout (this file is then a link into
it); an installed interpreter has none, and skips them.
"""

import hashlib
import http.client
import io
import os
import pathlib
import platform
import re
import shutil
import subprocess
import sys
import sysconfig
import tempfile
import unittest
from unittest import mock
from test import support
from test.support import import_helper, os_helper


def find_checkout():
    here = os.path.realpath(__file__)
    repo = os.path.dirname(os.path.dirname(os.path.dirname(here)))
    tool = os.path.join(repo, "Tools", "sightglass", "sgtree.py")
    return repo if os.path.exists(tool) else None


REPO = find_checkout()


def import_sgtree():
    sys.path.insert(0, os.path.join(REPO, "Tools", "sightglass"))
    try:
        import sgtree
    finally:
        del sys.path[0]
    return sgtree


def read_pins():
    return import_sgtree().read_pins()


class IdentityTests(unittest.TestCase):

    def test_version_names_the_fork(self):
        self.assertRegex(sys.version,
                         r"^3\.11\.2 \(sightglass/3\.11\.2\S*[,:]")
        self.assertEqual(sys.version_info[:5], (3, 11, 2, "final", 0))

    def test_version_still_parses(self):
        self.assertEqual(platform.python_version(), "3.11.2")
        self.assertEqual(platform.python_implementation(), "CPython")
        self.assertEqual(sys.implementation.name, "cpython")
        buildno, builddate = platform.python_build()
        self.assertTrue(buildno.startswith("sightglass/"), buildno)
        self.assertRegex(builddate, r"^\w{3} [ \d]\d \d{4} \d\d:\d\d:\d\d$")

    def test_git_info_is_sightglass(self):
        name, tag, revision = sys._git
        self.assertEqual(name, "CPython")
        self.assertTrue(tag.startswith("sightglass/"), tag)
        if revision:
            self.assertIn(f"{tag}:{revision}", sys.version)

    @unittest.skipIf(REPO is None, "needs a Sightglass checkout")
    def test_version_names_the_base(self):
        pins = read_pins()
        base = sys._git[1].removeprefix("sightglass/")
        self.assertIn(base, (pins["debian_base_name"],
                             pins["version"] + "-unpatched"))

    def test_memory_tracking_config_var(self):
        configured = "--with-memory-tracking" in sysconfig.get_config_var(
            "CONFIG_ARGS")
        self.assertEqual(sysconfig.get_config_var("Py_TRACK_MEMORY"),
                         1 if configured else 0)
        # Like sys.gettotalrefcount in a debug build: hasattr tells.
        for name in ("total_memory_used", "peak_memory_used",
                     "reset_peak_memory_used", "total_allocation_count",
                     "type_memory_usage", "type_allocation_counts"):
            self.assertEqual(hasattr(sys, name), configured, name)


class TrackedMallocMacroTests(unittest.TestCase):

    def test_macros_work_in_every_build(self):
        # Without --with-memory-tracking they are the plain allocator.
        _testcapi = import_helper.import_module("_testcapi")
        addr = _testcapi.pyobject_t_malloc("sightglass.macro", 64)
        self.assertNotEqual(addr, 0)
        addr = _testcapi.pyobject_t_realloc("sightglass.macro", addr, 4096)
        self.assertNotEqual(addr, 0)
        self.assertIsNone(_testcapi.pyobject_t_free("sightglass.macro",
                                                    addr))


@unittest.skipIf(REPO is None, "needs a Sightglass checkout")
class TreeToolTests(unittest.TestCase):

    def sgtree(self, tool, *args, build=None, **kw):
        cmd = [sys.executable, "-I", tool]
        if build:
            cmd += ["--build", build]
        return subprocess.run(cmd + list(args), stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True, **kw)

    def test_wrong_sha256_is_refused(self):
        pins = read_pins()
        with tempfile.TemporaryDirectory() as tmp:
            bogus = os.path.join(tmp, pins["tarball"])
            with open(bogus, "wb") as f:
                f.write(b"not the CPython release\n")
            env = dict(os.environ, SIGHTGLASS_CACHE=tmp)
            proc = self.sgtree(
                os.path.join(REPO, "Tools", "sightglass", "sgtree.py"),
                "fetch", "--without-debian-fixes",
                "--with-upstream-tarball", bogus, env=env)
        self.assertEqual(proc.returncode, 1, proc.stdout)
        self.assertIn("refusing", proc.stdout)
        self.assertIn(pins["sha256"], proc.stdout)

    def test_export_and_rematerialize_round_trip(self):
        real_build = os.path.join(REPO, "build")
        if not os.path.isdir(os.path.join(real_build, "base")):
            self.skipTest("build/base is not materialized")
        with tempfile.TemporaryDirectory() as tmp:
            # A copy of the checkout (what git would commit) and of the
            # materialized base, so nothing is fetched and the real
            # checkout is left alone.
            repo = os.path.join(tmp, "repo")
            files = subprocess.run(
                ["git", "-C", REPO, "ls-files", "-z", "--cached", "--others",
                 "--exclude-standard"], stdout=subprocess.PIPE,
                check=True).stdout.decode().split("\0")
            for rel in filter(None, files):
                if os.path.isfile(os.path.join(REPO, rel)):
                    os.makedirs(os.path.dirname(os.path.join(repo, rel)),
                                exist_ok=True)
                    shutil.copy2(os.path.join(REPO, rel),
                                 os.path.join(repo, rel))
            subprocess.run(["git", "init", "-q", repo], check=True)
            tool = os.path.join(repo, "Tools", "sightglass", "sgtree.py")

            def new_build(name):
                build = os.path.join(tmp, name)
                os.makedirs(build)
                shutil.copytree(os.path.join(real_build, "base"),
                                os.path.join(build, "base"), symlinks=True)
                shutil.copy2(os.path.join(real_build, "base.stamp"), build)
                if os.path.isdir(os.path.join(real_build, "autoconf-cache")):
                    shutil.copytree(
                        os.path.join(real_build, "autoconf-cache"),
                        os.path.join(build, "autoconf-cache"))
                proc = self.sgtree(tool, "materialize", build=build)
                self.assertEqual(proc.returncode, 0, proc.stdout)
                return build

            build = new_build("build1")
            src = os.path.join(build, "src")
            self.assertEqual(self.sgtree(tool, "status", build=build).stdout,
                             "no unexported edits\n")

            # Edit an unpatched file and a patched one, add a file.
            with open(os.path.join(src, "Python", "ceval.c"), "a") as f:
                f.write("/* round trip */\n")
            with open(os.path.join(src, "configure.ac"), "a") as f:
                f.write("dnl round trip\n")
            with open(os.path.join(src, "Python", "sg_roundtrip.c"),
                      "w") as f:
                f.write("/* new */\n")
            # What Python writes into the tree at run time is not an edit.
            with open(os.path.join(src, "Lib", "lib2to3",
                                   "Grammar9.9.9.final.0.pickle"), "w") as f:
                f.write("cache")
            status = self.sgtree(tool, "status", build=build).stdout
            self.assertEqual(status.split(), ["Python/ceval.c",
                                              "Python/sg_roundtrip.c",
                                              "configure.ac"])

            # Re-materializing would lose them: refused.
            proc = self.sgtree(tool, "materialize", build=build)
            self.assertEqual(proc.returncode, 1)
            self.assertIn("not exported", proc.stdout)
            self.assertIn("Python/ceval.c", proc.stdout)

            proc = self.sgtree(tool, "export", build=build)
            self.assertEqual(proc.returncode, 0, proc.stdout)
            self.assertTrue(os.path.exists(os.path.join(
                repo, "patches", "Python", "ceval.c.diff")))
            self.assertTrue(os.path.islink(os.path.join(
                src, "Python", "sg_roundtrip.c")))
            with open(os.path.join(repo, "Python", "sg_roundtrip.c")) as f:
                self.assertEqual(f.read(), "/* new */\n")
            self.assertFalse(os.path.exists(os.path.join(repo, "Lib")
                                            + "/lib2to3"))
            self.assertEqual(self.sgtree(tool, "status", build=build).stdout,
                             "no unexported edits\n")

            # Exporting again changes nothing.
            before = snapshot(os.path.join(repo, "patches"))
            self.sgtree(tool, "export", build=build)
            self.assertEqual(snapshot(os.path.join(repo, "patches")), before)

            # A fresh materialization reproduces the edited tree exactly.
            build2 = new_build("build2")
            os.unlink(os.path.join(src, "Lib", "lib2to3",
                                   "Grammar9.9.9.final.0.pickle"))
            self.assertEqual(snapshot(os.path.join(build2, "src")),
                             snapshot(src))

            # Undoing the edits and exporting removes their patches.
            os.unlink(os.path.join(repo, "Python", "sg_roundtrip.c"))
            shutil.copy2(os.path.join(build, "base", "Python", "ceval.c"),
                         os.path.join(src, "Python", "ceval.c"))
            proc = self.sgtree(tool, "export", build=build)
            self.assertEqual(proc.returncode, 0, proc.stdout)
            self.assertFalse(os.path.exists(os.path.join(
                repo, "patches", "Python", "ceval.c.diff")))

            # A file of ours may not shadow an upstream one.
            shutil.copy2(os.path.join(build, "base", "Python", "ceval.c"),
                         os.path.join(repo, "Python", "ceval.c"))
            proc = self.sgtree(tool, "materialize", build=build)
            self.assertEqual(proc.returncode, 1)
            self.assertIn("Python/ceval.c exists upstream", proc.stdout)
            self.assertIn("edit build/src/Python/ceval.c", proc.stdout)


# Programs ./configure may run: the PATH of MissingToolTests offers those of
# them this machine has, except the ones a test takes away.
BUILD_TOOLS = ["tar", "gzip", "xz", "patch", "autoreconf", "autoconf",
               "autoheader", "aclocal", "automake", "m4", "perl", "make",
               "gcc", "cc", "clang", "git", "cp"]
COMPILERS = ["gcc", "cc", "clang"]


def has_build_tools():
    """Whether ./configure finds all it needs here, with a copy of PATH."""
    needed = ["tar", "gzip", "xz", "patch", "autoreconf", "aclocal", "make"]
    return (all(map(shutil.which, needed))
            and any(map(shutil.which, COMPILERS)))


@unittest.skipIf(REPO is None, "needs a Sightglass checkout")
class MissingToolTests(unittest.TestCase):
    """./configure names what is missing instead of failing on it."""

    def configure(self, *args, without=(), cc=None):
        with tempfile.TemporaryDirectory() as tmp:
            # A copy of the tool, so that whatever it does happens there.
            tools = os.path.join(tmp, "repo", "Tools", "sightglass")
            os.makedirs(tools)
            for name in ("sgtree.py", "upstream.pin", "debian-fixes.txt"):
                shutil.copy2(os.path.join(REPO, "Tools", "sightglass", name),
                             tools)
            bin_dir = os.path.join(tmp, "bin")
            os.mkdir(bin_dir)
            for name in BUILD_TOOLS:
                path = shutil.which(name)
                if path and name not in without:
                    os.symlink(path, os.path.join(bin_dir, name))
            # Tarballs that are refused: past the check, configure stops
            # at once, having fetched nothing.
            bogus = os.path.join(tmp, "bogus.tgz")
            with open(bogus, "wb") as f:
                f.write(b"bogus\n")
            env = dict(os.environ, PATH=bin_dir,
                       SIGHTGLASS_CACHE=os.path.join(tmp, "cache"),
                       SIGHTGLASS_TARBALL=bogus,
                       SIGHTGLASS_DEBIAN_TARBALL=bogus)
            env.pop("CC", None)
            if cc:
                env["CC"] = cc
            proc = subprocess.run(
                [sys.executable, "-I", os.path.join(tools, "sgtree.py"),
                 "configure"] + list(args),
                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                env=env, timeout=60)
            self.assertFalse(os.path.exists(os.path.join(tmp, "repo",
                                                         "build")))
        self.assertNotIn("Traceback", proc.stdout)
        self.assertEqual(proc.returncode, 1, proc.stdout)
        return proc.stdout

    def assertMissing(self, out, name):
        self.assertRegex(out, r"not installed: .*\b" + re.escape(name))
        self.assertIn("Run Tools/sightglass/install-deps", out)

    def test_missing_tool_is_named(self):
        for without, name in [(["patch"], "patch"),
                               (["autoreconf", "autoconf", "autoheader"],
                                "autoreconf (package autoconf)"),
                               (["xz"], "xz (package xz-utils)"),
                               (COMPILERS, "a C compiler")]:
            with self.subTest(name):
                self.assertMissing(self.configure(without=without), name)

    def test_compiler_from_cc(self):
        out = self.configure(cc="sg-no-such-cc -O2")
        self.assertMissing(out, "the C compiler sg-no-such-cc (from CC)")
        if not has_build_tools():
            self.skipTest("this machine lacks build tools")
        # $CC is enough, wherever it is.
        compiler = next(filter(None, map(shutil.which, COMPILERS)))
        out = self.configure(without=COMPILERS, cc=compiler + " -O2")
        self.assertNotIn("not installed", out)
        self.assertIn("refusing", out)

    def test_xz_only_for_debian_fixes(self):
        if not has_build_tools():
            self.skipTest("this machine lacks build tools")
        out = self.configure("--without-debian-fixes", without=["xz"])
        self.assertNotIn("not installed", out)
        self.assertIn("refusing", out)

    def test_nothing_missing(self):
        if not has_build_tools():
            self.skipTest("this machine lacks build tools")
        out = self.configure()
        self.assertNotIn("not installed", out)
        self.assertIn("refusing", out)


class CutResponse(io.BytesIO):
    """An HTTP response whose connection breaks after some data."""

    def __init__(self, exc):
        super().__init__(b"partial data\n" * 100)
        self.exc = exc

    def read(self, size=-1):
        data = super().read(size)
        if not data:
            raise self.exc
        return data


@unittest.skipIf(REPO is None, "needs a Sightglass checkout")
class DownloadCacheTests(unittest.TestCase):
    """What fetch() leaves in the cache, with a fake pin served locally."""

    DATA = b"the pinned tarball\n" * 1000

    def setUp(self):
        self.sgtree = import_sgtree()
        tmp = self.enterContext(tempfile.TemporaryDirectory())
        self.cache = os.path.join(tmp, "cache")
        self.served = os.path.join(tmp, "served.tgz")
        self.serve(self.DATA)
        self.pins = {"tarball": "fake.tgz",
                     "sha256": hashlib.sha256(self.DATA).hexdigest(),
                     "url": pathlib.Path(self.served).as_uri(),
                     "debian_package": "fake", "debian_version": "1",
                     "debian_orig": "fake.orig.tgz"}
        env = self.enterContext(os_helper.EnvironmentVarGuard())
        env["SIGHTGLASS_CACHE"] = self.cache
        env.unset("SIGHTGLASS_TARBALL")
        self.enterContext(mock.patch.object(self.sgtree, "read_pins",
                                            return_value=self.pins))
        # Stands for Debian's source package, which brings nothing unless
        # a test says so; the real one would use the network.
        self.apt = self.enterContext(mock.patch.object(
            self.sgtree, "apt_source", return_value="apt-get stub"))

    def serve(self, data):
        with open(self.served, "wb") as f:
            f.write(data)

    def fetch(self, **kw):
        with support.captured_stderr() as err:
            try:
                got = self.sgtree.fetch(with_debian=False, **kw)
            except self.sgtree.Error as exc:
                got = exc
        return got, err.getvalue()

    def cached(self):
        with open(os.path.join(self.cache, "fake.tgz"), "rb") as f:
            return f.read()

    def test_corrupt_cache_is_fetched_again(self):
        for data in (self.DATA[:1000], b"", self.DATA + b"x"):
            with self.subTest(size=len(data)):
                os.makedirs(self.cache, exist_ok=True)
                with open(os.path.join(self.cache, "fake.tgz"), "wb") as f:
                    f.write(data)
                got, err = self.fetch()
                self.assertEqual(
                    got, {"tarball": os.path.join(self.cache, "fake.tgz")})
                self.assertIn("corrupt or incomplete", err)
                self.assertEqual(self.cached(), self.DATA)
                self.assertEqual(os.listdir(self.cache), ["fake.tgz"])
        self.apt.assert_not_called()

    def test_bad_download_is_not_cached(self):
        self.serve(b"<html>a captive portal</html>\n")
        got, err = self.fetch()
        self.assertIsInstance(got, self.sgtree.Error)
        self.assertIn("refusing fake.tgz from file:", err)
        self.assertEqual(os.listdir(self.cache), [])

    def test_interrupted_download_leaves_nothing(self):
        for exc in (http.client.IncompleteRead(b"partial"),
                    ConnectionResetError(), KeyboardInterrupt()):
            with self.subTest(exc=type(exc).__name__), \
                    mock.patch.object(self.sgtree.urllib.request, "urlopen",
                                      return_value=CutResponse(exc)):
                if isinstance(exc, KeyboardInterrupt):
                    with self.assertRaises(KeyboardInterrupt):
                        self.fetch()
                else:
                    got, err = self.fetch()
                    self.assertIsInstance(got, self.sgtree.Error)
                self.assertEqual(os.listdir(self.cache), [])

    def test_apt_source_file_is_verified_then_cached(self):
        os.unlink(self.served)      # python.org is unreachable

        def apt_source(spec, dest, data):
            with open(os.path.join(dest, "fake.orig.tgz"), "wb") as f:
                f.write(data)
            return "apt-get stub"

        self.apt.side_effect = lambda spec, dest: apt_source(spec, dest,
                                                             b"not it")
        got, err = self.fetch()
        self.assertIsInstance(got, self.sgtree.Error)
        self.assertIn("refusing fake.tgz from apt-get source", err)
        self.assertEqual(os.listdir(self.cache), [])

        self.apt.side_effect = lambda spec, dest: apt_source(spec, dest,
                                                             self.DATA)
        got, err = self.fetch()
        self.assertEqual(got,
                         {"tarball": os.path.join(self.cache, "fake.tgz")})
        self.assertEqual(self.cached(), self.DATA)
        self.assertEqual(os.listdir(self.cache), ["fake.tgz"])

    def test_given_path_stays_strict(self):
        given = self.served + ".given"
        with open(given, "wb") as f:
            f.write(self.DATA[:1000])
        got, err = self.fetch(tarball=given)
        self.assertIsInstance(got, self.sgtree.Error)
        self.assertIn("refusing " + given, str(got))
        self.assertTrue(os.path.exists(given))
        self.assertEqual(os.listdir(self.cache), [])


def snapshot(root):
    """{path: content or link target} of every entry under root."""
    out = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in filenames + [d for d in dirnames
                                 if os.path.islink(os.path.join(dirpath, d))]:
            path = os.path.join(dirpath, name)
            rel = os.path.relpath(path, root)
            if re.search(r"(^|/)__pycache__/", rel):
                continue
            if os.path.islink(path):
                out[rel] = "->" + os.readlink(path)
            else:
                with open(path, "rb") as f:
                    out[rel] = f.read()
    return out


if __name__ == "__main__":
    unittest.main()
