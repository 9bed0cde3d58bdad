"""A random-operation fuzzer for memory tracking (--with-memory-tracking).

A seed makes a list of operations (JSON lists): objects of many builtin
types made, grown, shrunk and dropped in numbered slots, blocks of the
tracked-malloc C API allocated, resized and freed, tags adjusted, cycles
collected, and some of that in several threads at once.  A child
interpreter runs the list and checks, after each operation (and while the
threads run), that the tags add up to the total, that none is negative,
that the tags of the C API hold what was allocated under them, and at the
end, with everything freed, that the total is back to where it started.
Failing lists are shrunk and printed (the harness of test_monitoring_fuzz).

    ./python -m test.test_memtrack_fuzz --seconds 600 [--seed N]
"""

import array
import collections
import ctypes
import gc
import json
import operator
import struct
import sys
import threading
import time
import unittest
from test.support import import_helper
from test.test_memtrack import fill_int_free_list, kept_for_reuse
from test.test_monitoring_fuzz import Fuzzer

if not hasattr(sys, "total_memory_used"):
    raise unittest.SkipTest("not a --with-memory-tracking build")

_testcapi = import_helper.import_module("_testcapi")
DEBUG_BUILD = hasattr(sys, "gettotalrefcount")
POINTER = struct.calcsize("P")
SLOTS = 24
KINDS = ["list", "dict", "set", "frozenset", "bytearray", "bytes", "str",
         "tuple", "dict_instance", "slots_instance", "array", "deque",
         "int", "nested", "cycle"]
TAGS = ["a", "b", "c"]
# After everything is freed the total may stay this much above where it
# started: blocks that free lists and caches keep (the warm-up fills them
# first), the interning of new strings, dicts and the like that grew once.
TOLERANCE = 64 * 1024
# pymalloc never frees the nodes of its map of arena addresses (128 KiB
# at the bottom, 256 KiB in the middle, in the raw domain): an arena
# mapped where none was before adds one for good.  Where the system maps
# an arena depends on what the threads mapped and unmapped meanwhile.
ADDRESS_MAP_NODES = 2
ADDRESS_MAP_BYTES = (128 + 256 + 4) * 1024      # with malloc()'s slack


# --- generating operations -----------------------------------------------

def random_op(rng, owner):
    """One operation on the slots or tags of owner ("m" for the main
    thread, "t0", "t1"... for threads)."""
    slot = rng.randrange(SLOTS)
    size = rng.choice([0, 1, 3, 10, 100, 1000, 20000])
    kind = rng.choices(
        ["new", "grow", "shrink", "free", "malloc", "realloc", "mfree",
         "adjust", "gc"], [10, 6, 4, 4, 3, 2, 2, 1, 1])[0]
    if kind == "new":
        return [kind, owner, slot, rng.choice(KINDS), size]
    if kind in ("grow", "shrink"):
        return [kind, owner, slot, size]
    if kind == "free":
        return [kind, owner, slot]
    if kind == "malloc":
        return [kind, owner, slot, rng.choice(TAGS), size]
    if kind == "realloc":
        return [kind, owner, slot, size]
    if kind == "mfree":
        return [kind, owner, slot]
    if kind == "adjust":
        # Sometimes more than the tag holds: it stops at zero.
        return [kind, owner, rng.choice(TAGS),
                rng.choice([1, -1]) * rng.choice([1, 100, 4096, 1 << 20])]
    return [kind]


def generate(rng, n):
    ops = []
    for _ in range(n):
        if rng.random() < 0.06:
            ops.append(["threads", [
                [random_op(rng, f"t{k}") for _ in range(rng.randrange(5, 40))]
                for k in range(rng.choice([2, 3]))]])
        else:
            ops.append(random_op(rng, "m"))
    return ops


def describe(op):
    if op[0] == "threads":
        return "threads(" + "; ".join(
            ", ".join(map(describe, sub)) for sub in op[1]) + ")"
    return f"{op[0]}({', '.join(map(str, op[1:]))})"


# --- the child -----------------------------------------------------------

class FuzzDict:
    def __init__(self, n):
        for i in range(min(n, 50)):
            setattr(self, f"a{i}", i)


class FuzzSlots:
    __slots__ = ("a", "b", "c")

    def __init__(self, n):
        self.a, self.b, self.c = n, [n], str(n)


def make(kind, n):
    """An object of kind, of about n items."""
    if kind == "list":
        return list(range(n))
    if kind == "dict":
        return {i: i for i in range(n)}
    if kind == "set":
        return set(range(n))
    if kind == "frozenset":
        return frozenset(range(n))
    if kind == "bytearray":
        return bytearray(n)
    if kind == "bytes":
        return bytes(n)
    if kind == "str":
        return "x" * n + str(n)         # not interned, not shared
    if kind == "tuple":
        return tuple(range(n))
    if kind == "dict_instance":
        return FuzzDict(n)
    if kind == "slots_instance":
        return [FuzzSlots(i) for i in range(min(n, 1000))]
    if kind == "array":
        return array.array("d", range(n))
    if kind == "deque":
        return collections.deque(range(n))
    if kind == "int":
        return 7 ** (n + 1)
    if kind == "nested":
        return [{"k": [i], "t": (i, str(i))} for i in range(min(n, 2000))]
    # A cycle, for the collector to free.
    node = [None] * min(n + 1, 100)
    node[0] = node
    return node


def grow(obj, n):
    """obj, grown by about n items (a new object for immutable ones)."""
    if isinstance(obj, (list, bytearray, collections.deque)):
        obj.extend(range(n) if not isinstance(obj, bytearray) else bytes(n))
    elif isinstance(obj, array.array):
        obj.extend(range(n))
    elif isinstance(obj, dict):
        obj.update((-i - 1, i) for i in range(len(obj), len(obj) + n))
    elif isinstance(obj, set):
        obj.update(range(-n, 0))
    elif isinstance(obj, FuzzDict):
        for i in range(min(n, 50)):
            setattr(obj, f"g{i}", i)
    elif isinstance(obj, (str, bytes, tuple)):
        return obj + make(type(obj).__name__, n)
    elif isinstance(obj, frozenset):
        return obj | frozenset(range(-n, 0))
    elif isinstance(obj, int):
        return obj * 7 ** (n + 1)
    return obj


def shrink(obj, n):
    if isinstance(obj, (list, bytearray, array.array)):
        del obj[len(obj) - min(n, len(obj)):]
    elif isinstance(obj, collections.deque):
        for _ in range(min(n, len(obj))):
            obj.pop()
    elif isinstance(obj, dict):
        for _ in range(min(n, len(obj))):
            obj.popitem()
    elif isinstance(obj, set):
        for _ in range(min(n, len(obj))):
            obj.pop()
    elif isinstance(obj, FuzzDict):
        obj.__dict__.clear()
    elif isinstance(obj, (str, bytes, tuple)):
        return obj[:max(0, len(obj) - n)]
    return obj


class Child:
    """Runs operations in this process, with a model of what the C API's
    tags hold, and checks the accounting after each."""

    def __init__(self, skip):
        self.skip = skip
        self.slots = {}         # (owner, slot) -> object
        self.blocks = {}        # (owner, slot) -> (tag, address, size)
        self.adjusted = {}      # tag -> what Py_AdjustTrackedMemory left
        self.violations = []
        self.allocator = _testcapi.pymem_getallocatorsname()
        # Debug hooks (a debug build's default) add 3 size_t to each block.
        self.hooks = 3 * POINTER if self.allocator.endswith("debug") else 0
        api = ctypes.pythonapi
        self.adjust = api.Py_AdjustTrackedMemory
        self.adjust.argtypes = [ctypes.c_char_p, ctypes.c_ssize_t]
        self.adjust.restype = None

    def fail(self, check, detail):
        if check not in self.skip:
            self.violations.append((check, detail))

    def int_block(self, value):
        """The block of the int that holds a reading of the total: the
        only allocation between it and the reading of the tags, and none if
        it takes the block of an int kept for reuse."""
        if kept_for_reuse(value):
            return 0
        size = sys.getsizeof(value) + self.hooks
        if self.allocator.startswith("pymalloc") and size <= 512:
            return (size + 15) // 16 * 16
        return None             # malloc()'s size: not known exactly

    def read_tags(self):
        """The total and the tags, in bytes and blocks, and what is wrong
        with their sums."""
        # Both calls from C (map and operator.call): no bytecode, so no
        # other thread takes the GIL in between.
        fill_int_free_list()
        total, usage = map(operator.call, (sys.total_memory_used,
                                           sys.type_memory_usage))
        fill_int_free_list()
        blocks, counts = map(operator.call, (sys.total_allocation_count,
                                             sys.type_allocation_counts))
        wrong = []
        extra = self.int_block(total)
        if extra is not None and sum(usage.values()) != total + extra:
            wrong.append(f"the tags sum to {sum(usage.values())}, the total "
                         f"is {total} (+{extra} for its int)")
        new = 0 if kept_for_reuse(blocks) else 1
        if sum(counts.values()) != blocks + new:
            wrong.append(f"the block counts sum to {sum(counts.values())}, "
                         f"the total is {blocks} (+{new})")
        return usage, counts, wrong

    def check_tags(self):
        # The raw domain is used without the GIL: a thread that ends frees
        # its state after releasing it, even after join() returned.  Such a
        # free between the two readings is no error; it does not happen
        # again at once, while an error of the accounting stays.
        for _ in range(3):
            usage, counts, wrong = self.read_tags()
            if not wrong:
                break
            time.sleep(0.01)
        else:
            self.fail("tags_add_up", "; ".join(wrong))
        for name, table in (("bytes", usage), ("blocks", counts)):
            negative = {k: v for k, v in table.items() if v < 0}
            if negative:
                self.fail("no_negative_tag", f"{name}: {negative}")
        return usage, counts

    def check_api_tags(self, usage, counts):
        """The C API's tags hold what was allocated under them."""
        for tag in TAGS:
            for owner in {o for o, _ in self.blocks} | {"m"}:
                name = f"fuzz.{owner}.{tag}"
                live = [b for b in self.blocks.values() if b[0] == name]
                if counts.get(name, 0) != len(live):
                    self.fail("api_tags", f"{name} counts "
                              f"{counts.get(name, 0)} blocks, {len(live)} "
                              "are allocated")
                if usage.get(name, 0) < sum(size for *_, size in live):
                    self.fail("api_tags", f"{name} holds "
                              f"{usage.get(name, 0)} bytes, less than the "
                              f"{sum(size for *_, size in live)} allocated")
        for tag, want in self.adjusted.items():
            if usage.get(tag, 0) != want:
                self.fail("api_tags", f"{tag} holds {usage.get(tag, 0)} "
                          f"bytes after adjustments, not {want}")

    def do(self, op):
        kind, *args = op
        if kind == "threads":
            self.threads(args[0])
        elif kind == "gc":
            gc.collect()
        elif kind == "adjust":
            owner, tag, delta = args
            # Threads adjust tags of their own: each tag's model stays
            # exact without a lock.
            name = f"fuzz.adj.{owner}.{tag}"
            if DEBUG_BUILD:
                # Taking a tag below zero is a caller's bug, which a debug
                # build asserts on; a release build stops the tag at zero.
                delta = max(delta, -self.adjusted.get(name, 0))
            self.adjust(name.encode(), delta)
            self.adjusted[name] = max(0, self.adjusted.get(name, 0) + delta)
        else:
            owner, slot, *rest = args
            key = (owner, slot)
            if kind == "new":
                self.slots[key] = make(*rest)
            elif kind == "grow" and key in self.slots:
                self.slots[key] = grow(self.slots[key], *rest)
            elif kind == "shrink" and key in self.slots:
                self.slots[key] = shrink(self.slots[key], *rest)
            elif kind == "free":
                self.slots.pop(key, None)
            elif kind == "malloc" and key not in self.blocks:
                tag, size = rest
                name = f"fuzz.{owner}.{tag}"
                self.blocks[key] = (name, _testcapi.pyobject_t_malloc(
                    name, size), size)
            elif kind == "realloc" and key in self.blocks:
                name, address, _ = self.blocks[key]
                size, = rest
                self.blocks[key] = (name, _testcapi.pyobject_t_realloc(
                    name, address, size), size)
            elif kind == "mfree" and key in self.blocks:
                name, address, _ = self.blocks.pop(key)
                _testcapi.pyobject_t_free(name, address)

    def threads(self, lists):
        done = threading.Event()
        errors = []

        def work(ops):
            try:
                for op in ops:
                    self.do(op)
            except BaseException as exc:
                errors.append(exc)
        workers = [threading.Thread(target=work, args=(ops,))
                   for ops in lists]
        for t in workers:
            t.start()
        # The tags must add up at any moment, not only between operations.
        while not done.is_set():
            self.check_tags()
            done.wait(0.001)
            if not any(t.is_alive() for t in workers):
                done.set()
        for t in workers:
            t.join()
        if errors:
            raise errors[0]

    def warm_up(self):
        """Fill free lists and caches, and start and end a thread, so that
        the baseline is what an idle interpreter keeps."""
        rounds = [[["new", "w", i, kind, n] for i, kind in enumerate(KINDS)
                   for n in (0, 3, 10)], [["free", "w", i]
                                          for i in range(len(KINDS))]]
        for ops in rounds:
            for op in ops:
                self.do(op)
        junk = [tuple(range(size)) for size in range(20) for _ in range(2000)]
        junk += [[] for _ in range(100)] + [{} for _ in range(100)]
        junk += [float(i) for i in range(1000)]
        del junk
        self.threads([[["gc"]], [["gc"]]])
        self.check_tags()
        gc.collect()

    def take_baseline(self):
        """The total, the tags' bytes and their blocks, for finish()."""
        gc.collect()
        usage, counts = self.check_tags()
        return sys.total_memory_used(), usage, counts

    def finish(self, baseline):
        """Free everything: the total must come back to baseline, taken
        before the operations."""
        total_before, usage_before, counts_before = baseline
        self.slots.clear()
        for key in list(self.blocks):
            self.do(["mfree", *key])
        for name, value in list(self.adjusted.items()):
            self.adjust(name.encode(), -value)
            self.adjusted[name] = 0
        gc.collect()
        usage, counts = self.check_tags()
        self.check_api_tags(usage, counts)
        for cls in (FuzzDict, FuzzSlots):
            if usage.get(cls.__name__, 0) > cls.__basicsize__ * 4:
                self.fail("back_to_baseline", f"{cls.__name__} holds "
                          f"{usage[cls.__name__]} bytes with no instance")
        total = sys.total_memory_used()
        grown = {tag: (usage.get(tag, 0) - usage_before.get(tag, 0),
                       counts.get(tag, 0) - counts_before.get(tag, 0))
                 for tag in usage.keys() | usage_before.keys()}
        raw_bytes, raw_blocks = grown.get("<raw>", (0, 0))
        excused = 0
        if 0 < raw_blocks <= ADDRESS_MAP_NODES and (
                raw_bytes <= ADDRESS_MAP_BYTES):
            excused = raw_bytes
        if total - excused > total_before + TOLERANCE:
            most = sorted(grown.items(), key=lambda item: -item[1][0])[:5]
            self.fail("back_to_baseline", f"the total is {total}, "
                      f"{total - total_before} bytes above the baseline; "
                      "grown most (bytes, blocks): " + ", ".join(
                          f"{tag} {b} {n}" for tag, (b, n) in most))

    def run(self, ops):
        # A collection between the two readings of a check would free
        # blocks in between: the collector runs at "gc" operations only.
        gc.disable()
        self.warm_up()
        baseline = self.take_baseline()
        for index, op in enumerate(ops + [None]):
            if op is None:
                self.finish(baseline)
            else:
                self.do(op)
                self.check_api_tags(*self.check_tags())
            if self.violations:
                check, detail = self.violations[0]
                where = describe(op) if op else "the final cleanup"
                print(json.dumps({"check": check, "op": index,
                                  "detail": f"{where}: {detail}"}))
                return 3
        print(json.dumps({"ok": True}))
        return 0


def child(ops, skip):
    return Child(skip).run(ops)


FUZZER = Fuzzer("test.test_memtrack_fuzz", generate, describe)
NOPS = 40 if DEBUG_BUILD else 200
SEEDS = range(1) if DEBUG_BUILD else range(6)


class MemtrackFuzzTest(unittest.TestCase):

    def test_fuzz(self):
        report = FUZZER.first_failure(SEEDS, NOPS)
        if report:
            self.fail(report)


class BackToBaselineTest(unittest.TestCase):
    """The final check, in this process: what it excuses, what not."""

    def finish_with(self, kept):
        """The violations of a run that kept what kept() returns."""
        checker = Child(set())
        baseline = checker.take_baseline()
        held = kept()
        try:
            checker.finish(baseline)
        finally:
            del held
        return checker.violations

    def raw_blocks(self, count):
        malloc = ctypes.pythonapi.PyMem_RawMalloc
        malloc.restype = ctypes.c_void_p
        malloc.argtypes = [ctypes.c_size_t]
        free = ctypes.pythonapi.PyMem_RawFree
        free.argtypes = [ctypes.c_void_p]
        blocks = [malloc(128 * 1024) for _ in range(count)]
        for block in blocks:
            self.addCleanup(free, block)
        return blocks

    def test_nothing_kept(self):
        self.assertEqual(self.finish_with(lambda: None), [])

    def test_an_object_kept(self):
        (check, detail), = self.finish_with(lambda: bytearray(200_000))
        self.assertEqual(check, "back_to_baseline")
        self.assertRegex(detail, r"grown most \(bytes, blocks\): "
                                 r"bytearray 2\d{5} 2,")

    def test_address_map_nodes_excused(self):
        self.assertEqual(self.finish_with(lambda: self.raw_blocks(2)), [])

    def test_more_raw_blocks_not_excused(self):
        (check, detail), = self.finish_with(lambda: self.raw_blocks(3))
        self.assertEqual(check, "back_to_baseline")
        self.assertRegex(detail, r"<raw> 3\d{5} 3,")


if __name__ == "__main__":
    sys.exit(FUZZER.main(sys.argv[1:], child, NOPS))
