"""Build stock CPython 3.11.2 (the pinned tarball, nothing applied) in
build/stock, the reference every "vs stock 3.11.2" ratio is measured
against.  Same compiler and default options as a Sightglass build.

  python3 bench/build_stock.py        # then: build/stock/python
"""

import os
import shutil
import subprocess
import sys

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(REPO, "Tools", "sightglass"))
import sgtree  # noqa: E402


def main():
    stock = os.path.join(REPO, "build", "stock")
    python = os.path.join(stock, "python")
    if not os.path.exists(python):
        tarball = sgtree.fetch(with_debian=False)["tarball"]
        shutil.rmtree(stock, ignore_errors=True)
        os.makedirs(stock)
        subprocess.run(["tar", "-xzf", tarball, "-C", stock,
                        "--strip-components=1"], check=True)
        env = dict(os.environ)
        if "CC" not in env and shutil.which("ccache"):
            env["CC"] = "ccache gcc"
        subprocess.run(["./configure"], cwd=stock, env=env, check=True,
                       stdout=subprocess.DEVNULL)
        subprocess.run(["make", "-j2"], cwd=stock, check=True,
                       stdout=subprocess.DEVNULL)
    print(python)


if __name__ == "__main__":
    main()
