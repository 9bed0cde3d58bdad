"""The workloads every Sightglass overhead is measured on.

Each is a function taking no argument that does a fixed amount of work.
Two sets:

- kinds: work of one kind each, the kinds of ../shared/ANCHORS.md
  section 2, so that our ratios stand beside the ones measured there; and
  `build`, a heap growing into memory that held other objects before,
  which is the memory tracking's costliest case.
- programs: small programs of the sorts pyperformance times (serialising,
  copying, simulating, text, trees), each mixing allocation with the work
  around it, as applications do.

Runs on any CPython 3.8 or later.
"""

import copy
import heapq
import json
import pickle


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


def _records(n):
    return [{"id": i, "name": f"user{i}", "score": i * 0.5,
             "tags": ["a", "b", str(i % 7)], "active": i % 3 == 0}
            for i in range(n)]


def json_io():
    """Records to JSON text and back."""
    text = json.dumps(_records(2_000))
    return len(json.loads(text))


class _Entry:
    """An instance with a key and a value, for the programs to carry."""
    def __init__(self, key, value):
        self.key = key
        self.value = value


def deepcopy():
    """copy.deepcopy of nested containers and instances."""
    config = {f"section{i}": {"items": [(j, str(j)) for j in range(10)],
                              "setting": _Entry(f"s{i}", [i, i + 1]),
                              "limits": {"low": i, "high": i * 2}}
              for i in range(100)}
    return len(copy.deepcopy(config))


def pickle_io():
    """Instances, tuples and dicts through pickle and back."""
    orders = [_Entry(i, [(f"item{j}", j, j * 1.25) for j in range(5)])
              for i in range(1_000)]
    data = pickle.dumps({"orders": orders, "count": len(orders)})
    return len(pickle.loads(data)["orders"])


class _Job:
    __slots__ = ("name", "work", "done")

    def __init__(self, name, work):
        self.name = name
        self.work = work
        self.done = 0


def sched():
    """An event queue: jobs run in slices, events made and dropped."""
    queue = [(0.0, i, _Job(f"job{i}", 10 + i % 13)) for i in range(200)]
    heapq.heapify(queue)
    seq = len(queue)
    finished = 0
    while queue:
        now, _, job = heapq.heappop(queue)
        job.done += 1
        if job.done < job.work:
            seq += 1
            heapq.heappush(queue, (now + 0.5 + job.done * 0.1, seq, job))
        else:
            finished += 1
    return finished


class _Vector:
    def __init__(self, x, y, z):
        self.x, self.y, self.z = x, y, z

    def scaled(self, k):
        return _Vector(self.x * k, self.y * k, self.z * k)

    def norm(self):
        return (self.x * self.x + self.y * self.y + self.z * self.z) ** 0.5


def points():
    """Float arithmetic on small objects, each step making new ones."""
    total = 0.0
    for i in range(10_000):
        v = _Vector(i * 0.5, i * 0.25, 1.0).scaled(0.1)
        total += v.norm()
    return total


_TEXT = "\n".join(
    f"Line {i}: the profiler saw {i % 17} samples, the heap grew by "
    f"{i % 5} blocks; the tracer, busy, dropped {i % 3} events."
    for i in range(400))


def words():
    """Word counts of a text, and a report of the commonest."""
    counts = {}
    for line in _TEXT.splitlines():
        for word in line.split():
            word = word.strip(",.;").lower()
            counts[word] = counts.get(word, 0) + 1
    common = sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))
    return "\n".join(f"{word:>12} {n}" for word, n in common)


def sort():
    """Records sorted on a key of several fields."""
    rows = [(f"name{(i * 7919) % 5_000}", (i * 31) % 97, i)
            for i in range(5_000)]
    return sorted(rows, key=lambda r: (r[1], r[0]))[0]


def trees():
    """Binary trees of tuples built, checked and dropped."""
    def make(depth):
        if depth == 0:
            return (None, depth)
        return (make(depth - 1), make(depth - 1))

    def check(node):
        left, right = node
        return 1 if left is None else 1 + check(left) + check(right)
    # 8191 tuples a tree: more than the tuple free list keeps.
    return check(make(12)) + check(make(12))


_KINDS = (fib, methods, loop, builtins, gens, exc, alloc, build)
_PROGRAMS = (json_io, deepcopy, pickle_io, sched, points, words, sort, trees)
ALL = {f.__name__: f for f in _KINDS + _PROGRAMS}
SETS = {"kinds": [f.__name__ for f in _KINDS],
        "programs": [f.__name__ for f in _PROGRAMS]}


def add_arguments(parser):
    """The choice of workloads, as every tool here takes it."""
    parser.add_argument("--workload", action="append", choices=sorted(ALL),
                        help="one workload (repeatable); default: a set")
    parser.add_argument("--set", choices=sorted(SETS), default="kinds",
                        help="the set of workloads (default: kinds)")


def chosen(ns):
    """The workloads add_arguments' options chose."""
    return ns.workload or SETS[ns.set]
