"""Tests for profiling.heap, the heap scanner."""

import array
import collections
import ctypes
import decimal
import gc
import io
import json
import mmap
import os
import pickle
import signal
import struct
import subprocess
import sys
import tempfile
import threading
import unittest
import weakref
from test import support
from test.support import import_helper, script_helper

from profiling.heap import (Ignored, Rule, Rules, Snapshot, Virtual,
                            snapshot)

TRACKING = hasattr(sys, "total_memory_used")
MONITORING_TOOL = 4


class Node:
    """A hand-built graph's node: counted as 100 bytes, referring to its
    refs only (see graph_rules())."""

    def __init__(self, name):
        self.name = name
        self.refs = []


def graph_rules():
    rules = Rules()
    rules.type[Node] = Rule(100, lambda node: node.refs)
    return rules


def graph():
    #   r -> a -> c -> d
    #   r -> b -> c
    r, a, b, c, d = (Node(name) for name in "rabcd")
    r.refs = [a, b]
    a.refs = [c]
    b.refs = [c]
    c.refs = [d]
    return r, a, b, c, d


class GraphTests(unittest.TestCase):
    # Only r is kept (by the test case): the other nodes are reached
    # through it alone, and known here by their ids.

    def setUp(self):
        nodes = graph()
        self.r = nodes[0]
        self.ids = {node.name: id(node) for node in nodes}
        del nodes
        self.snap = snapshot([self.r], graph_rules())

    def tearDown(self):
        del self.r, self.snap

    def index(self, name):
        index = self.snap._data.find(self.ids[name])
        self.assertGreater(index, 0)
        return index

    def test_sizes_from_the_rule(self):
        for name in "rabcd":
            node = self.snap.node(self.index(name))
            self.assertEqual(node.size, 100)
            self.assertEqual(node.type, f"{__name__}.Node")

    def test_children_from_the_rule(self):
        self.assertEqual(self.snap._data.children(self.index("r")),
                         [self.index("a"), self.index("b")])
        self.assertEqual(self.snap._data.children(self.index("d")), [])

    def test_dominators(self):
        data = self.snap._data
        self.assertEqual(data.dominator(self.index("a")), self.index("r"))
        self.assertEqual(data.dominator(self.index("b")), self.index("r"))
        # Reached through a and through b: only r dominates c.
        self.assertEqual(data.dominator(self.index("c")), self.index("r"))
        self.assertEqual(data.dominator(self.index("d")), self.index("c"))

    def test_retained_sizes(self):
        data = self.snap._data
        self.assertEqual(data.retained(self.index("d")), 100)
        self.assertEqual(data.retained(self.index("c")), 200)
        self.assertEqual(data.retained(self.index("a")), 100)
        self.assertEqual(data.retained(self.index("b")), 100)
        self.assertEqual(self.snap.retained_size(self.r), 500)

    def test_referrers(self):
        self.assertEqual(set(self.snap._data.referrers(self.index("c"))),
                         {self.index("a"), self.index("b")})

    def test_path(self):
        path = self.snap._data.path(self.index("d"))
        self.assertEqual(path[0], 0)
        self.assertEqual(self.snap.node(0).type, "(roots)")
        self.assertEqual(path[-4:], [self.index(name) for name in "racd"])
        # Each step is a referrer of the next.
        for step, following in zip(path, path[1:]):
            self.assertIn(step, self.snap._data.referrers(following))

    def test_summary_does_not_count_nested_twice(self):
        [row] = [r for r in self.snap.summary()
                 if r.type == f"{__name__}.Node"]
        self.assertEqual(row.count, 5)
        self.assertEqual(row.size, 500)
        # r dominates the others: its retained size is the type's.
        self.assertEqual(row.retained, 500)

    def test_long_chain_without_recursion(self):
        head = None
        for _ in range(1_000_000):
            head = [head]
        snap = snapshot([head])
        self.assertEqual(len(snap.path(head)) + 999_999,
                         len(snap.path(_last(head))))
        self.assertGreater(snap.retained_size(head), 1_000_000 * 56)


def _last(chain):
    while chain[0] is not None:
        chain = chain[0]
    return chain


class Base:
    pass


class Derived(Base):
    pass


class RuleTests(unittest.TestCase):

    def test_table_order(self):
        obj = Derived()
        rules = Rules()
        rules.type[Derived] = Rule(1)
        self.assertEqual(snapshot([obj], rules).size(obj), 1)
        rules.instance[Base] = Rule(2)
        self.assertEqual(snapshot([obj], rules).size(obj), 2)
        rules.wholetype[Derived] = Rule(3)
        self.assertEqual(snapshot([obj], rules).size(obj), 3)
        rules.object[obj] = Rule(4)
        self.assertEqual(snapshot([obj], rules).size(obj), 4)
        other = Derived()
        self.assertEqual(snapshot([other], rules).size(other), 3)

    def test_keys_by_name_and_id(self):
        obj = Derived()
        rules = Rules()
        rules.wholetype[f"{__name__}.Derived"] = Rule(7)
        self.assertEqual(snapshot([obj], rules).size(obj), 7)
        rules.object[id(obj)] = Rule(8)
        self.assertEqual(snapshot([obj], rules).size(obj), 8)
        with self.assertRaises(TypeError):
            rules.type[42] = Rule(1)
        with self.assertRaises(TypeError):
            rules.type[Base] = (1, None)
        with self.assertRaises(TypeError):
            Rule(-1)
        with self.assertRaises(TypeError):
            Rule(None, [1])

    def test_mro_composition(self):
        # Size from the class, children from its base.
        obj = Derived()
        obj.kept = ["a list"]
        rules = Rules()
        rules.type[Derived] = Rule(size=11)
        rules.type[Base] = Rule(children=lambda o: [o.kept])
        snap = snapshot([obj], rules)
        self.assertEqual(snap.size(obj), 11)
        self.assertEqual([n.index for n in snap.children(obj)],
                         [snap.index(obj.kept)])

    def test_composition_cached_and_invalidated(self):
        calls = []

        def size(o):
            calls.append(o)
            return 5

        class Other:
            pass

        obj = Derived()
        rules = Rules()
        rules.type[Base] = Rule(size)
        self.assertEqual(snapshot([obj], rules).size(obj), 5)
        # The MRO changes: Base's rule no longer applies.
        Derived.__bases__ = (Other,)
        try:
            self.assertNotEqual(snapshot([obj], rules).size(obj), 5)
        finally:
            Derived.__bases__ = (Base,)
        self.assertEqual(snapshot([obj], rules).size(obj), 5)
        # A table changed: composed again.
        rules.type[Derived] = Rule(6)
        self.assertEqual(snapshot([obj], rules).size(obj), 6)

    def test_ignored(self):
        class Cache(Ignored):
            def __init__(self):
                self.big = [bytes(1000)]

        cache = Cache()
        snap = snapshot([cache])
        self.assertEqual(snap.size(cache), 0)
        self.assertEqual(snap.children(cache), [])
        self.assertEqual(snap.retained_size(cache), 0)

    def test_virtual(self):
        payload = ["payload"]
        v = Virtual("mmap region", 4096, [payload])
        snap = snapshot([v])
        node = snap.node(snap.index(v))
        self.assertEqual(node.type, "mmap region")
        self.assertEqual(node.size, 4096)
        self.assertEqual([n.index for n in snap.children(v)],
                         [snap.index(payload)])
        with self.assertRaises(TypeError):
            Virtual(1)
        with self.assertRaises(ValueError):
            Virtual("x", -1)

    def test_sizes_above_32_bits(self):
        huge = Virtual("mapped file", 5 << 40)
        snap = snapshot([huge])
        self.assertEqual(snap.size(huge), 5 << 40)
        self.assertEqual(snap.retained_size(huge), 5 << 40)

    def test_sizes_about_64_kib(self):
        # A record keeps sizes below 64 KiB itself, and the others beside
        # it: both kinds, in any order, with those of objects and lists.
        sizes = [0, 1, 65534, 65535, 65536, 7, 1 << 20, 65535, 3]
        blocks = [Virtual("block", size) for size in sizes]
        big_list = [None] * 10_000
        snap = snapshot([blocks, big_list])
        self.assertEqual([snap.size(b) for b in blocks], sizes)
        self.assertEqual(snap.retained_size(blocks),
                         snap.size(blocks) + sum(sizes))
        self.assertGreater(snap.size(big_list), 10_000 * 8)
        self.assertEqual(snap.retained_size(big_list), snap.size(big_list))
        summary = {row.type: row for row in snap.summary()}
        self.assertEqual(summary["block"].count, len(sizes))
        self.assertEqual(summary["block"].size, sum(sizes))

    def test_children_rule_gives_virtual_objects(self):
        class Pool:
            pass

        pool = Pool()
        rules = Rules()
        rules.type[Pool] = Rule(children=lambda p: [Virtual("arena", 1000)])
        snap = snapshot([pool], rules)
        [child] = snap.children(pool)
        self.assertEqual((child.type, child.size), ("arena", 1000))
        self.assertEqual(snap.retained_size(pool), snap.size(pool) + 1000)


class BadInputTests(unittest.TestCase):

    def check_consistent(self):
        self.assertTrue(gc.isenabled())
        snapshot()

    def test_rule_raises(self):
        obj = Derived()
        rules = Rules()
        rules.wholetype[Derived] = Rule(lambda o: 1 / 0)
        with self.assertRaises(ZeroDivisionError):
            snapshot([obj], rules)
        self.check_consistent()

    def test_broken_tp_traverse(self):
        # Its tp_traverse visits its first item twice, then fails before
        # its second: the first is its child twice, the second is not.
        _testcapi = import_helper.import_module("_testcapi")
        first, second = str(object()), str(object())
        obj = _testcapi.BadTraverse(first, second)
        snap = snapshot([obj])
        children = [n.index for n in snap.children(obj)]
        self.assertEqual(children.count(snap.index(first)), 2)
        self.assertNotIn(snap.index(second), children)
        self.assertGreaterEqual(snap.retained_size(obj), snap.size(obj))
        self.assertIn(f"{_testcapi.__name__}.BadTraverse",
                      [row.type for row in snap.summary()])
        self.check_consistent()

    def test_borrowed_sizeof(self):
        # str's __sizeof__ on a class that is no str: a plain build calls
        # it, as sys.getsizeof() does, and it refuses the object; a
        # tracking build counts the object's block.
        class Borrower:
            __sizeof__ = str.__sizeof__

        obj = Borrower()
        if TRACKING:
            snap = snapshot([obj])
            self.assertGreaterEqual(snap.size(obj),
                                    object.__sizeof__(obj))
            del snap
        else:
            with self.assertRaises(TypeError):
                snapshot([obj])
        del obj
        self.check_consistent()

    def test_rule_returns_nonsense(self):
        obj = Derived()
        for rule, error in ((Rule(lambda o: -1), ValueError),
                            (Rule(lambda o: "big"), ValueError),
                            (Rule(None, lambda o: 42), TypeError)):
            rules = Rules()
            rules.wholetype[Derived] = rule
            with self.subTest(rule=rule), self.assertRaises(error):
                snapshot([obj], rules)
        self.check_consistent()

    def test_object_beyond_48_bits_of_address(self):
        # Only where the kernel maps memory that high (x86-64 with 5-level
        # page tables, arm64 with 52-bit addresses) when asked to.
        libc = ctypes.CDLL(None, use_errno=True)
        libc.mmap.restype = ctypes.c_void_p
        libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int,
                              ctypes.c_int, ctypes.c_int, ctypes.c_long]
        page = libc.mmap(1 << 50, mmap.PAGESIZE,
                         mmap.PROT_READ | mmap.PROT_WRITE,
                         mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS, -1, 0)
        if page in (None, ctypes.c_void_p(-1).value):
            self.skipTest("mmap() failed")
        if page < 1 << 48:
            libc.munmap(ctypes.c_void_p(page), mmap.PAGESIZE)
            self.skipTest("the kernel maps no memory beyond 2**48")
        # A float, copied there, never freed (its page stays mapped).
        model = 2.5
        ctypes.memmove(page, id(model), sys.getsizeof(model))
        ctypes.c_ssize_t.from_address(page).value = 1 << 40
        far = ctypes.cast(page, ctypes.py_object).value
        self.assertEqual(far, 2.5)
        with self.assertRaisesRegex(OverflowError, "2\\*\\*48"):
            snapshot([[far]])
        self.check_consistent()

    def test_snapshot_from_a_rule(self):
        rules = Rules()
        rules.wholetype[Derived] = Rule(lambda o: len(snapshot()))
        with self.assertRaises(RuntimeError):
            snapshot([Derived()], rules)
        self.check_consistent()

    def test_snapshot_from_a_gc_callback(self):
        # Before and after the collection proper, the heap is whole.
        taken = []

        def callback(phase, info):
            taken.append((phase, snapshot()))

        garbage = Base()
        garbage.cycle = garbage
        del garbage
        gc.callbacks.append(callback)
        try:
            gc.collect()
        finally:
            gc.callbacks.remove(callback)
        self.assertEqual([phase for phase, _ in taken], ["start", "stop"])
        start, stop = (snap for _, snap in taken)
        self.assertGreater(start.info()["unreachable_objects"],
                           stop.info()["unreachable_objects"])
        self.check_consistent()

    def test_snapshot_from_a_collected_finalizer(self):
        errors = []

        class Finalized:
            def __del__(self):
                try:
                    snapshot()
                except RuntimeError as e:
                    errors.append(e)

        garbage = Finalized()
        garbage.cycle = garbage
        del garbage
        gc.collect()
        self.assertEqual(len(errors), 1)
        self.check_consistent()

    def test_snapshot_waits_for_another_threads_collection(self):
        # The collecting thread's finalizer lets the taker run; the taker
        # waits, so the finalizer's wait always times out.
        in_finalizer = threading.Event()
        taken = threading.Event()
        results = []

        class Finalized:
            def __del__(self):
                in_finalizer.set()
                results.append(taken.wait(0.5))

        def collect():
            garbage = Finalized()
            garbage.cycle = garbage
            del garbage
            gc.collect()

        def take():
            try:
                results.append(len(snapshot()) > 0)
            except RuntimeError as e:
                results.append(e)
            taken.set()

        collector = threading.Thread(target=collect)
        collector.start()
        in_finalizer.wait()
        taker = threading.Thread(target=take)
        taker.start()
        collector.join()
        taker.join()
        self.assertEqual(results, [False, True])
        self.check_consistent()

    def test_bad_arguments(self):
        with self.assertRaises(TypeError):
            snapshot(42)
        with self.assertRaises(TypeError):
            snapshot(rules={})
        with self.assertRaises(TypeError):
            snapshot(previous=42)
        snap = snapshot()
        with self.assertRaises(TypeError):
            snap.diff(42)
        with self.assertRaises(KeyError):
            snap.size(object())
        with self.assertRaises(IndexError):
            snap.node(len(snap))
        with self.assertRaises(ValueError):
            snap.write_summary(os.devnull, "xml")

    @support.requires_fork()
    def test_diff_across_processes(self):
        snap = snapshot()
        pid = os.fork()
        if pid == 0:
            try:
                snapshot().diff(snap)
            except ValueError:
                os._exit(0)
            os._exit(1)
        support.wait_process(pid, exitcode=0)


class ObjectTests(unittest.TestCase):

    def test_instance_dict_folds_into_owner(self):
        obj = Base()
        obj.__dict__["x"] = ["in the dict"]
        snap = snapshot([obj])
        self.assertEqual(snap.index(obj.__dict__), snap.index(obj))
        self.assertIn(snap.index(obj.x),
                      [n.index for n in snap.children(obj)])

    def test_module_dict_folds_into_module(self):
        snap = snapshot()
        self.assertEqual(snap.index(vars(json)), snap.index(json))

    def test_sizes(self):
        objects = [[1, 2, 3], {"a": 1}, {1, 2}, "some text", "t\u00e9xt",
                   10**100, bytearray(100), (1, 2), b"bytes", 1.5,
                   array.array("d", [1.0] * 100), collections.deque([1])]
        snap = snapshot([objects])
        for obj in objects:
            with self.subTest(obj=type(obj).__name__):
                if not TRACKING:
                    self.assertEqual(snap.size(obj), sys.getsizeof(obj))
                else:
                    # The allocator's blocks: the object's and its
                    # buffers' sizes, rounded up.
                    self.assertGreaterEqual(snap.size(obj),
                                            sys.getsizeof(obj))

    @unittest.skipUnless(TRACKING, "needs --with-memory-tracking")
    def test_module_types_count_the_blocks_they_own(self):
        # As their modules tell the scanner; subclasses too.
        class Deque(collections.deque):
            pass

        class Array(array.array):
            pass

        reader = open(os.devnull, "rb", buffering=1 << 16)
        self.addCleanup(reader.close)
        objects = [array.array("d", range(1000)), Array("d", range(1000)),
                   collections.deque(range(1000)), Deque(range(1000)),
                   struct.Struct("i" * 100), decimal.Decimal("1" * 500),
                   reader, io.BufferedWriter(io.BytesIO()),
                   io.BufferedRandom(io.BytesIO())]
        snap = snapshot([objects])
        for obj in objects:
            with self.subTest(obj=type(obj).__name__):
                # __sizeof__ counts the same blocks, as asked for.
                self.assertGreaterEqual(snap.size(obj), sys.getsizeof(obj))

    @unittest.skipUnless(TRACKING, "needs --with-memory-tracking")
    def test_picklers_count_their_memos(self):
        # Not what their __sizeof__ adds for the objects they hold (the
        # pickler's output, the unpickler's stack): those have records.
        pickler = pickle.Pickler(io.BytesIO())
        unpickler = pickle.Unpickler(io.BytesIO())
        snap = snapshot([[pickler, unpickler]])
        # A new memo: 8 entries of 2 words, and 32 pointers.
        self.assertGreaterEqual(snap.size(pickler),
                                object.__sizeof__(pickler) + 8 * 16)
        self.assertGreaterEqual(snap.size(unpickler),
                                object.__sizeof__(unpickler) + 32 * 8)

    @unittest.skipUnless(TRACKING, "needs --with-memory-tracking")
    def test_core_types_count_the_blocks_they_own(self):
        _testcapi = import_helper.import_module("_testcapi")
        text = "\u00e9" * 10_000
        _testcapi.unicode_asutf8(text)      # makes its UTF-8 copy

        documented = type("Documented", (), {"__doc__": "d" * 10_000})

        def function():
            return 1

        # A copy: the function's code keeps what earlier runs gave it.
        code = function.__code__.replace()
        before = snapshot([code]).size(code)
        sys.monitoring.use_tool_id(MONITORING_TOOL, "test")
        self.addCleanup(sys.monitoring.free_tool_id, MONITORING_TOOL)
        sys.monitoring.set_local_events(MONITORING_TOOL, code,
                                        sys.monitoring.events.LINE)
        snap = snapshot([[text, documented, code]])
        self.assertGreaterEqual(snap.size(text), sys.getsizeof(text))
        # Its docstring copied for tp_doc, besides its dict and the str.
        self.assertGreaterEqual(snap.size(documented),
                                type.__sizeof__(documented) + 10_000)
        # Its monitoring data.
        self.assertGreater(snap.size(code), before)

    def test_class_counts_the_keys_its_instances_share(self):
        class Shared:
            pass

        snap = snapshot([Shared])
        # type.__sizeof__ counts the type and the keys its instances
        # share; the record has its dict besides.
        self.assertGreaterEqual(snap.size(Shared), type.__sizeof__(Shared))

    def test_static_objects(self):
        add = vars(int)["__add__"]
        snap = snapshot([[None, int]])
        if TRACKING:
            # Not allocated: nothing to count.
            self.assertEqual(snap.size(None), 0)
        else:
            self.assertEqual(snap.size(None), sys.getsizeof(None))
        # A static type's dict is reached through it, and folded into it.
        self.assertIn(snap.index(add), [n.index for n in snap.children(int)])

    def test_code_objects_reach_their_constants(self):
        def f():
            return "a constant only this code has"

        snap = snapshot()
        const = f.__code__.co_consts[1]
        self.assertEqual([n.index for n in snap.path(const)[-3:-1]],
                         [snap.index(f.__code__),
                          snap.index(f.__code__.co_consts)])

    def test_frames_are_roots(self):
        local = ["only a local of this frame"]
        snap = snapshot()
        path = snap.path(local)
        self.assertTrue(path[1].type.startswith("(thread "))
        self.assertEqual(path[-2].type,
                         "(frame) ObjectTests.test_frames_are_roots")

    def test_other_threads_frames_are_roots(self):
        ready = threading.Event()
        done = threading.Event()
        box = []

        def other():
            local = ["a local of another thread"]
            box.append(id(local))
            ready.set()
            done.wait()

        thread = threading.Thread(target=other)
        thread.start()
        try:
            ready.wait()
            snap = snapshot()
            index = snap._data.find(box[0])
            self.assertGreater(index, 0)
            path = [snap.node(i) for i in snap._data.path(index)]
            self.assertEqual(path[-2].type, "(frame) " + other.__qualname__)
        finally:
            done.set()
            thread.join()

    def test_why_names_each_step(self):
        holder = Base()
        holder.cache = {"entry": ["the value"]}
        snap = snapshot()
        lines = snap.why(holder.cache["entry"]).splitlines()
        self.assertEqual(lines[0], "(roots)")
        # A local of this frame; its attribute (from the folded __dict__);
        # the dict's key.
        self.assertIn(".holder -> ", lines[-3])
        self.assertTrue(lines[-2].startswith(
            "  .cache -> builtins.dict "), lines[-2])
        self.assertTrue(lines[-1].startswith(
            "  .entry -> builtins.list "), lines[-1])
        data = snap._data
        index = snap.index(holder.cache)
        self.assertEqual(data.edge_name(index, snap.index(
            holder.cache["entry"])), "entry")
        self.assertIsNone(data.edge_name(index, 0))

    def test_held_from_c(self):
        api = ctypes.PyDLL(None)        # prototypes of this test's own
        api.Py_IncRef.argtypes = [ctypes.py_object]
        api.Py_DecRef.argtypes = [ctypes.c_void_p]
        held = ["held only from C"]
        marker = id(held)
        api.Py_IncRef(held)
        del held
        try:
            snap = snapshot()
            index = snap._data.find(marker)
            self.assertGreater(index, 0)
            path = [snap.node(i) for i in snap._data.path(index)]
            self.assertEqual(path[1].type, "(held from C)")
            self.assertGreaterEqual(snap.info()["held_from_c"], 1)
        finally:
            api.Py_DecRef(marker)

    @unittest.skipUnless(hasattr(sys, "total_memory_used"),
                         "needs --with-memory-tracking to find objects "
                         "the collector does not track")
    def test_held_from_c_untracked(self):
        api = ctypes.PyDLL(None)
        api.Py_IncRef.argtypes = [ctypes.py_object]
        api.Py_DecRef.argtypes = [ctypes.c_void_p]
        text = "a str held only from C " + str(id(self))
        pair = (1.5, text)      # the collector untracks it: atomic items
        held = {"key": 10 ** 30}
        markers = [id(text), id(pair), id(held)]
        for obj in (text, pair, held):
            api.Py_IncRef(obj)
        del text, pair, held, obj
        gc.collect()
        try:
            snap = snapshot()
            for marker in markers:
                index = snap._data.find(marker)
                self.assertGreater(index, 0)
                path = [snap.node(i) for i in snap._data.path(index)]
                self.assertEqual(path[1].type, "(held from C)")
        finally:
            for marker in markers:
                api.Py_DecRef(marker)

    def test_snapshot_does_not_record_its_own_lists(self):
        snap = snapshot()
        # Its list of type names, which starts with its first record's.
        own = [o for o in gc.get_objects()
               if type(o) is list and o[:1] == ["(roots)"]]
        self.assertTrue(own)
        for names in own:
            self.assertEqual(snap._data.find(id(names)), -1)

    def test_garbage_is_counted_not_recorded(self):
        gc.collect()
        gc.disable()
        try:
            for _ in range(100):
                cycle = [bytes(1000)]
                cycle.append(cycle)
            marker = id(cycle)
            del cycle
            snap = snapshot()
            self.assertEqual(snap._data.find(marker), -1)
            info = snap.info()
            self.assertGreaterEqual(info["unreachable_objects"], 100)
            self.assertGreaterEqual(info["unreachable_bytes"], 100 * 56)
        finally:
            gc.enable()
            gc.collect()

    @unittest.skipUnless(TRACKING, "needs --with-memory-tracking")
    def test_garbage_counts_the_blocks_it_owns(self):
        gc.collect()
        gc.disable()
        try:
            cycle = [array.array("d", range(100_000))]
            cycle.append(cycle)
            del cycle
            info = snapshot().info()
            # The array's items, as a reachable array's size has them.
            self.assertGreaterEqual(info["unreachable_bytes"], 800_000)
        finally:
            gc.enable()
            gc.collect()

    def test_every_builtin_kind(self):
        # The scan visits each kind of object and keeps the interpreter
        # sound (checked further by the debug and sanitizer builds).
        def gen():
            yield 1

        async def coro():
            pass

        try:
            1 / 0
        except ZeroDivisionError as e:
            error = e
        c = coro()
        objects = [
            1, 1.5, 2j, 10**50, "s", b"b", bytearray(b"x"), (1,), [1],
            {1: 2}, {1}, frozenset({1}), range(10), slice(1, 2),
            memoryview(b"m"), gen(), c, gen.__code__, gen, len,
            [].append, Base().__init__, property(), classmethod(len),
            staticmethod(len), sys, error, error.__traceback__,
            weakref.ref(Base), array.array("i", [1]),
            collections.deque([1]), collections.OrderedDict(a=1),
            collections.defaultdict(list), sys._getframe(), iter([]),
            enumerate([]), zip(), map(len, []), super(Derived, Derived()),
            type("Dynamic", (), {}), NotImplemented, Ellipsis,
        ]
        snap = snapshot([objects])
        for obj in objects:
            snap.index(obj)
        c.close()


class ReconcileTests(unittest.TestCase):

    @unittest.skipUnless(TRACKING, "needs --with-memory-tracking")
    def test_total_memory_split(self):
        before = snapshot().reconcile()
        del before["snapshot"]
        buffer = bytearray(4 << 20)
        after = snapshot([buffer]).reconcile()
        self.assertEqual(after["total"], after["objects"]
                         + after["unreachable"] + after["snapshot"]
                         + after["outside_objects"])
        # The buffer is its bytearray's: among the objects, not outside.
        self.assertGreaterEqual(after["objects"] - before["objects"],
                                4 << 20)
        self.assertGreaterEqual(after["outside_objects"], 0)
        self.assertLess(after["outside_objects"]
                        - before["outside_objects"], 1 << 20)

    @unittest.skipIf(TRACKING, "a plain build's reconcile() is None")
    def test_plain_build_has_no_total(self):
        self.assertIsNone(snapshot().reconcile())


class DiffTests(unittest.TestCase):

    def test_ids_stable_and_diff(self):
        kept = [Base() for _ in range(10)]
        first = snapshot([kept])
        ids = {snapshot_id(first, o) for o in kept}
        gone = kept[5:]
        del kept[5:]
        gone_ids = {snapshot_id(first, o) for o in gone}
        del gone
        kept.extend(Derived() for _ in range(3))
        second = snapshot([kept])
        self.assertLessEqual({snapshot_id(second, o) for o in kept[:5]},
                             ids)
        rows = {row.type: row for row in second.diff(first)}
        self.assertEqual(rows[f"{__name__}.Derived"].new_count, 3)
        self.assertEqual(rows[f"{__name__}.Base"].gone_count, 5)
        self.assertGreater(rows[f"{__name__}.Base"].gone_size, 0)
        self.assertEqual(rows[f"{__name__}.Base"].new_count, 0)
        self.assertTrue(gone_ids.isdisjoint(
            {snapshot_id(second, o) for o in kept}))

    def test_ids_stable_when_walked_in_another_order(self):
        # A record is first matched with the one after the record matched
        # last; objects met in another order are found by address.
        items = [Base() for _ in range(50)]
        first = snapshot([items])
        ids = {id(o): snapshot_id(first, o) for o in items}
        items.reverse()
        items[10:10] = [Base() for _ in range(5)]
        second = snapshot([items], previous=first)
        self.assertEqual({id(o): snapshot_id(second, o) for o in items
                          if id(o) in ids}, ids)
        self.assertTrue(set(ids.values()).isdisjoint(
            snapshot_id(second, o) for o in items[10:15]))

    def test_address_reused_by_another_type(self):
        # Fresh classes of one layout: pymalloc gives the freed block to
        # the next object of its size.
        class Old:
            pass

        class New:
            pass

        obj = Old()
        first = snapshot([obj])
        old_id = snapshot_id(first, obj)
        address = id(obj)
        del obj
        for _ in range(1000):
            other = New()
            if id(other) == address:
                break
        else:
            self.skipTest("the address was not reused")
        second = snapshot([other], previous=first)
        self.assertNotEqual(snapshot_id(second, other), old_id)


def snapshot_id(snap, obj):
    return snap.node(snap.index(obj)).id


class ExportTests(unittest.TestCase):

    def setUp(self):
        self.dir = tempfile.mkdtemp()
        self.addCleanup(support.os_helper.rmtree, self.dir)
        self.r = graph()[0]
        self.snap = snapshot([self.r], graph_rules())

    def tearDown(self):
        del self.r, self.snap

    def test_heapsnapshot_structure(self):
        path = os.path.join(self.dir, "h.heapsnapshot")
        self.snap.write_heapsnapshot(path)
        with open(path) as f:
            data = json.load(f)
        self.assertEqual(list(data), ["snapshot", "nodes", "edges",
                                      "trace_function_infos", "trace_tree",
                                      "samples", "locations", "strings"])
        meta = data["snapshot"]["meta"]
        nfields = len(meta["node_fields"])
        self.assertEqual(meta["node_fields"][:6],
                         ["type", "name", "id", "self_size", "edge_count",
                          "trace_node_id"])
        nodes, edges = data["nodes"], data["edges"]
        self.assertEqual(data["snapshot"]["node_count"] * nfields,
                         len(nodes))
        self.assertEqual(data["snapshot"]["edge_count"] * 3, len(edges))
        self.assertEqual(sum(nodes[4::nfields]),
                         data["snapshot"]["edge_count"])
        self.assertEqual(data["strings"][nodes[1]], "(roots)")
        for target in edges[2::3]:
            self.assertEqual(target % nfields, 0)
            self.assertLess(target, len(nodes))
        names = [data["strings"][n] for n in nodes[1::nfields]]
        self.assertEqual(names.count(f"{__name__}.Node"), 5)

    def test_heapsnapshot_names_edges(self):
        holder = {"a_distinct_key": ["value"]}
        snap = snapshot([holder])
        path = os.path.join(self.dir, "names.heapsnapshot")
        snap.write_heapsnapshot(path)
        with open(path) as f:
            data = json.load(f)
        meta = data["snapshot"]["meta"]
        property_type = meta["edge_types"][0].index("property")
        name = data["strings"].index("a_distinct_key")
        nfields = len(meta["node_fields"])
        target = snap.index(holder["a_distinct_key"]) * nfields
        edges = data["edges"]
        self.assertIn([property_type, name, target],
                      [edges[i:i + 3] for i in range(0, len(edges), 3)])

    def test_summary_files(self):
        json_path = os.path.join(self.dir, "s.json")
        csv_path = os.path.join(self.dir, "s.csv")
        self.snap.write_summary(json_path)
        self.snap.write_summary(csv_path, "csv")
        with open(json_path) as f:
            data = json.load(f)
        node_row = [t for t in data["types"]
                    if t["type"] == f"{__name__}.Node"]
        self.assertEqual(node_row, [{"type": f"{__name__}.Node",
                                     "count": 5, "size": 500,
                                     "retained": 500}])
        with open(csv_path) as f:
            lines = f.read().splitlines()
        self.assertEqual(lines[0], "type,count,size,retained")
        self.assertIn(f"{__name__}.Node,5,500,500", lines)


class CommandLineTests(unittest.TestCase):

    def setUp(self):
        self.dir = tempfile.mkdtemp()
        self.addCleanup(support.os_helper.rmtree, self.dir)

    def run_script(self, source, *args):
        """Runs python -m profiling.heap run with args and a script of
        source, -o to a file in self.dir; returns (result, its path)."""
        script = os.path.join(self.dir, "prog.py")
        with open(script, "w") as f:
            f.write(source)
        out = os.path.join(self.dir, "h.heapsnapshot")
        res = script_helper.assert_python_ok(
            "-m", "profiling.heap", "run", "-o", out, *args, script)
        return res, out

    def test_run(self):
        res, out = self.run_script(
            "class Big:\n"
            "    def __init__(self):\n"
            "        self.data = [bytes(1000) for _ in range(1000)]\n"
            "keep = [Big() for _ in range(3)]\n",
            "--top", "50")
        err = res.err.decode()
        self.assertIn("__main__.Big", err)
        self.assertIn("objects scanned", err)
        self.assertTrue(os.path.getsize(out) > 0)

    @unittest.skipUnless(hasattr(signal, "SIGUSR1"), "needs SIGUSR1")
    def test_snapshot_at_a_signal_and_summary(self):
        summary = os.path.join(self.dir, "s.csv")
        _, out = self.run_script(
            "import os, signal\n"
            "early = [bytearray(100) for _ in range(10)]\n"
            "os.kill(os.getpid(), signal.SIGUSR1)\n"
            "late = 1\n",
            "--signal", "SIGUSR1", "--summary", summary)
        # At the signal, then at exit.
        self.assertTrue(os.path.getsize(out) > 0)
        self.assertTrue(os.path.getsize(out + ".1") > 0)
        with open(summary) as f:
            self.assertEqual(f.readline().strip(),
                             "type,count,size,retained")

    def test_bad_command_line(self):
        res = script_helper.assert_python_failure(
            "-m", "profiling.heap", "run", "--signal", "SIGNOPE", "x.py")
        self.assertIn(b"no signal named SIGNOPE", res.err)


class ThreadTests(unittest.TestCase):

    def test_snapshots_from_threads_while_others_mutate(self):
        stop = threading.Event()
        errors = []

        def mutate():
            data = []
            while not stop.is_set():
                data.append([Base()])
                if len(data) > 1000:
                    del data[:500]

        def take():
            try:
                for _ in range(5):
                    snap = snapshot()
                    snap.summary()
            except Exception as e:
                errors.append(e)

        mutators = [threading.Thread(target=mutate) for _ in range(2)]
        takers = [threading.Thread(target=take) for _ in range(3)]
        for t in mutators + takers:
            t.start()
        for t in takers:
            t.join()
        stop.set()
        for t in mutators:
            t.join()
        self.assertEqual(errors, [])


class ViewerTests(unittest.TestCase):
    """The .heapsnapshot, loaded by DevTools' own loader."""

    def test_devtools_loads_the_snapshot(self):
        from test.support import viewers
        r = graph()[0]
        snap = snapshot([r], graph_rules())
        with tempfile.TemporaryDirectory() as tmp:
            path = os.path.join(tmp, "h.heapsnapshot")
            snap.write_heapsnapshot(path)
            shown = viewers.devtools_heapsnapshot(path, timeout=120)
        self.assertEqual(shown["node_count"], len(snap))
        classes = {c["name"]: c for c in shown["classes"]}
        node = classes[f"{__name__}.Node"]
        self.assertEqual((node["count"], node["self_size"]), (5, 500))
        self.assertEqual(node["max_retained_size"],
                         snap.retained_size(r))


if __name__ == "__main__":
    unittest.main()
