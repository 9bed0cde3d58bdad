#!/usr/bin/env python3
"""Materialize, build and export the Sightglass CPython tree.

Sightglass keeps upstream CPython as a pinned dependency.  The repository
holds only what the project writes:

  * new files, at the paths they take in the CPython tree (Python/, Lib/, ...);
  * edits to upstream files, one unified diff per file under patches/.

This tool turns that into a buildable tree and back:

  fetch        get the pinned tarballs (Tools/sightglass/upstream.pin) and
               verify their sha256
  materialize  build/base = pristine tarball + the Debian fixes listed in
               Tools/sightglass/debian-fixes.txt; build/src = build/base +
               patches/ + symbolic links to our own files + regenerated
               configure
  sync         what the root Makefile runs before every build: re-materialize
               when patches or pins changed, otherwise only refresh the links
  export       write every edit made in build/src back into patches/ (and
               move files created there into the repository)
  status       list the edits in build/src that have not been exported
  configure    the root ./configure: materialize, then run upstream's
               configure out of tree in build/obj

Re-materializing never overwrites an edit that was not exported.
"""

import argparse
import difflib
import fnmatch
import hashlib
import http.client
import json
import os
import shutil
import subprocess
import sys
import tempfile
import urllib.request

TOOLS = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(TOOLS))
PIN_FILE = os.path.join(TOOLS, "upstream.pin")
FIXES_FILE = os.path.join(TOOLS, "debian-fixes.txt")
# Our fix-ups that Debian's fixes need in our build, listed among them.
FIXUPS_DIR = os.path.join(TOOLS, "debian-fixups")

# Files the build writes into the source tree: regenerated from the patched
# sources, so never exported and never counted as unexported edits.
BUILD_GENERATED = [
    "Include/opcode.h",
    "Include/internal/pycore_opcode.h",
    "Python/opcode_targets.h",
    "*/clinic/*.h",
    "Include/internal/pycore_global_strings.h",
    "Include/internal/pycore_runtime_init.h",
]
# Files that running Python writes into the source tree: when upstream does
# not ship them, they are not the tree's (see is_derived()).
RUNTIME_ARTIFACTS = [
    "Lib/lib2to3/*.pickle",     # lib2to3 caches its grammars beside them
    "Lib/test/data/*",          # test resources fetched by the suite
]
# Files materialize itself regenerates (autoreconf) from patched sources.
AUTOCONF_GENERATED = ["configure", "pyconfig.h.in", "aclocal.m4"]

FETCH_TIMEOUT = 20          # seconds without progress before giving up

# Programs materialize runs, with their Debian packages: a bare Debian lacks
# several, and they are easier to name up front than to guess from a failure.
TOOLS = [
    ("tar", "tar"),
    ("gzip", "gzip"),                   # tar -z
    ("patch", "patch"),
    ("autoreconf", "autoconf"),
    ("aclocal", "automake"),            # autoreconf runs it for CPython
]
XZ_TOOL = ("xz", "xz-utils")            # tar -J, for Debian's fixes
MAKE_TOOL = ("make", "make")            # what ./configure prepares for
# In the order CPython's configure (AC_PROG_CC) looks for them.
COMPILERS = ["gcc", "cc", "clang"]


class Error(Exception):
    pass


def log(msg):
    print("sgtree: " + msg, file=sys.stderr, flush=True)


def c_compiler():
    """The C compiler configure will use: $CC, else the first of COMPILERS
    installed; None when it is not installed."""
    cc = os.environ.get("CC", "").split()
    if cc:
        return " ".join(cc) if shutil.which(cc[0]) else None
    return next((name for name in COMPILERS if shutil.which(name)), None)


def require_tools(debian_fixes, build=False):
    """Refuse to start, naming every missing program, rather than fail
    midway with whatever the first missing one makes go wrong.

    build: also the C compiler and make, which ./configure prepares for.
    """
    needed = TOOLS + ([XZ_TOOL] if debian_fixes else [])
    if build:
        needed.append(MAKE_TOOL)
    missing = [tool if tool == package else f"{tool} (package {package})"
               for tool, package in needed if not shutil.which(tool)]
    if build and not c_compiler():
        cc = os.environ.get("CC", "").split()
        missing.append(f"the C compiler {cc[0]} (from CC)" if cc
                       else "a C compiler (" + ", ".join(COMPILERS) + ")")
    if missing:
        raise Error("not installed: " + ", ".join(missing) + "\n"
                    "Run Tools/sightglass/install-deps (as root, or via "
                    "sudo) to install what the build needs, then try again.")


# --- pins and inputs --------------------------------------------------------

def read_pins():
    pins = {}
    with open(PIN_FILE, encoding="utf-8") as f:
        for line in f:
            line = line.split("#", 1)[0].strip()
            if line:
                key, _, value = line.partition("=")
                pins[key.strip()] = value.strip()
    return pins


def read_fixes():
    """The Debian patch names to apply, in order."""
    names = []
    with open(FIXES_FILE, encoding="utf-8") as f:
        for line in f:
            line = line.split("#", 1)[0].strip()
            if line:
                names.append(line.split()[0])
    return names


def fixup_path(name):
    """The path of a listed fix that is one of our fix-ups, or None."""
    path = os.path.join(FIXUPS_DIR, name)
    return path if os.path.isfile(path) else None


def sha256_file(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def cache_dir():
    d = os.environ.get("SIGHTGLASS_CACHE")
    if not d:
        base = (os.environ.get("XDG_CACHE_HOME")
                or os.path.expanduser("~/.cache"))
        d = os.path.join(base, "sightglass")
    os.makedirs(d, exist_ok=True)
    return d


# --- fetching ---------------------------------------------------------------

def verify(path, expected, what):
    actual = sha256_file(path)
    if actual != expected:
        raise Error(
            f"refusing {path}: its sha256 is {actual}, but {what} is pinned "
            f"at {expected} (Tools/sightglass/upstream.pin)")


def adopt(path, dest, expected, origin):
    """Rename a fetched file to dest in the cache if its sha256 is pinned.

    The rename is the last step, so the cache never holds a file under its
    final name that was not verified whole.
    """
    actual = sha256_file(path)
    if actual != expected:
        log(f"refusing {os.path.basename(dest)} from {origin}: its sha256 is "
            f"{actual}, but it is pinned at {expected}")
        return False
    os.replace(path, dest)
    return True


def download(url, dest, expected):
    """Download url to dest if what arrives has the sha256 expected."""
    log(f"downloading {url}")
    # A unique name beside dest: concurrent runs sharing the cache do not
    # write into each other's file, and the rename stays on one filesystem.
    fd, tmp = tempfile.mkstemp(prefix=os.path.basename(dest) + ".",
                               suffix=".part", dir=os.path.dirname(dest))
    try:
        with os.fdopen(fd, "wb") as out, \
                urllib.request.urlopen(url, timeout=FETCH_TIMEOUT) as r:
            shutil.copyfileobj(r, out)
        return adopt(tmp, dest, expected, url)
    except (OSError, http.client.HTTPException) as exc:
        # HTTPException: a connection cut midway raises IncompleteRead.
        log(f"  failed: {exc}")
        return False
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def derived_deb_src(sources_root="/etc/apt"):
    """deb-src entries derived from this machine's own apt sources.

    Only the distribution's suites (the codename and its -updates and
    -security pockets) are kept, so third-party repositories without
    sources do not break the lookup.
    """
    codename = ""
    try:
        with open("/etc/os-release", encoding="utf-8") as f:
            for line in f:
                if line.startswith("VERSION_CODENAME="):
                    codename = line.split("=", 1)[1].strip().strip('"')
    except OSError:
        pass

    def ours(suite):
        return bool(codename) and suite.split("/")[0].split("-")[0] == codename

    one_line, stanzas = [], []
    parts = os.path.join(sources_root, "sources.list.d")
    lists = [os.path.join(sources_root, "sources.list")]
    if os.path.isdir(parts):
        lists += [os.path.join(parts, n) for n in sorted(os.listdir(parts))
                  if n.endswith(".list")]
    for path in lists:
        try:
            lines = open(path, encoding="utf-8").read().splitlines()
        except OSError:
            continue
        for line in lines:
            words = line.split("#", 1)[0].split()
            if not words or words[0] not in ("deb", "deb-src"):
                continue
            rest = words[1:]
            if rest and rest[0].startswith("["):
                while rest and not rest[0].endswith("]"):
                    rest = rest[1:]
                opts, rest = words[1:len(words) - len(rest) + 1], rest[1:]
            else:
                opts = []
            if len(rest) >= 2 and ours(rest[1]):
                one_line.append(" ".join(["deb-src"] + opts + rest))
    if os.path.isdir(parts):
        for name in sorted(os.listdir(parts)):
            if not name.endswith(".sources"):
                continue
            text = open(os.path.join(parts, name), encoding="utf-8").read()
            for stanza in text.split("\n\n"):
                fields = {}
                for line in stanza.splitlines():
                    if line.startswith("#") or ":" not in line:
                        continue
                    key, _, value = line.partition(":")
                    fields[key.strip().lower()] = (key.strip(), value.strip())
                types = fields.get("types", ("", ""))[1].split()
                suites = fields.get("suites", ("", ""))[1].split()
                if "deb" not in types and "deb-src" not in types:
                    continue
                suites = [s for s in suites if ours(s)]
                if not suites or "uris" not in fields:
                    continue
                fields["types"] = ("Types", "deb-src")
                fields["suites"] = ("Suites", " ".join(suites))
                stanza = "\n".join(f"{k}: {v}" for k, v in fields.values())
                if stanza not in stanzas:
                    stanzas.append(stanza)
    return sorted(set(one_line)), stanzas


def apt_source(spec, dest):
    """Download the Debian source package `spec` into dest with apt-get.

    Returns what apt-get said, to be shown if the files did not arrive.

    A private apt configuration (derived deb-src entries, its own lists) is
    used, so the machine's apt setup is left alone.  apt-get's exit status
    is not trusted: it may fail on one file while the one we need arrives.
    """
    if not shutil.which("apt-get"):
        return "no apt-get on this machine"
    one_line, stanzas = derived_deb_src()
    if not one_line and not stanzas:
        return "no Debian apt sources to derive deb-src entries from"
    work = tempfile.mkdtemp(prefix="sightglass-apt-")
    try:
        parts = os.path.join(work, "parts")
        lists = os.path.join(work, "lists")
        os.makedirs(os.path.join(lists, "partial"))
        os.makedirs(parts)
        with open(os.path.join(work, "sources.list"), "w") as f:
            f.write("\n".join(one_line) + "\n")
        with open(os.path.join(parts, "derived.sources"), "w") as f:
            f.write("\n\n".join(stanzas) + "\n")
        opts = ["-o", f"Dir::Etc::SourceList={work}/sources.list",
                "-o", f"Dir::Etc::SourceParts={parts}",
                "-o", f"Dir::State::Lists={lists}",
                "-o", f"Dir::Cache={work}/cache",
                "-o", "APT::Sandbox::User=root",
                "-o", "Acquire::Retries=0",
                "-o", f"Acquire::http::Timeout={FETCH_TIMEOUT}",
                "-o", f"Acquire::https::Timeout={FETCH_TIMEOUT}",
                "-q"]
        log(f"fetching Debian source package {spec} with apt-get")
        out = ""
        for args in (["update"], ["source", "--download-only", spec]):
            out += subprocess.run(["apt-get"] + opts + args, cwd=dest,
                                  stdout=subprocess.PIPE,
                                  stderr=subprocess.STDOUT, text=True,
                                  timeout=600).stdout
        return out
    except (OSError, subprocess.SubprocessError) as exc:
        return f"apt-get failed: {exc}"
    finally:
        shutil.rmtree(work, ignore_errors=True)


def fetch(tarball=None, debian_tarball=None, with_debian=True):
    """Return verified paths of the CPython tarball and Debian's patches.

    Each is looked for, in order: a path given by option or environment,
    the download cache, then python.org (CPython tarball only), then
    Debian's source package through apt-get.
    """
    pins = read_pins()
    cache = cache_dir()
    wanted = [("tarball", tarball or os.environ.get("SIGHTGLASS_TARBALL"),
               pins["tarball"], pins["sha256"])]
    if with_debian:
        wanted.append(("debian", debian_tarball
                       or os.environ.get("SIGHTGLASS_DEBIAN_TARBALL"),
                       pins["debian_tarball"], pins["debian_sha256"]))
    found = {}
    for key, given, name, sha in wanted:
        if given:
            verify(given, sha, name)
            found[key] = os.path.abspath(given)
            continue
        cached = os.path.join(cache, name)
        if os.path.exists(cached):
            actual = sha256_file(cached)
            if actual == sha:
                found[key] = cached
                continue
            # Not fatal, unlike a path the user gave: the cache is ours,
            # and a download cut short by a crash looks like this.
            log(f"the cached {cached} is corrupt or incomplete (sha256 "
                f"{actual}, pinned {sha}): deleting it and fetching it again")
            os.unlink(cached)
        if key == "tarball" and download(pins["url"], cached, sha):
            found[key] = cached

    missing = [w for w in wanted if w[0] not in found]
    if missing:
        # Inside the cache, so that adopting a file is a rename.
        with tempfile.TemporaryDirectory(prefix="sightglass-dl-",
                                         dir=cache) as dl:
            spec = pins["debian_package"] + "=" + pins["debian_version"]
            said = apt_source(spec, dl)
            for key, _, name, sha in missing:
                got = os.path.join(
                    dl, pins["debian_orig"] if key == "tarball" else name)
                cached = os.path.join(cache, name)
                if os.path.exists(got) and adopt(got, cached, sha,
                                                 "apt-get source"):
                    found[key] = cached
            if any(w[0] not in found for w in missing):
                log("apt-get said:\n" + said.strip())
    for key, _, name, _ in wanted:
        if key not in found:
            option = ("--with-upstream-tarball" if key == "tarball"
                      else "--with-debian-fixes")
            raise Error(
                f"could not get {name} (tried the cache {cache}"
                + (", python.org" if key == "tarball" else "")
                + ", and Debian's source package via apt-get); download it "
                f"yourself and pass {option}=PATH")
    return found


# --- trees ------------------------------------------------------------------

def matches(rel, patterns):
    return any(fnmatch.fnmatchcase(rel, p) for p in patterns)


def walk(root):
    """Relative paths of files and symlinks under root, sorted.

    Bytecode caches are left out: Python writes them beside any source.
    """
    out = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if d != "__pycache__")
        for name in dirnames:
            if os.path.islink(os.path.join(dirpath, name)):
                filenames.append(name)
        for name in filenames:
            out.append(os.path.relpath(os.path.join(dirpath, name), root))
    out.sort()
    return out


def entry_id(path):
    """What a tree entry is: a symlink's target or a file's sha256."""
    if os.path.islink(path):
        return "->" + os.readlink(path)
    return sha256_file(path)


def same_file(a, b):
    if os.path.islink(a) or os.path.islink(b):
        return (os.path.islink(a) and os.path.islink(b)
                and os.readlink(a) == os.readlink(b))
    if os.path.getsize(a) != os.path.getsize(b):
        return False
    with open(a, "rb") as fa, open(b, "rb") as fb:
        return fa.read() == fb.read()


def run(cmd, **kw):
    proc = subprocess.run(cmd, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True, **kw)
    if proc.returncode:
        raise Error(f"{' '.join(cmd)} failed:\n{proc.stdout}")
    return proc.stdout


def apply_patch(tree, patch_file, fuzz=0):
    out = run(["patch", "-p1", "-N", "-E", "--no-backup-if-mismatch",
               f"-F{fuzz}", "-s", "-i", patch_file], cwd=tree)
    if out.strip():
        raise Error(f"{patch_file} did not apply cleanly:\n{out}")


class Layout:
    """Where everything lives, for one repository checkout."""

    def __init__(self, repo=REPO, build=None):
        self.repo = os.path.abspath(repo)
        self.build = os.path.abspath(build or os.path.join(self.repo, "build"))
        self.base = os.path.join(self.build, "base")
        self.src = os.path.join(self.build, "src")
        self.obj = os.path.join(self.build, "obj")
        self.patches = os.path.join(self.repo, "patches")
        self.state = os.path.join(self.build, "src.state.json")

    # Our own files: every file of the repository inside a directory that
    # the CPython tree has (Python/, Lib/, ...).
    def own_files(self, top_dirs):
        try:
            out = subprocess.run(
                ["git", "-C", self.repo, "ls-files", "-z", "--cached",
                 "--others", "--exclude-standard"],
                stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                check=True).stdout.decode()
            names = [n for n in out.split("\0") if n]
        except (OSError, subprocess.CalledProcessError):
            names = walk(self.repo)
        return sorted(n for n in names
                      if n.split("/", 1)[0] in top_dirs and "/" in n
                      and os.path.isfile(os.path.join(self.repo, n)))

    def patch_files(self):
        out = []
        for rel in walk(self.patches) if os.path.isdir(self.patches) else []:
            if rel.endswith(".diff"):
                out.append(rel)
        return out


def base_mode(pristine):
    return "pristine" if pristine else "debian"


def base_name(pristine):
    pins = read_pins()
    if pristine:
        return pins["version"] + "-unpatched"
    return pins["debian_base_name"]


def make_base(lay, pristine=False, tarball=None, debian_tarball=None):
    """Create build/base: pristine CPython plus the listed Debian fixes."""
    fixes = [] if pristine else read_fixes()
    fixups = {name: sha256_file(fixup_path(name))
              for name in fixes if fixup_path(name)}
    key = hashlib.sha256(json.dumps(
        [read_pins(), fixes, fixups, base_mode(pristine)]).encode()
    ).hexdigest()
    stamp = os.path.join(lay.build, "base.stamp")
    if os.path.isdir(lay.base) and os.path.exists(stamp) \
            and open(stamp).read() == key:
        return
    got = fetch(tarball, debian_tarball, with_debian=not pristine)
    if pristine:
        log("*** WARNING: building on PRISTINE CPython 3.11.2, WITHOUT the "
            "security and crash fixes of Debian's maintained 3.11 ***")
    os.makedirs(lay.build, exist_ok=True)
    tmp = tempfile.mkdtemp(prefix="base.", dir=lay.build)
    try:
        run(["tar", "-xzf", got["tarball"], "-C", tmp])
        top = os.path.join(tmp, "Python-" + read_pins()["version"])
        if fixes:
            run(["tar", "-xJf", got["debian"], "-C", tmp, "debian/patches"])
            for name in fixes:
                apply_patch(top, fixup_path(name) or os.path.join(
                    tmp, "debian", "patches", name))
            log(f"applied {len(fixes) - len(fixups)} Debian fixes and "
                f"{len(fixups)} fix-ups of ours")
        if os.path.exists(stamp):
            os.unlink(stamp)
        if os.path.isdir(lay.base):
            shutil.rmtree(lay.base)
        os.rename(top, lay.base)
        with open(stamp, "w") as f:
            f.write(key)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def inputs_key(lay, pristine):
    """A digest of everything a materialized tree is made from, links aside."""
    h = hashlib.sha256()
    h.update(open(os.path.join(lay.build, "base.stamp"), "rb").read())
    h.update(base_mode(pristine).encode())
    for rel in lay.patch_files():
        h.update(rel.encode() + b"\0")
        h.update(open(os.path.join(lay.patches, rel), "rb").read())
    return h.hexdigest()


def is_derived(lay, rel):
    """Whether a build/src entry is made from the tree rather than part of
    it: generated by the build or materialize, or written by Python at run
    time where upstream ships nothing."""
    return (matches(rel, BUILD_GENERATED) or rel in AUTOCONF_GENERATED
            or (matches(rel, RUNTIME_ARTIFACTS)
                and not os.path.lexists(os.path.join(lay.base, rel))))


def top_dirs(tree):
    return {n for n in os.listdir(tree)
            if os.path.isdir(os.path.join(tree, n))}


def stage_tree(lay, dest, pristine):
    """Build the wanted tree in dest: base + patches + links + configure."""
    run(["cp", "-a", lay.base + "/.", dest])
    for rel in lay.patch_files():
        apply_patch(dest, os.path.join(lay.patches, rel),
                    fuzz=2 if pristine else 0)
    link_own_files(lay, dest)
    regen_autoconf(lay, dest)


def link_own_files(lay, tree):
    """Link every file of ours into tree; drop links to files now gone."""
    base_dirs = top_dirs(lay.base)
    wanted = lay.own_files(base_dirs)
    for rel in wanted:
        if os.path.lexists(os.path.join(lay.base, rel)):
            raise Error(
                f"{rel} exists upstream: change it through a patch (edit "
                f"build/src/{rel}, then 'make export'), do not add a copy")
        path = os.path.join(tree, rel)
        target = os.path.relpath(os.path.join(lay.repo, rel),
                                 os.path.dirname(path))
        if os.path.islink(path) and os.readlink(path) == target:
            continue
        os.makedirs(os.path.dirname(path), exist_ok=True)
        if os.path.lexists(path):
            os.unlink(path)
        os.symlink(target, path)
    wanted = set(wanted)
    for rel in walk(tree):
        path = os.path.join(tree, rel)
        if os.path.islink(path) and rel not in wanted and \
                is_own_link(lay, tree, rel):
            os.unlink(path)


def is_own_link(lay, tree, rel):
    path = os.path.join(tree, rel)
    if not os.path.islink(path):
        return False
    target = os.path.normpath(os.path.join(os.path.dirname(path),
                                           os.readlink(path)))
    return target == os.path.join(lay.repo, rel)


def regen_autoconf(lay, tree):
    """Regenerate configure and pyconfig.h.in when configure.ac is patched.

    Outputs are rewritten only when they change, so that the build reruns
    configure only then.
    """
    if same_file(os.path.join(tree, "configure.ac"),
                 os.path.join(lay.base, "configure.ac")):
        source = lay.base                 # upstream's outputs
    else:
        source = os.path.join(lay.build, "autoconf-cache",
                              sha256_file(os.path.join(tree, "configure.ac")))
    if not os.path.isdir(source):
        log("regenerating configure (autoreconf)")
        before = set(walk(tree))
        run(["autoreconf", "-i"], cwd=tree)
        shutil.rmtree(os.path.join(tree, "autom4te.cache"), ignore_errors=True)
        for rel in set(walk(tree)) - before:    # backups such as configure~
            if rel not in AUTOCONF_GENERATED:
                os.unlink(os.path.join(tree, rel))
        tmp = tempfile.mkdtemp(prefix="autoconf.", dir=lay.build)
        for name in AUTOCONF_GENERATED:
            shutil.copy2(os.path.join(tree, name), tmp)
        # One entry is enough: the cache only spares reruns of autoreconf.
        shutil.rmtree(os.path.dirname(source), ignore_errors=True)
        os.makedirs(os.path.dirname(source))
        os.rename(tmp, source)
    for name in AUTOCONF_GENERATED:
        if not same_file(os.path.join(source, name), os.path.join(tree, name)):
            shutil.copy2(os.path.join(source, name), os.path.join(tree, name))


def tracked_entries(lay, tree):
    """{path: id} of a tree's entries, leaving out generated files."""
    return {rel: entry_id(os.path.join(tree, rel)) for rel in walk(tree)
            if not is_derived(lay, rel)}


def load_state(lay):
    try:
        with open(lay.state) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def save_state(lay, pristine):
    state = {"inputs": inputs_key(lay, pristine),
             "pristine": pristine,
             "entries": tracked_entries(lay, lay.src)}
    tmp = lay.state + ".tmp"
    with open(tmp, "w") as f:
        json.dump(state, f)
    os.replace(tmp, lay.state)


def unexported_edits(lay):
    """Entries of build/src that differ from what was last materialized.

    Links to our own files are left out: they are the repository's files.
    """
    state = load_state(lay)
    if state is None or not os.path.isdir(lay.src):
        return []
    old = state["entries"]
    new = {rel: ident for rel, ident in tracked_entries(lay, lay.src).items()
           if not is_own_link(lay, lay.src, rel)}
    old = {rel: ident for rel, ident in old.items()
           if not (ident.startswith("->") and
                   os.path.normpath(os.path.join(
                       lay.src, os.path.dirname(rel), ident[2:]))
                   == os.path.join(lay.repo, rel))}
    return sorted(rel for rel in set(old) | set(new)
                  if old.get(rel) != new.get(rel))


def materialize(lay, pristine=False, force=False, tarball=None,
                debian_tarball=None):
    """Bring build/src to base + patches + our files.

    Only entries whose content changes are rewritten, so an incremental
    build afterwards recompiles only what the change touches.
    """
    require_tools(debian_fixes=not pristine)
    edits = unexported_edits(lay)
    if edits and not force:
        raise Error(
            "build/src has edits that were not exported:\n  "
            + "\n  ".join(edits[:20])
            + ("\n  ..." if len(edits) > 20 else "")
            + "\nRun 'make export' (Tools/sightglass/sgtree.py export) to "
            "keep them in patches/, or materialize --force to drop them.")
    make_base(lay, pristine, tarball, debian_tarball)
    stage = tempfile.mkdtemp(prefix="stage.", dir=lay.build)
    try:
        stage_tree(lay, stage, pristine)
        os.makedirs(lay.src, exist_ok=True)
        wanted = set(walk(stage))
        for rel in sorted(wanted):
            new, cur = os.path.join(stage, rel), os.path.join(lay.src, rel)
            if matches(rel, BUILD_GENERATED) and os.path.exists(cur):
                continue    # the build keeps it current
            if os.path.lexists(cur) and same_file(new, cur):
                continue
            os.makedirs(os.path.dirname(cur), exist_ok=True)
            if os.path.isdir(cur) and not os.path.islink(cur):
                shutil.rmtree(cur)
            elif os.path.lexists(cur):
                os.unlink(cur)
            os.rename(new, cur)
        for rel in walk(lay.src):
            if rel not in wanted and not is_derived(lay, rel):
                os.unlink(os.path.join(lay.src, rel))
    finally:
        shutil.rmtree(stage, ignore_errors=True)
    save_state(lay, pristine)


def sync(lay):
    """Re-materialize if the inputs changed, else only refresh our links."""
    state = load_state(lay)
    if state is None:
        raise Error("build/src is not materialized yet: run ./configure")
    pristine = state["pristine"]
    if os.path.exists(os.path.join(lay.build, "base.stamp")) and \
            inputs_key(lay, pristine) == state["inputs"]:
        link_own_files(lay, lay.src)
        regen_autoconf(lay, lay.src)    # configure.ac may be edited in place
        return
    log("patches changed: re-materializing build/src")
    materialize(lay, pristine)


def export(lay):
    """Write build/src's edits into patches/; adopt files created there."""
    written, adopted = set(), []
    base_dirs = top_dirs(lay.base)
    src_entries = set(walk(lay.src))
    for rel in sorted(src_entries | set(walk(lay.base))):
        if is_derived(lay, rel):
            continue
        src = os.path.join(lay.src, rel)
        base = os.path.join(lay.base, rel)
        if is_own_link(lay, lay.src, rel):
            continue
        if not os.path.lexists(base):
            if rel.split("/", 1)[0] not in base_dirs or os.path.islink(src):
                raise Error(f"build/src/{rel}: new entry outside the CPython "
                            "directories, or a foreign link; move it by hand")
            dest = os.path.join(lay.repo, rel)
            if os.path.exists(dest):
                raise Error(f"build/src/{rel} is new, but {rel} already "
                            "exists in the repository")
            os.makedirs(os.path.dirname(dest), exist_ok=True)
            shutil.move(src, dest)
            adopted.append(rel)
            continue
        if os.path.lexists(src) and same_file(src, base):
            continue
        diff = unified_diff(rel, base, src if os.path.lexists(src) else None)
        out = os.path.join(lay.patches, rel + ".diff")
        written.add(rel + ".diff")
        os.makedirs(os.path.dirname(out), exist_ok=True)
        if not (os.path.exists(out) and open(out, "rb").read() == diff):
            with open(out, "wb") as f:
                f.write(diff)
            log(f"exported patches/{rel}.diff")
    for rel in lay.patch_files():
        if rel not in written:
            os.unlink(os.path.join(lay.patches, rel))
            log(f"removed patches/{rel} (no edit left)")
    for dirpath, dirnames, filenames in os.walk(lay.patches, topdown=False):
        if dirpath != lay.patches and not os.listdir(dirpath):
            os.rmdir(dirpath)
    if adopted:
        link_own_files(lay, lay.src)
        for rel in adopted:
            log(f"moved build/src/{rel} into the repository (now a link)")
    save_state(lay, load_state(lay)["pristine"])


def unified_diff(rel, old_path, new_path):
    """A unified diff of one file, as bytes, labelled a/rel and b/rel."""
    def lines(path):
        if path is None:
            return []
        with open(path, "rb") as f:
            data = f.read()
        if b"\0" in data:
            raise Error(f"{rel}: binary files cannot be patched")
        return data.decode("utf-8", "surrogateescape").splitlines(True)
    old, new = lines(old_path), lines(new_path)
    out = []
    for line in difflib.unified_diff(old, new, "a/" + rel, "b/" + rel, n=3):
        if not line.endswith("\n"):
            line += "\n\\ No newline at end of file\n"
        out.append(line)
    return "".join(out).encode("utf-8", "surrogateescape")


# --- configure --------------------------------------------------------------

ROOT_MAKEFILE = """\
# Generated by Sightglass's ./configure: do not edit.  Every target goes to
# the build directory, after build/src is brought up to date with patches/
# and our files.
PYTHON3 = {python3}
SGTREE = $(PYTHON3) Tools/sightglass/sgtree.py
BUILDDIR = {obj}
REGEN_STAMP = $(BUILDDIR)/.sightglass-regen

all: sync regen
\t+$(MAKE) -C $(BUILDDIR) all
\tln -sfn $(BUILDDIR)/python$(EXE) python

sync:
\t@$(SGTREE) sync

# What the build regenerates inside the source tree (Argument Clinic, the
# opcode tables): only when a C file or Lib/opcode.py changed since last time.
regen: sync
\t@if [ ! -e $(REGEN_STAMP) ] || [ -n "$$(find -L build/src/Modules \\
\t    build/src/Objects build/src/Python build/src/Lib/opcode.py \\
\t    -newer $(REGEN_STAMP) \\( -name '*.c' -o -name opcode.py \\) \\
\t    -print -quit)" ]; then \\
\t  $(MAKE) -C $(BUILDDIR) regen-opcode regen-opcode-targets clinic \\
\t  && touch $(REGEN_STAMP); fi

status export:
\t@$(SGTREE) $@

Makefile: ;

%: sync
\t+$(MAKE) -C $(BUILDDIR) $@

.PHONY: all sync regen export status
"""


def configure_build_dir(lay, obj, args):
    """Run build/src's configure in the build directory obj."""
    os.makedirs(obj, exist_ok=True)
    env = dict(os.environ)
    cc = c_compiler()
    if "CC" not in env and cc and shutil.which("ccache"):
        env["CC"] = "ccache " + cc
    pristine = load_state(lay)["pristine"]
    cmd = [os.path.relpath(os.path.join(lay.src, "configure"), obj)]
    cmd += list(args) + [f"SIGHTGLASS_BASE={base_name(pristine)}"]
    return subprocess.call(cmd, cwd=obj, env=env)


def configure(lay, argv):
    ours = argparse.ArgumentParser(add_help=False)
    ours.add_argument("--with-upstream-tarball", metavar="PATH")
    ours.add_argument("--with-debian-fixes", metavar="PATH")
    ours.add_argument("--without-debian-fixes", action="store_true")
    opts, rest = ours.parse_known_args(argv)
    wants_help = any(a in ("--help", "-h") or a.startswith("--help=")
                     for a in rest)
    if wants_help:
        print(__doc__.split("\n\n")[0])
        print("Sightglass options (the rest go to CPython's configure):\n"
              "  --with-upstream-tarball=PATH  use this Python-3.11.2.tgz\n"
              "  --with-debian-fixes=PATH      use this "
              + read_pins()["debian_tarball"] + "\n"
              "  --without-debian-fixes        build pristine 3.11.2, "
              "WITHOUT security fixes\n", flush=True)
    pristine = opts.without_debian_fixes
    require_tools(debian_fixes=not pristine, build=True)
    state = load_state(lay)
    if state is not None and state["pristine"] != pristine:
        # Switching bases: every file may change, so start the build over.
        shutil.rmtree(lay.obj, ignore_errors=True)
    materialize(lay, pristine, tarball=opts.with_upstream_tarball,
                debian_tarball=opts.with_debian_fixes)
    rc = configure_build_dir(lay, lay.obj, rest)
    if rc or wants_help:
        return rc
    python3 = os.environ.get("PYTHON3") or sys.executable
    with open(os.path.join(lay.repo, "Makefile"), "w") as f:
        f.write(ROOT_MAKEFILE.format(
            python3=python3, obj=os.path.relpath(lay.obj, lay.repo)))
    return 0


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--build", help="build directory (default: build/)")
    sub = p.add_subparsers(dest="cmd", required=True)
    f = sub.add_parser("fetch", help="get and verify the pinned tarballs")
    f.add_argument("--with-upstream-tarball", metavar="PATH")
    f.add_argument("--with-debian-fixes", metavar="PATH")
    f.add_argument("--without-debian-fixes", action="store_true")
    m = sub.add_parser("materialize", help="build base and src trees")
    m.add_argument("--force", action="store_true",
                   help="drop unexported edits in build/src")
    m.add_argument("--without-debian-fixes", action="store_true")
    sub.add_parser("sync", help="re-materialize if inputs changed")
    sub.add_parser("export", help="write build/src's edits to patches/")
    sub.add_parser("status", help="list unexported edits")
    c = sub.add_parser("configure", add_help=False)
    c.add_argument("args", nargs=argparse.REMAINDER)

    if argv is None:
        argv = sys.argv[1:]
    if argv[:1] == ["configure"]:
        return configure(Layout(), argv[1:])
    ns = p.parse_args(argv)
    lay = Layout(build=ns.build)
    try:
        if ns.cmd == "fetch":
            for path in fetch(ns.with_upstream_tarball, ns.with_debian_fixes,
                              not ns.without_debian_fixes).values():
                print(path)
        elif ns.cmd == "materialize":
            materialize(lay, ns.without_debian_fixes, ns.force)
        elif ns.cmd == "sync":
            sync(lay)
        elif ns.cmd == "export":
            export(lay)
        elif ns.cmd == "status":
            edits = unexported_edits(lay)
            print("\n".join(edits) if edits else "no unexported edits")
    except Error as exc:
        log(str(exc))
        return 1
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except Error as exc:
        log(str(exc))
        sys.exit(1)
