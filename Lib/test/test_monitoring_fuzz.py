"""A random-operation fuzzer for sys.monitoring.

A seed makes a list of operations (JSON lists, so that a list can be saved
and replayed): tools claimed, freed and cleared, events set globally and
per code object, callbacks registered with a plan of what to do when called,
markers, trace and profile functions, and runs of a corpus of code shapes.
A child interpreter runs the list and checks invariants after each
operation, so that a crash is caught too; a failing list is shrunk by
re-running children on smaller lists.

    ./python -m test.test_monitoring_fuzz --seconds 600 [--seed N]

runs seeds until the time is up (or seed N alone) and prints each failure
with its shrunk list.  The harness (Fuzzer) serves test_memtrack_fuzz too.
"""

import argparse
import collections
import dis
import itertools
import json
import random
import subprocess
import sys
import threading
import time
import types
import unittest

M = sys.monitoring
E = M.events
TOOLS = range(6)
EVENT_NAMES = [
    "PY_START", "PY_RESUME", "PY_RETURN", "PY_YIELD", "CALL", "LINE",
    "INSTRUCTION", "JUMP", "BRANCH", "STOP_ITERATION", "RAISE",
    "EXCEPTION_HANDLED", "PY_UNWIND", "PY_THROW", "RERAISE", "C_RETURN",
    "C_RAISE", "BRANCH_LEFT", "BRANCH_RIGHT", "MARKER",
]
LOCAL_EVENTS = {
    "PY_START", "PY_RESUME", "PY_RETURN", "PY_YIELD", "CALL", "LINE",
    "INSTRUCTION", "JUMP", "BRANCH", "BRANCH_LEFT", "BRANCH_RIGHT",
    "STOP_ITERATION", "MARKER",
}
LOCAL_MASK = sum(getattr(E, name) for name in LOCAL_EVENTS)
CALL_GROUP = E.CALL | E.C_RETURN | E.C_RAISE
EXCEPTION_EVENTS = {"STOP_ITERATION", "RAISE", "EXCEPTION_HANDLED",
                    "PY_UNWIND", "PY_THROW", "RERAISE"}
# Events at an instruction's own offset (RAISE may be at a CALL's cache).
INSTRUCTION_EVENTS = {"PY_START", "PY_RESUME", "PY_RETURN", "PY_YIELD",
                      "CALL", "INSTRUCTION", "JUMP", "BRANCH", "BRANCH_LEFT",
                      "BRANCH_RIGHT", "MARKER", "C_RETURN", "C_RAISE"}
TWO_ARG_EVENTS = {"PY_START", "PY_RESUME", "LINE", "INSTRUCTION", "MARKER"}
# A debug build runs regrtest modules under -R 3:3, seven times over.
DEBUG_BUILD = hasattr(sys, "gettotalrefcount")
NESTING_CHECK = "callback_nesting"


# --- the generic harness: children, shrinking, the command line ----------

class Fuzzer:
    """Runs operation lists in child interpreters and shrinks failures.

    module is the fuzz module's import name: its child mode reads a JSON
    list of operations on stdin and prints one JSON line, {"ok": true} or
    {"check": name, "op": index, "detail": text}; a violation exits 3.
    generate(rng, n) makes n operations; describe(op) prints one.
    """

    def __init__(self, module, generate, describe, timeout=60):
        self.module = module
        self.generate = generate
        self.describe = describe
        self.timeout = timeout

    def run(self, ops, child_args=()):
        """Run ops in a child: None if all went well, else a signature
        (what went wrong, comparable between runs) and a detail text."""
        cmd = [sys.executable, "-X", "faulthandler", "-m", self.module,
               "--child", *child_args]
        for attempt in range(30):
            try:
                proc = subprocess.run(cmd, input=json.dumps(ops),
                                      capture_output=True, text=True,
                                      timeout=self.timeout)
                break
            except subprocess.TimeoutExpired:
                return ("timeout",), f"no answer in {self.timeout} s"
            except PermissionError:
                # The interpreter is being rebuilt: wait for the new one.
                time.sleep(1)
        else:
            raise RuntimeError(f"cannot run {sys.executable}")
        lines = proc.stdout.strip().splitlines()
        try:
            report = json.loads(lines[-1]) if lines else {}
        except ValueError:
            report = {}
        if proc.returncode == 0 and report.get("ok"):
            return None
        if proc.returncode == 3 and "check" in report:
            return (("violation", report["check"]),
                    f"op {report['op']}: {report['detail']}")
        tail = "\n".join(proc.stderr.strip().splitlines()[-25:])
        return ("exit", proc.returncode), tail

    def shrink(self, ops, signature, child_args=(), budget=120.0):
        """The smallest list found in budget seconds that fails the same
        way: the shortest failing prefix, then chunks and single operations
        removed while it still fails."""
        deadline = time.monotonic() + budget

        def fails(candidate):
            if time.monotonic() > deadline:
                return False
            result = self.run(candidate, child_args)
            return result is not None and result[0] == signature

        # A failing run stops at the operation that failed; the operations
        # after it play no part, but bisect for crashes and flaky ends.
        low, high = 0, len(ops)
        while low + 1 < high:
            mid = (low + high) // 2
            if fails(ops[:mid]):
                high = mid
            else:
                low = mid
        ops = reduce(ops[:high], fails)
        # Then the operations of the threads of an operation that runs
        # several lists of operations at once.
        for index in range(len(ops)):
            if not is_nested(ops[index]):
                continue
            for k in range(len(ops[index][-1])):
                def replaced(sub, index=index, k=k):
                    op = ops[index]
                    lists = op[-1][:k] + [sub] + op[-1][k + 1:]
                    return ops[:index] + [op[:-1] + [lists]] + ops[index + 1:]
                sub = reduce(ops[index][-1][k],
                             lambda sub: fails(replaced(sub)))
                ops = replaced(sub)
        return ops

    def check_seed(self, seed, nops, child_args=(), budget=120.0):
        """None, or a report of the failure of seed, with the shrunk list."""
        ops = self.generate(random.Random(seed), nops)
        result = self.run(ops, child_args)
        if result is None:
            return None
        signature, detail = result
        small = self.shrink(ops, signature, child_args, budget)
        again = self.run(small, child_args)
        if again is not None and again[0] == signature:
            detail = again[1]
        else:
            detail += "\n(flaky: the shrunk list passed when run again)"
        lines = [f"seed {seed} ({nops} operations): {signature}",
                 detail, f"shrunk to {len(small)} operations:"]
        lines += ["    " + self.describe(op) for op in small]
        lines.append("as JSON (--replay): " + json.dumps(small))
        return "\n".join(lines)

    def first_failure(self, seeds, nops):
        """The report of the first of seeds that fails, or None: one is
        enough, since shrinking it takes a while."""
        for seed in seeds:
            report = self.check_seed(seed, nops, budget=60)
            if report:
                return report
        return None

    def main(self, argv, child, default_nops):
        """The command line; the exit status, 1 if a seed failed."""
        parser = argparse.ArgumentParser(prog=f"python -m {self.module}")
        parser.add_argument("--seconds", type=float, default=60)
        parser.add_argument("--seed", type=int,
                            help="run this seed only")
        parser.add_argument("--ops", type=int, default=default_nops,
                            help="operations per seed")
        parser.add_argument("--replay", metavar="FILE",
                            help="run the JSON list of operations in FILE")
        parser.add_argument("--shrink-seconds", type=float, default=300)
        parser.add_argument("--skip-check", action="append", default=[],
                            metavar="NAME", help="do not check NAME")
        parser.add_argument("--child", action="store_true",
                            help=argparse.SUPPRESS)
        args = parser.parse_args(argv)
        if args.child:
            sys.exit(child(json.load(sys.stdin), set(args.skip_check)))
        child_args = [a for name in args.skip_check
                      for a in ("--skip-check", name)]
        if args.replay:
            with open(args.replay) as f:
                ops = json.load(f)
            result = self.run(ops, child_args)
            print("ok" if result is None else result)
            return 0 if result is None else 1
        if args.seed is not None:
            seeds = [args.seed]
        else:
            seeds = (random.randrange(2**32) for _ in itertools.count())
        deadline = time.monotonic() + args.seconds
        runs = failures = 0
        for seed in seeds:
            if args.seed is None and time.monotonic() > deadline:
                break
            report = self.check_seed(seed, args.ops, child_args,
                                     args.shrink_seconds)
            runs += 1
            if report:
                failures += 1
                print(report, "\n", flush=True)
        print(f"{runs} seeds, {failures} failed")
        return 1 if failures else 0


def reduce(items, fails):
    """items with chunks, then single items, left out while fails(what is
    left) stays true."""
    chunk = max(1, len(items) // 2)
    while chunk >= 1:
        i = 0
        while i < len(items):
            candidate = items[:i] + items[i + chunk:]
            if candidate and fails(candidate):
                items = candidate
            else:
                i += chunk
        chunk //= 2
    return items


def is_nested(op):
    """Whether op's last argument is lists of operations (for threads)."""
    return (isinstance(op[-1], list) and op[-1] and
            all(isinstance(sub, list) and sub and
                all(isinstance(o, list) for o in sub) for sub in op[-1]))


# --- the corpus of code shapes -------------------------------------------

def big_function_source(lines=300):
    """A function with more than 256 constants and jumps over more than 256
    instructions, forward and back: EXTENDED_ARG everywhere."""
    body = "".join(f"            total += {1000 + i}\n" for i in range(lines))
    return ("def big(n):\n"
            "    total = 0\n"
            "    while n > 0:\n"
            "        n -= 1\n"
            "        if n % 2:\n"
            f"{body}"
            "        else:\n"
            "            total -= 1\n"
            "    return total\n")


CORPUS_SOURCE = '''
def loops(n):
    total = 0
    for i in range(n):
        if i % 3 == 0:
            continue
        total += i
        if total > 50:
            break
    while n > 0:
        n -= 1
        total ^= n
    else:
        total += 1
    return total and (total > 3 or n)


def handlers(n):
    try:
        try:
            if n % 2:
                raise KeyError(n)
            return 1 / (n - 4)
        except KeyError as exc:
            raise ValueError(n) from exc
        finally:
            n += 1
    except (ValueError, ZeroDivisionError):
        return -n
    else:
        return n


class Manager:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return exc[0] is ZeroDivisionError


def withs(n):
    with Manager():
        with Manager() as m:
            n = 1 / (n - 2)
    return n, m


def gen(n):
    try:
        for i in range(n):
            x = yield i
            if x:
                yield from range(x)
    except KeyError:
        yield "caught"
    finally:
        n = 0
    return n


def drive_gen(n):
    g = gen(n)
    out = [next(g), g.send(2), next(g), g.throw(KeyError)]
    g.close()
    out.extend(gen(3))
    g = gen(4)
    next(g)
    try:
        g.throw(ValueError)
    except ValueError:
        pass
    return out


class Later:
    def __await__(self):
        return (yield "later")


async def coro(n):
    total = 0
    for i in range(n):
        total += await Later() or i
    return total


async def agen(n):
    for i in range(n):
        try:
            yield await Later()
        except KeyError:
            yield -1


def step(awaitable, value=None):
    try:
        return awaitable.send(value)
    except StopIteration as exc:
        return exc.value


def drive_async(n):
    c = coro(n)
    try:
        step(c)
        for i in range(n):
            step(c, i)
    finally:
        c.close()
    a = agen(n)
    out = []
    try:
        s = a.asend(None)
        out.append(step(s))
        out.append(step(s, 5))
        s = a.athrow(KeyError)
        out.append(step(s))
        out.append(step(a.asend(None)))
    finally:
        step(a.aclose())
    return out


def comps(n):
    a = [i * i for i in range(n) if i % 2]
    b = {i: j for i, j in zip(a, range(n))}
    c = {x for x in b.values()}
    return a, b, c, sum(x for x in c), list(map(lambda x: x + 1, a))


class Point:
    __match_args__ = ("x", "y")

    def __init__(self, x, y):
        self.x, self.y = x, y


def matcher(n):
    out = []
    for v in (0, [n, 1, 2], {"k": n}, Point(0, n), "s", 2.5, Point(n, 0)):
        match v:
            case 0 | 1:
                out.append("small")
            case [x, *rest] if x > 0:
                out.append(rest)
            case {"k": k}:
                out.append(k)
            case Point(0, y):
                out.append(y)
            case str() as s:
                out.append(s)
            case _:
                out.append(None)
    return out


def fib(n):
    return n if n < 2 else fib(n - 1) + fib(n - 2)


def classes(n):
    def outer():
        k = n
        class Local:
            a = k
            def method(self):
                return self.a + k
        return Local().method()
    return outer()


EXEC_SOURCE = """
total = 0
for i in range(4):
    try:
        total += 10 // (i - 2)
    except ZeroDivisionError:
        total -= 1
"""


def execs(n):
    ns = {}
    exec(compile(EXEC_SOURCE, "<fuzz-exec>", "exec"), ns)
    return ns["total"]


def builtins_calls(n):
    items = sorted([n, 3, 1], key=abs)
    try:
        int("x")
    except ValueError:
        pass
    return len(items), max(items), "".join(map(str, items))
''' + big_function_source()

# Each entry calls corpus functions with a small argument.
DRIVERS = {
    "loops": "loops", "handlers": "handlers", "withs": "withs",
    "generators": "drive_gen", "async": "drive_async", "comps": "comps",
    "match": "matcher", "fib": "fib", "classes": "classes",
    "exec": "execs", "builtins": "builtins_calls", "big": "big",
}


def load_corpus():
    ns = {"__name__": "fuzz_corpus"}
    exec(compile(CORPUS_SOURCE, "<fuzz-corpus>", "exec"), ns)
    codes = {}
    todo = [ns[name].__code__ for name in ns
            if isinstance(ns[name], types.FunctionType)]
    while todo:
        code = todo.pop()
        if code.co_qualname not in codes:
            codes[code.co_qualname] = code
            todo.extend(c for c in code.co_consts
                        if isinstance(c, types.CodeType))
    return ns, codes


_, CODE_NAMES = load_corpus()
CODE_NAMES = sorted(CODE_NAMES)


# --- generating operations -----------------------------------------------

def random_mask(rng, names=EVENT_NAMES, likely=()):
    """Mostly of the events in likely, if any."""
    if likely and rng.random() < 0.8:
        names = sorted(likely)
    mask = 0
    for name in rng.sample(names, min(len(names), rng.choice([1, 1, 2, 3]))):
        mask |= getattr(E, name)
    if mask & (E.C_RETURN | E.C_RAISE) and rng.random() < 0.9:
        mask |= CALL_GROUP      # else it is refused: checked too
    return mask


def random_action(rng, trace=False):
    # Weights: what ends a tool's work (free, clear) is rarer, so that
    # callbacks get to run together.
    actions = {"none": 16, "raise": 2, "call": 2, "events": 3, "free": 1,
               "clear": 1, "use": 2, "restart": 2, "marker": 2}
    if not trace:
        actions.update(disable=6, free_self=1, clear_self=1, reregister=2,
                       unregister=1, local=3, lineno=4)
    kind = rng.choices(list(actions), list(actions.values()))[0]
    if kind in ("free", "clear", "use"):
        return f"{kind}:{rng.choice(TOOLS)}"
    if kind == "call":
        return "call:" + rng.choice(sorted(DRIVERS))
    if kind == "events":
        return f"events:{rng.choice(TOOLS)}:{random_mask(rng)}"
    if kind == "local":
        return f"local:{random_mask(rng, sorted(LOCAL_EVENTS))}"
    if kind in ("lineno", "marker"):
        return f"{kind}:{rng.randrange(1000)}"
    return kind


def random_plan(rng, trace=False):
    return [random_action(rng, trace) for _ in range(rng.choice([1, 2, 3]))]


OP_WEIGHTS = {
    "use": 5, "free": 2, "clear": 1, "set_events": 6, "set_local": 5,
    "register": 8, "restart": 1, "insert_marker": 3, "remove_marker": 2,
    "settrace": 1, "setprofile": 1, "run": 12, "threads": 2, "suspend": 2,
    "resume": 3,
}
# What the main thread does while threads run monitored code.
API_OPS = ["use", "free", "clear", "set_events", "set_local", "register",
           "restart", "insert_marker", "remove_marker"]


def generate(rng, n):
    # Mostly act on tools in use, and set events that have callbacks,
    # to get somewhere.
    claimed = set()
    registered = {tool: set() for tool in TOOLS}
    return [random_op(rng, claimed, registered, list(OP_WEIGHTS))
            for _ in range(n)]


def random_op(rng, claimed, registered, kinds):
    tool = rng.choice(TOOLS)
    if claimed and rng.random() < 0.85:
        tool = rng.choice(sorted(claimed))
    kind = rng.choices(kinds, [OP_WEIGHTS[k] for k in kinds])[0]
    drivers = sorted(DRIVERS)
    if kind in ("use", "free", "clear"):
        if kind == "use":
            tool = rng.choice(TOOLS)
            claimed.add(tool)
        elif kind == "free":
            claimed.discard(tool)
        return [kind, tool]
    if kind == "set_events":
        return [kind, tool, random_mask(rng, likely=registered[tool])]
    if kind == "set_local":
        names = sorted(LOCAL_EVENTS) if rng.random() < 0.9 else None
        return [kind, tool, rng.choice(CODE_NAMES), random_mask(
            rng, names or EVENT_NAMES, registered[tool] & LOCAL_EVENTS)]
    if kind == "register":
        plan = random_plan(rng) if rng.random() < 0.9 else None
        event = rng.choice(EVENT_NAMES)
        registered[tool].add(event)
        return [kind, tool, event, plan]
    if kind in ("insert_marker", "remove_marker"):
        return [kind, tool, rng.choice(CODE_NAMES), rng.randrange(1000)]
    if kind in ("settrace", "setprofile"):
        return [kind, random_plan(rng, True) if rng.random() < 0.6 else None]
    if kind == "run":
        return [kind, rng.choice(drivers)]
    if kind == "threads":
        meanwhile = [random_op(rng, claimed, registered, API_OPS)
                     for _ in range(rng.randrange(4))]
        return [kind, rng.sample(drivers, rng.choice([2, 3])), meanwhile]
    if kind == "suspend":
        return [kind, rng.choice(["gen", "coro"])]
    if kind == "resume":
        return [kind, rng.randrange(8),
                rng.choice(["send", "send", "throw", "close"])]
    return [kind]


def mask_names(mask):
    names = [n for n in EVENT_NAMES if mask & getattr(E, n)]
    return "|".join(names) or "NO_EVENTS"


def describe(op):
    """One operation, readably."""
    kind, *args = op
    if kind in ("set_events", "set_local"):
        args[-1] = mask_names(args[-1])
    elif kind == "register" and args[2] is not None:
        args[2] = "[" + ", ".join(map(describe_action, args[2])) + "]"
    elif kind == "threads":
        names, meanwhile = args
        return (f"threads({', '.join(names)}; meanwhile: "
                f"{', '.join(map(describe, meanwhile)) or 'nothing'})")
    return f"{kind}({', '.join(map(str, args))})"


def describe_action(action):
    if action.startswith(("events:", "local:")):
        head, _, mask = action.rpartition(":")
        return f"{head}:{mask_names(int(mask))}"
    return action


# --- the child: running operations and checking invariants ---------------

class FuzzError(Exception):
    """What callbacks raise."""


Layout = collections.namedtuple("Layout", [
    "starts",       # the offsets of the instructions (a dict's keys)
    "resume",       # the offset of the first RESUME
    "lines",        # the line numbers
    "markable",     # where a marker may go
    "no_raise",     # where callbacks do not raise
    "line_at",      # offset -> line
])


class Child:
    """Runs operations in this process, keeping a model of what monitoring
    should be doing, and checks it after each operation."""

    MAX_NESTED_CALLS = 2      # corpus runs started from callbacks, nested
    LINENO_BUDGET = 5         # f_lineno jumps per operation: no endless loop

    def __init__(self, skip):
        self.skip = skip
        self.ns, self.codes = load_corpus()
        self.lock = threading.RLock()
        self.local = threading.local()
        self.names = {}             # tool -> name, of the tools in use
        self.events = {}            # tool -> global event set
        self.local_events = {}      # (tool, code) -> local event set
        self.callbacks = {}         # (tool, event name) -> callback
        # Code objects are keyed by identity (see ident()): code compiled
        # twice from the same source compares equal.
        self.markers = set()        # (tool, code, offset)
        self.ever_marked = set()
        self.disabled = {}          # (tool, event, code, place) -> thread
        self.kept = {}
        self.suspended = []         # generators and coroutines
        self.layouts = {}
        self.violations = []
        self.lineno_budget = 0

    def ident(self, code):
        """A key for code, which is kept alive so that its id stays its."""
        self.kept[id(code)] = code
        return id(code)

    def fail(self, check, detail):
        if check not in self.skip:
            self.violations.append((check, detail))

    # The monitoring API, through a model of its state.  The lock keeps
    # each call and the model's update together against other threads.

    def api(self, name, *args):
        with self.lock:
            tool = args[0] if args else None
            expect_error = self.expected_error(name, args)
            try:
                result = getattr(M, name)(*args)
            except (ValueError, TypeError) as exc:
                if expect_error is False:
                    self.fail("api_contract",
                              f"{name}{args!r} raised {exc!r}")
                return None
            if expect_error is True:
                self.fail("api_contract", f"{name}{args!r} did not raise")
            if name == "use_tool_id":
                self.names[tool] = args[1]
                self.events[tool] = 0
            elif name in ("free_tool_id", "clear_tool_id"):
                self.forget(tool, name == "free_tool_id")
            elif name == "set_events":
                self.events[tool] = args[1]
            elif name == "set_local_events":
                self.local_events[tool, self.ident(args[1])] = args[2]
            elif name == "register_callback":
                self.replaced(result)
                self.callbacks[tool, args[1]] = args[2]
            elif name == "restart_events":
                self.disabled.clear()
            elif name == "insert_marker":
                self.markers.add(self.marker_key(*args))
                self.ever_marked.add(self.marker_key(*args))
            elif name == "remove_marker":
                self.markers.discard(self.marker_key(*args))
                self.drop_disabled(lambda k: k[:2] == (tool, "MARKER") and
                                   k[2:] == self.marker_key(*args)[1:])
            return result

    def expected_error(self, name, args):
        """True if the call must raise, False if it must not, None if
        either is right."""
        tool = args[0] if args else None
        in_use = tool in self.names
        if name == "use_tool_id":
            return in_use
        if name in ("clear_tool_id", "register_callback"):
            return not in_use
        if name in ("set_events", "set_local_events"):
            mask = args[-1]
            # C_RETURN and C_RAISE only with all three of CALL_GROUP.
            bad = (mask & CALL_GROUP not in (0, E.CALL, CALL_GROUP)
                   or (name == "set_local_events" and mask & ~LOCAL_MASK))
            return not in_use or bad
        if name == "insert_marker":
            tool, code, offset = args
            if offset not in self.marker_offsets(code):
                return True
            if (not in_use or
                    sum(m[1] == id(code) for m in self.markers) >= 255):
                return None
            return False
        if name == "remove_marker":
            return self.marker_key(*args) not in self.markers
        return False

    def marker_key(self, tool, code, offset):
        return (tool, self.ident(code), offset)

    def layout(self, code):
        """What the checks need to know of code, read once: callbacks
        check it at each event."""
        try:
            return self.layouts[code]
        except KeyError:
            instructions = list(dis.get_instructions(code))
            resume = next(i.offset for i in instructions
                          if i.opname == "RESUME")
            # Where a marker may go: after the first RESUME, on no RESUME.
            markable = [i.offset for i in instructions
                        if i.offset > resume and i.opname != "RESUME"]
            line_at = {i.offset: line for start, end, line in code.co_lines()
                       for i in instructions if start <= i.offset < end}
            lines = set(line_at.values()) - {None}
            # An exception raised at the COPY of a handler's cleanup
            # ("COPY 3; POP_EXCEPT; RERAISE") leaves the handled exception
            # in sys.exc_info(), as in 3.11 with sys.settrace and in 3.12
            # and 3.13 (Sightglass restores it at PUSH_EXC_INFO and
            # POP_EXCEPT).  Callbacks do not raise there, so that
            # exc_info_leak checks the rest.
            no_raise = {i.offset for i, after in zip(instructions,
                                                     instructions[1:] + [None])
                        if i.opname == "COPY" and after and
                        after.opname == "POP_EXCEPT"}
            return self.layouts.setdefault(code, Layout(
                dict.fromkeys(i.offset for i in instructions), resume, lines,
                markable, no_raise, line_at))

    def marker_offsets(self, code):
        return self.layout(code).markable

    def forget(self, tool, free):
        """The model of tool after it is freed or cleared."""
        if free:
            self.names.pop(tool, None)
        if tool in self.events:
            self.events[tool] = 0
        for key in [k for k in self.local_events if k[0] == tool]:
            del self.local_events[key]
        for key in [k for k in self.callbacks if k[0] == tool]:
            self.replaced(self.callbacks.pop(key))
        self.markers = {m for m in self.markers if m[0] != tool}
        self.ever_marked = {m for m in self.ever_marked if m[0] != tool}
        self.drop_disabled(lambda k: k[0] == tool)

    def replaced(self, callback):
        """callback is no longer registered: from now on this thread must
        not call it (another thread may have fetched it already)."""
        if callback is not None and hasattr(callback, "dead_in"):
            callback.dead_in.add(threading.get_ident())

    def drop_disabled(self, match):
        for key in [k for k in self.disabled if match(k)]:
            del self.disabled[key]

    # Callbacks, trace and profile functions.

    def depth(self):
        return getattr(self.local, "depth", 0)

    def make_callback(self, tool, event, plan):
        calls = itertools.count()

        def callback(*args):
            nested = self.depth()
            if nested:
                self.fail(NESTING_CHECK, f"tool {tool}'s {event} callback "
                          f"runs inside another hook ({describe_args(args)})")
            if not in_corpus(args[0]):
                # The harness's and the library's code: no actions here,
                # and no more events where they can be turned off.
                if threading.get_ident() in callback.dead_in:
                    self.check_call(callback, tool, event, args, None)
                return M.DISABLE if event in LOCAL_EVENTS else None
            self.local.depth = nested + 1
            try:
                frame = sys._getframe(1)
                self.check_call(callback, tool, event, args, frame)
                action = plan[next(calls) % len(plan)]
                result = self.act(action, tool, event, args, frame)
                if result is M.DISABLE:
                    self.disabling(callback, tool, event, args, frame,
                                   nested)
                return result
            finally:
                self.local.depth = nested
        callback.dead_in = set()
        return callback

    def make_hook(self, kind, plan):
        calls = itertools.count()

        def hook(frame, what, arg):
            nested = self.depth()
            if nested:
                self.fail(NESTING_CHECK,
                          f"{kind} function runs inside another hook "
                          f"({what} in {frame.f_code.co_qualname})")
            if not in_corpus(frame.f_code):
                return None
            self.local.depth = nested + 1
            try:
                self.act(plan[next(calls) % len(plan)], None, kind,
                         None, frame)
            finally:
                self.local.depth = nested
            return hook
        return hook

    def check_call(self, callback, tool, event, args, frame):
        me = threading.get_ident()
        where = describe_args(args)
        if me in callback.dead_in:
            self.fail("freed_callback_called",
                      f"tool {tool}'s {event} callback was replaced, "
                      f"or its tool freed or cleared, and still ran: {where}")
        if frame is None:
            return
        self.check_shape(event, args, frame)
        key = self.disable_key(tool, event, args, frame)
        if key is not None and self.disabled.get(key) == me:
            self.fail("called_after_disable",
                      f"tool {tool}'s {event} callback returned DISABLE "
                      f"and ran again there: {where}")
        if (event == "MARKER" and
                self.marker_key(tool, *args) not in self.ever_marked):
            self.fail("event_shape", f"MARKER of tool {tool} where it "
                      f"never had a marker: {where}")

    def check_shape(self, event, args, frame):
        def bad(why):
            self.fail("event_shape", f"{event}{describe_args(args)}: {why}")
        if not args or not isinstance(args[0], types.CodeType):
            return bad("no code object first")
        code = args[0]
        size = len(code.co_code)
        if frame.f_code is not code:
            bad(f"the running frame is {frame.f_code.co_qualname}'s")
        want = (2 if event in TWO_ARG_EVENTS else
                4 if event in ("CALL", "C_RETURN", "C_RAISE") else 3)
        if len(args) != want:
            return bad(f"{len(args)} arguments, not {want}")
        if not isinstance(args[1], int):
            return bad("not an int second")
        layout = self.layout(code)
        if event == "LINE":
            if args[1] not in layout.lines:
                bad("not a line of the code")
        elif args[1] % 2 or not 0 <= args[1] < size:
            bad("offset odd or outside the code")
        elif event in INSTRUCTION_EVENTS and args[1] not in layout.starts:
            bad("offset not at an instruction")
        if event in ("JUMP", "BRANCH", "BRANCH_LEFT", "BRANCH_RIGHT"):
            if args[2] not in layout.starts:
                bad("destination not at an instruction")
        if event in EXCEPTION_EVENTS and not isinstance(args[2],
                                                        BaseException):
            bad("no exception")
        if event == "STOP_ITERATION" and not isinstance(args[2],
                                                        StopIteration):
            bad("no StopIteration")
        if event == "INSTRUCTION" and args[1] <= layout.resume:
            bad("the first RESUME or before")

    def disable_key(self, tool, event, args, frame):
        """Where a DISABLE returned for these arguments applies, or None if
        that is not known."""
        place = args[1]
        if event == "LINE":
            # LINE reports a line, but DISABLE is for the instruction.  When
            # a callback called before this one set f_lineno, the frame is
            # elsewhere already (as in 3.12): the instruction is not known.
            place = frame.f_lasti
            if self.layout(args[0]).line_at.get(place) != args[1]:
                return None
        return (tool, event, self.ident(args[0]), place)

    def disabling(self, callback, tool, event, args, frame, nested):
        with self.lock:
            if event not in LOCAL_EVENTS:
                # The interpreter refuses it and unregisters the callback.
                if self.callbacks.get((tool, event)) is callback:
                    del self.callbacks[tool, event]
                self.replaced(callback)
            elif not nested:
                # Only the outermost: a dispatch that a callback's code
                # interrupted goes on with the tools it had already chosen.
                key = self.disable_key(tool, event, args, frame)
                if key is not None:
                    self.disabled[key] = threading.get_ident()

    def act(self, action, tool, event, args, frame):
        """Do action in a callback (or a trace or profile function, where
        tool and args are None); return what the callback returns."""
        kind, _, arg = action.partition(":")
        if kind == "disable":
            return M.DISABLE
        if kind == "raise":
            if frame.f_lasti not in self.layout(frame.f_code).no_raise:
                raise FuzzError(action)
        if kind == "call":
            calls = getattr(self.local, "calls", 0)
            if calls < self.MAX_NESTED_CALLS:
                self.local.calls = calls + 1
                try:
                    self.run_driver(arg)
                finally:
                    self.local.calls = calls
        elif kind in ("free_self", "clear_self") and tool is not None:
            self.api(kind.replace("self", "tool_id"), tool)
        elif kind in ("free", "clear"):
            self.api(kind + "_tool_id", int(arg))
        elif kind == "use":
            self.api("use_tool_id", int(arg), "fuzz")
        elif kind == "events":
            tool_arg, mask = map(int, arg.split(":"))
            self.api("set_events", tool_arg, mask)
        elif kind == "local" and tool is not None:
            self.api("set_local_events", tool, frame.f_code, int(arg))
        elif kind == "restart":
            self.api("restart_events")
        elif kind == "reregister" and tool is not None:
            plan = ["none", "disable"]
            self.api("register_callback", tool, getattr(E, event),
                     self.make_callback(tool, event, plan))
        elif kind == "unregister" and tool is not None:
            self.api("register_callback", tool, getattr(E, event), None)
        elif kind == "marker" and tool is not None:
            offsets = self.marker_offsets(frame.f_code)
            if offsets:
                offset = offsets[int(arg) % len(offsets)]
                self.api("insert_marker", tool, frame.f_code, offset)
        elif kind == "lineno" and tool is not None:
            self.set_lineno(event, frame, int(arg))
        return None

    def set_lineno(self, event, frame, pick):
        lines = sorted(self.layout(frame.f_code).lines)
        if event != "LINE":
            try:
                frame.f_lineno = lines[0]
            except ValueError:
                return
            self.fail("api_contract", f"f_lineno set from a {event} "
                      "callback")
        elif self.lineno_budget > 0:
            self.lineno_budget -= 1
            try:
                frame.f_lineno = lines[pick % len(lines)]
            except ValueError:
                pass

    def run_drivers(self, name, times=3):
        for _ in range(times):
            self.run_driver(name)

    def run_driver(self, name):
        try:
            self.ns[DRIVERS[name]](5)
        except Exception:
            pass

    # Operations.

    def do(self, op):
        kind, *args = op
        self.lineno_budget = self.LINENO_BUDGET
        if kind in ("use", "free", "clear"):
            self.api({"use": "use_tool_id", "free": "free_tool_id",
                      "clear": "clear_tool_id"}[kind], *args,
                     *(["fuzz"] if kind == "use" else []))
        elif kind == "set_events":
            self.api("set_events", *args)
        elif kind == "set_local":
            tool, name, mask = args
            self.api("set_local_events", tool, self.codes[name], mask)
        elif kind == "register":
            tool, event, plan = args
            func = plan and self.make_callback(tool, event, plan)
            self.api("register_callback", tool, getattr(E, event), func)
        elif kind == "restart":
            self.api("restart_events")
        elif kind in ("insert_marker", "remove_marker"):
            tool, name, pick = args
            code = self.codes[name]
            offsets = list(self.layout(code).starts)
            # Mostly instruction starts; sometimes an odd or RESUME offset.
            offset = (offsets[pick % len(offsets)] if pick % 7
                      else pick % len(code.co_code))
            self.api(kind, tool, code, offset)
        elif kind in ("settrace", "setprofile"):
            plan, = args
            getattr(sys, kind)(plan and self.make_hook(kind, plan))
        elif kind == "run":
            self.run_driver(args[0])
        elif kind == "suspend":
            # A frame that stays suspended while instrumentation changes.
            frame = self.ns[args[0]](5)
            try:
                frame.send(None)
                self.suspended.append(frame)
            except Exception:
                pass
        elif kind == "resume" and self.suspended:
            pick, how = args
            frame = self.suspended[pick % len(self.suspended)]
            try:
                if how == "send":
                    frame.send(1)
                elif how == "throw":
                    frame.throw(KeyError)
                else:
                    frame.close()
            except Exception:
                self.suspended.remove(frame)
            if how == "close" and frame in self.suspended:
                self.suspended.remove(frame)
        elif kind == "threads":
            names, meanwhile = args
            threads = [threading.Thread(target=self.run_drivers,
                                        args=(name,))
                       for name in names]
            for t in threads:
                t.start()
            # Instrumentation changes while other threads run the code.
            for op in meanwhile:
                self.do(op)
            for t in threads:
                t.join(30)
                if t.is_alive():
                    self.fail("thread_hang", "a thread did not end")

    def check_state(self):
        """What monitoring reports against the model."""
        if sys.exc_info() != (None, None, None):
            self.fail("exc_info_leak", f"sys.exc_info() is "
                      f"{sys.exc_info()!r} at top level")
        for tool in TOOLS:
            want = self.events.get(tool, 0)
            if want & E.CALL:
                want &= ~(E.C_RETURN | E.C_RAISE)
            got = M.get_events(tool)
            if got != want:
                self.fail("state_consistent",
                          f"get_events({tool}) is {mask_names(got)}, "
                          f"set {mask_names(want)}")
            if M.get_tool(tool) != self.names.get(tool):
                self.fail("state_consistent",
                          f"get_tool({tool}) is {M.get_tool(tool)!r}")
            for code in self.codes.values():
                want = self.local_events.get((tool, id(code)), 0)
                if want & E.CALL:
                    want &= ~(E.C_RETURN | E.C_RAISE)
                got = M.get_local_events(tool, code)
                if got != want:
                    self.fail("state_consistent",
                              f"get_local_events({tool}, "
                              f"{code.co_qualname}) is {mask_names(got)}, "
                              f"set {mask_names(want)}")

    def finish(self):
        """Free everything; nothing may be left, nor run."""
        sys.settrace(None)
        sys.setprofile(None)
        for tool in TOOLS:
            self.api("free_tool_id", tool)
        for frame in self.suspended:
            try:
                frame.close()
            except Exception:
                pass
        self.check_state()
        all_events = getattr(M, "_all_events", None)
        if all_events is not None and all_events():
            self.fail("state_consistent",
                      f"_all_events() is {all_events()!r} with no tool")
        for name in DRIVERS:
            self.run_driver(name)

    def run(self, ops):
        """Run ops; the exit status and the JSON line of the protocol."""
        for index, op in enumerate(ops + [None]):
            if op is None:
                self.finish()
            else:
                self.do(op)
                self.check_state()
            if self.violations:
                check, detail = self.violations[0]
                where = describe(op) if op else "the final cleanup"
                print(json.dumps({"check": check, "op": index,
                                  "detail": f"{where}: {detail}"}))
                return 3
        print(json.dumps({"ok": True}))
        return 0


CORPUS_FILES = {"<fuzz-corpus>", "<fuzz-exec>"}


def in_corpus(code):
    return getattr(code, "co_filename", None) in CORPUS_FILES


def describe_args(args):
    def one(arg):
        if isinstance(arg, types.CodeType):
            return arg.co_qualname
        return repr(arg)[:60]
    return "(" + ", ".join(map(one, args)) + ")"


def child(ops, skip):
    return Child(skip).run(ops)


FUZZER = Fuzzer("test.test_monitoring_fuzz", generate, describe)
NOPS = 60 if DEBUG_BUILD else 250
SEEDS = range(1) if DEBUG_BUILD else range(18)


class MonitoringFuzzTest(unittest.TestCase):

    def test_fuzz(self):
        # A failure names the invariant: callback_nesting is 3.12's rule
        # that no event reaches a hook while a hook (a monitoring callback,
        # a trace or profile function) runs on the thread.
        report = FUZZER.first_failure(SEEDS, NOPS)
        if report:
            self.fail(report)


if __name__ == "__main__":
    sys.exit(FUZZER.main(sys.argv[1:], child, NOPS))
