"""The workloads every Sightglass overhead is measured on.

Each is a function taking no argument that does a fixed amount of work, of
one kind: the kinds of ../shared/ANCHORS.md section 2, so that our ratios
stand beside the ones measured there, and `build`, a heap growing into
memory that held other objects before, which is the memory tracking's
costliest case.  Runs on any CPython 3.8 or later.
"""


def fib():
    """Recursive calls: a Python call per unit of work."""
    def f(n):
        return n if n < 2 else f(n - 1) + f(n - 2)
    f(22)


class _Point:
    def __init__(self, x):
        self.x = x

    def get(self):
        return self.x

    def add(self, other):
        return self.x + other.get()


def methods():
    """Small method calls on instances."""
    p, q = _Point(1), _Point(2)
    total = 0
    for _ in range(60_000):
        total += p.add(q) + q.get()
    return total


def loop():
    """Arithmetic without calls: what call events must not slow down."""
    total = 0
    for i in range(400_000):
        total += i * i % 7
        if total > 1_000_000:
            total -= 1_000_000
    return total


def builtins():
    """Calls to C functions and methods."""
    data = list(range(50))
    out = 0
    for _ in range(20_000):
        out += len(data) + max(3, 4) + abs(-5)
        data.append(1)
        data.pop()
    return out


def gens():
    """Generator resumes and yields."""
    def gen(n):
        for i in range(n):
            yield i
    total = 0
    for _ in range(300):
        total += sum(gen(500))
    return total


def exc():
    """Raise and catch in Python code."""
    def fail(i):
        raise ValueError(i)
    caught = 0
    for i in range(40_000):
        try:
            fail(i)
        except ValueError:
            caught += 1
    return caught


class _Node:
    def __init__(self, i):
        self.i = i
        self.tags = {"k": i}


def alloc():
    """Objects, dicts, lists and tuples made and dropped."""
    keep = []
    for i in range(40_000):
        keep.append((_Node(i), [i, i], {"a": i}))
        if len(keep) > 1000:
            keep.clear()
    return len(keep)


def build():
    """A table of records built up, in blocks that held other objects, and
    dropped."""
    rows = [(i, str(i), {"id": i}) for i in range(30_000)]
    return len(rows)


ALL = {f.__name__: f for f in (fib, methods, loop, builtins, gens, exc,
                               alloc, build)}
