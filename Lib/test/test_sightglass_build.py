"""Sightglass's build: its identity, and the tool that makes its tree.

The tree tests need a Sightglass checkout (this file is then a link into
it); an installed interpreter has none, and skips them.
"""

import os
import platform
import re
import shutil
import subprocess
import sys
import sysconfig
import tempfile
import unittest
from test.support import import_helper


def find_checkout():
    here = os.path.realpath(__file__)
    repo = os.path.dirname(os.path.dirname(os.path.dirname(here)))
    tool = os.path.join(repo, "Tools", "sightglass", "sgtree.py")
    return repo if os.path.exists(tool) else None


REPO = find_checkout()


def read_pins():
    sys.path.insert(0, os.path.join(REPO, "Tools", "sightglass"))
    try:
        import sgtree
    finally:
        del sys.path[0]
    return sgtree.read_pins()


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
