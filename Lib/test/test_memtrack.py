"""Memory accounting by purpose (./configure --with-memory-tracking).

The functions exist only in a tracking build; test_sightglass_build checks
that they exist exactly there.
"""

import ctypes
import gc
import itertools
import operator
import struct
import sys
import sysconfig
import threading
import time
import unittest
import warnings
import weakref
from test import support
from test.support import import_helper, os_helper, script_helper

if not hasattr(sys, "total_memory_used"):
    raise unittest.SkipTest("not a --with-memory-tracking build")

POINTER = struct.calcsize("P")
GC_HEAD = 2 * POINTER
MANAGED_DICT = 1 << 4           # Py_TPFLAGS_MANAGED_DICT
HAVE_GC = 1 << 14               # Py_TPFLAGS_HAVE_GC
N = 10_000
_testcapi = import_helper.import_module("_testcapi")
ALLOCATOR = _testcapi.pymem_getallocatorsname()
# Debug hooks (a debug build's default) add 3 size_t to each block.
HOOKS = 3 * POINTER if ALLOCATOR.endswith("debug") else 0
# The C API with prototypes of this module's own: ctypes.pythonapi's are
# shared with every other test.
api = ctypes.PyDLL(None)
libc = ctypes.CDLL(None)
libc.malloc.restype = ctypes.c_void_p
libc.malloc.argtypes = [ctypes.c_size_t]
libc.malloc_usable_size.restype = ctypes.c_size_t
libc.malloc_usable_size.argtypes = [ctypes.c_void_p]
libc.free.argtypes = [ctypes.c_void_p]
# Without malloc_usable_size(), each block malloc() gives starts with what
# the block takes in all, in a prefix of alignof(max_align_t) bytes.
USABLE_SIZE = sysconfig.get_config_var("HAVE_MALLOC_USABLE_SIZE")
SIZE_PREFIX = 0 if USABLE_SIZE else 16


def reserved(pointer):
    """What the accounting counts for the block malloc() gave, handed out
    at pointer."""
    if USABLE_SIZE:
        return libc.malloc_usable_size(pointer)
    return ctypes.c_size_t.from_address(pointer - SIZE_PREFIX).value


def object_init(address, cls):
    """PyObject_Init(address, cls), as C code calls it on memory it holds.
    Nothing drops the reference it sets: take it back from a debug build's
    reference total."""
    api.PyObject_Init.restype = ctypes.c_void_p
    api.PyObject_Init.argtypes = [ctypes.c_void_p, ctypes.c_void_p]
    api.PyObject_Init(address, id(cls))
    if hasattr(sys, "gettotalrefcount"):
        ctypes.c_ssize_t.in_dll(api, "_Py_RefTotal").value -= 1


def block_size(nbytes):
    """What the allocator reserves for a request of nbytes.  (malloc() may
    reserve more: where an object is at hand, object_block() says what.)"""
    nbytes += HOOKS
    if ALLOCATOR.startswith("pymalloc"):
        if nbytes <= 512:
            return (nbytes + 15) // 16 * 16
        nbytes += HOOKS     # passed on to the raw domain, hooked as well
    if not USABLE_SIZE:
        return SIZE_PREFIX + nbytes
    probe = libc.malloc(nbytes)     # malloc's sizes depend on nothing else
    try:
        return libc.malloc_usable_size(probe)
    finally:
        libc.free(probe)


def pre_header(cls):
    """What the block of an instance of cls holds before the instance: the
    GC header and the managed dict's pointers, if it has them."""
    return ((GC_HEAD if cls.__flags__ & HAVE_GC else 0)
            + (2 * POINTER if cls.__flags__ & MANAGED_DICT else 0))


def instance_block(cls):
    """The block an instance of a plain class occupies, headers included."""
    return block_size(cls.__basicsize__ + pre_header(cls))


def object_block(obj):
    """What the allocator reserved for the block obj lies in.  pymalloc
    reserves the same for each request of a size, malloc() not always: a
    free chunk a little too large for a request, but too small to split,
    is handed out whole.  So malloc()'s are read from obj's own block."""
    size = sys.getsizeof(obj)       # headers included
    if ALLOCATOR.startswith("pymalloc") and size + HOOKS <= 512:
        return block_size(size)
    pre = pre_header(type(obj))
    # Debug hooks put 2 size_t before the block, at each domain they wrap.
    hooked = 2 if ALLOCATOR == "pymalloc_debug" else 1 if HOOKS else 0
    return reserved(id(obj) - pre - hooked * 2 * POINTER)


def objects_block(objs):
    """What the allocator reserved for these objects' blocks."""
    return sum(map(object_block, objs))


def fill_int_free_list():
    """Let ints of one digit die, more than the interpreter keeps for reuse
    (100): until as many are alive at once, such an int is made in a kept
    one's block, which its type's tally already counts."""
    ints = [1000 * POINTER + i for i in range(200)]
    del ints


def kept_for_reuse(value):
    """Whether an int of this value is kept for reuse when it dies: one of
    one or two digits.  Made from a C integer, as the readings are, such an
    int takes a kept one's block."""
    return abs(value) < 1 << (2 * sys.int_info.bits_per_digit)


def int_block(value):
    """What an int made after fill_int_free_list() adds to the total."""
    return 0 if kept_for_reuse(value) else object_block(value)


def read_together(total, snapshot):
    """Call total, then snapshot, when unpacked: with nothing in between
    but the int that holds the total (see int_block()).  No attribute
    lookup (it may evict a name from the type cache and free it), no switch
    to another thread (the unpacking calls both from C, without the eval
    loop)."""
    fill_int_free_list()
    return map(operator.call, (total, snapshot))


def delta(before, after):
    return {k: after.get(k, 0) - before.get(k, 0)
            for k in set(before) | set(after)
            if after.get(k, 0) != before.get(k, 0)}


class MemtrackTests(unittest.TestCase):

    def setUp(self):
        gc.collect()
        self.addCleanup(gc.enable)
        gc.disable()        # no collection between two readings

    def test_functions(self):
        self.assertIsInstance(sys.total_memory_used(), int)
        self.assertGreater(sys.total_memory_used(), 0)
        self.assertGreater(sys.total_allocation_count(), 0)
        usage = sys.type_memory_usage()
        self.assertIn("", usage)
        self.assertIn("<raw>", usage)
        self.assertIn("str", usage)
        for key, value in usage.items():
            self.assertIsInstance(key, str)
            self.assertIsInstance(value, int)
            self.assertGreaterEqual(value, 0, key)
        counts = sys.type_allocation_counts()
        self.assertEqual(set(counts) - set(usage), set())
        for key, value in counts.items():
            self.assertGreaterEqual(value, 0, key)
        by_type = sys.type_memory_usage(by_type=True)
        self.assertIn(str, by_type)
        self.assertIn("", by_type)
        with self.assertRaises(TypeError):
            sys.type_memory_usage(True)
        with self.assertRaises(TypeError):
            sys.total_memory_used(1)

    def test_tags_add_up_to_the_total(self):
        for _ in range(5):
            self.check_tags_add_up()

    def check_tags_add_up(self):
        """Check the tags against the totals; return the snapshot."""
        total, usage = read_together(sys.total_memory_used,
                                     sys.type_memory_usage)
        self.assertEqual(sum(usage.values()), total + int_block(total))
        blocks, counts = read_together(sys.total_allocation_count,
                                       sys.type_allocation_counts)
        self.assertEqual(sum(counts.values()),
                         blocks + (not kept_for_reuse(blocks)))
        return usage

    def test_instances_count_under_their_class(self):
        class Sightglass_Slotted:
            __slots__ = ("a",)
        name = Sightglass_Slotted.__name__
        objs = [Sightglass_Slotted() for _ in range(N)]
        self.assertEqual(sys.type_memory_usage()[name], objects_block(objs))
        self.assertEqual(sys.type_allocation_counts()[name], N)
        del objs
        self.assertNotIn(name, sys.type_memory_usage())
        self.assertNotIn(name, sys.type_allocation_counts())

    def test_instances_own_their_values(self):
        # 3.11 gives a plain class's instances a values array at once, of
        # a size that varies: at least 16 bytes each.
        class Sightglass_Foo:
            pass
        name = Sightglass_Foo.__name__
        objs = [Sightglass_Foo() for _ in range(N)]
        self.assertGreaterEqual(sys.type_memory_usage()[name],
                                N * (instance_block(Sightglass_Foo) + 16))
        self.assertEqual(sys.type_allocation_counts()[name], 2 * N)
        del objs
        self.assertNotIn(name, sys.type_memory_usage())

    def test_types_sharing_a_name(self):
        def make():
            class Twin:
                __slots__ = ("a",)
            return Twin
        first, second = make(), make()
        a = [first() for _ in range(10)]
        b = [second() for _ in range(20)]
        by_type = sys.type_memory_usage(by_type=True)
        self.assertEqual(by_type[first], objects_block(a))
        self.assertEqual(by_type[second], objects_block(b))
        self.assertEqual(sys.type_memory_usage()["Twin"],
                         objects_block(a + b))
        self.assertEqual(sys.type_allocation_counts(by_type=True)[second],
                         20)
        del a, b

    def test_dead_class_leaves_no_entry(self):
        def churn():
            class Ephemeral:
                pass
            keep = [Ephemeral() for _ in range(100)]
            return len(keep)
        for _ in range(3):
            churn()
            gc.collect()
        self.assertNotIn("Ephemeral", sys.type_memory_usage())

    def test_many_classes_come_and_go(self):
        # The table of types grows, and loses entries from the middle of
        # its probe chains: every class still finds its tally.
        classes = [type(f"Many{i}", (), {"__slots__": ()})
                   for i in range(3000)]
        instances = [[cls() for _ in range(i % 5 + 1)]
                     for i, cls in enumerate(classes)]
        del classes[::2], instances[::2]
        gc.collect()
        counts = sys.type_allocation_counts(by_type=True)
        for cls, objs in zip(classes, instances):
            self.assertEqual(counts.get(cls), len(objs), cls)
        gone = {f"Many{i}" for i in range(0, 3000, 2)}
        self.assertFalse(gone & set(sys.type_memory_usage()))
        usage = sys.type_memory_usage(by_type=True)
        for cls, objs in zip(classes, instances):
            self.assertEqual(usage[cls], objects_block(objs), cls)

    def test_class_assignment_moves_the_block(self):
        class A:
            __slots__ = ()

        class B:
            __slots__ = ()
        objs = [A() for _ in range(50)]
        for o in objs:
            o.__class__ = B
        del o
        usage = sys.type_memory_usage(by_type=True)
        self.assertNotIn(A, usage)
        self.assertEqual(usage[B], objects_block(objs))
        del objs, usage
        self.assertNotIn(B, sys.type_memory_usage(by_type=True))

    def test_changes_after_a_reading(self):
        # A reading remembers what each pool held: whatever changes a pool
        # since (a class assigned, a block freed or handed out again) makes
        # the next reading look into it again.
        class A:
            __slots__ = ()

        class B:
            __slots__ = ()
        objs = [A() for _ in range(1000)]
        self.assertEqual(sys.type_allocation_counts(by_type=True)[A], 1000)
        for o in objs:
            o.__class__ = B
        del o
        counts = sys.type_allocation_counts(by_type=True)
        self.assertNotIn(A, counts)
        self.assertEqual(counts[B], 1000)
        del objs[::2], counts
        self.assertEqual(sys.type_allocation_counts(by_type=True)[B], 500)
        objs.extend(A() for _ in range(500))
        counts = sys.type_allocation_counts(by_type=True)
        self.assertEqual((counts[A], counts[B]), (500, 500))
        del objs, counts
        counts = sys.type_allocation_counts(by_type=True)
        self.assertNotIn(A, counts)
        self.assertNotIn(B, counts)

    def test_few_changes_in_many_pools(self):
        # In a pool where few blocks changed since the reading before, the
        # next reading looks at those alone, from what it saw in each.
        # Here every change comes one or two to a pool: a class assigned,
        # an object freed, a block handed out again for an object, and for
        # data (a list's items, which share the objects' size class).
        class Sightglass_A:
            __slots__ = ()

        class Sightglass_B:
            __slots__ = ()

        def counts():
            c = sys.type_allocation_counts(by_type=True)
            return c.get(Sightglass_A, 0), c.get(Sightglass_B, 0)
        n, step = 20_000, 500
        objs = [Sightglass_A() for _ in range(n)]
        self.assertEqual(counts(), (n, 0))
        for i in range(0, n, step):
            objs[i].__class__ = Sightglass_B
        changed = n // step
        self.assertEqual(counts(), (n - changed, changed))
        for i in range(step // 2, n, step):
            objs[i] = None
        self.assertEqual(counts(), (n - 2 * changed, changed))
        for i in range(step // 2, n, step):
            objs[i] = Sightglass_A()
        self.assertEqual(counts(), (n - changed, changed))
        for i in range(step // 4, n, step):
            objs[i] = None
        items = -(-Sightglass_A.__basicsize__ // POINTER)
        bufs = [[None] * items for _ in range(changed)]
        self.assertEqual(counts(), (n - 2 * changed, changed))
        del bufs
        for i in range(step // 4, n, step):
            objs[i] = Sightglass_A()
        self.assertEqual(counts(), (n - changed, changed))
        del objs[::step]
        self.assertEqual(counts(), (n - changed, 0))
        del objs
        self.assertEqual(counts(), (0, 0))

    @unittest.skipUnless(ALLOCATOR.startswith("pymalloc"), "needs pymalloc")
    def test_pool_back_from_another_size_class(self):
        # Between two readings a pool with a few blocks empties, serves
        # another size class for two blocks, empties again and comes back
        # to its first class.  Its memo's size is right again, but a block
        # noted meanwhile lies off the class's grid: the reading must look
        # into the pool whole.  A wrong look shows in the debug build,
        # whose reading asserts that noted blocks are on the grid and then
        # checks every tally against a full walk.
        api.PyObject_Malloc.restype = ctypes.c_void_p
        api.PyObject_Malloc.argtypes = [ctypes.c_size_t]
        api.PyObject_Free.argtypes = [ctypes.c_void_p]
        pool_size = 1 << (14 if POINTER == 8 else 12)
        before = 2 * POINTER if HOOKS else 0
        # Two rare size classes, one's blocks off the other's grid.
        size_a, size_b = 480, 496
        # Fixed, so that a list's growth takes no block of those classes.
        held = [None] * 4096
        count = 0

        def alloc(size):
            nonlocal count
            held[count] = api.PyObject_Malloc(size - HOOKS)
            count += 1
            return held[count - 1] - before

        def release(block):
            i = held.index(block + before)
            api.PyObject_Free(held[i])
            held[i] = None

        def own_new_pool(size):
            # Blocks of size until a pool set up anew is filled with them
            # alone, in order: then no pool of the class has room.
            for _ in range(100):
                first = alloc(size)
                if first % pool_size >= size:
                    continue
                blocks = [first]
                while len(blocks) < (pool_size - first % pool_size) // size:
                    blocks.append(alloc(size))
                    if blocks[-1] != blocks[-2] + size:
                        break
                else:
                    return blocks
            self.fail(f"no pool of {size}-byte blocks was set up")

        try:
            own_new_pool(size_b)
            blocks = own_new_pool(size_a)
            for b in blocks[1:]:
                release(b)
            sys.type_memory_usage()
            release(blocks[0])
            # Emptied, the pool is the first to be set up again.
            b1, b2 = alloc(size_b), alloc(size_b)
            self.assertEqual((b1, b2), (blocks[0], blocks[0] + size_b))
            release(b1)
            release(b2)
            self.assertEqual(alloc(size_a), blocks[0])
            sys.type_memory_usage()
        finally:
            for p in held:
                if p is not None:
                    api.PyObject_Free(p)

    @support.skip_if_sanitizer("AddressSanitizer's malloc() does not give a"
                               " freed block back soon", address=True)
    def test_class_made_where_a_dead_class_was(self):
        # A reading remembers the pools of a class's instances.  The class
        # and its instances die, and a new class is made at its address,
        # before the next reading: the instances' pools, looked into again,
        # take nothing from the new class.
        def make(name):
            return type(name, (), {"__slots__": ()})
        reused = 0
        for _ in range(20):
            old = make("Sightglass_Old")
            objs = [old() for _ in range(500)]
            self.assertEqual(
                sys.type_allocation_counts(by_type=True)[old], 500)
            address = id(old)
            del objs, old
            gc.collect()
            new = make("Sightglass_New")
            if id(new) != address:
                continue
            reused += 1
            objs = [new() for _ in range(7)]
            counts = sys.type_allocation_counts(by_type=True)
            self.assertEqual(counts[new], 7)
            self.assertNotIn("Sightglass_Old", sys.type_allocation_counts())
            del objs, new, counts
        # malloc() gives a freed block back for the next request of its
        # size, most of the time.
        self.assertGreater(reused, 0)

    @support.skip_if_sanitizer("AddressSanitizer's malloc() does not give a"
                               " freed block back soon", address=True)
    def test_values_of_a_class_made_where_the_last_owner_was(self):
        # Claims remember the last class they found a tally for: an
        # instance's values are claimed for its class.  The remembered
        # class dies, then a class of another size (its type object has
        # slots), whose tally the next class takes: that class, made at
        # the remembered class's address, must have its instances' values
        # count under its own tally.  (The test catches a remembered class
        # left in place only when nothing claims for another class between
        # the deaths, and the freed tallies are taken last in, first out.)
        def make(name, slots=None):
            ns = {} if slots is None else {"__slots__": slots}
            return type(name, (), ns)

        def init(self):
            self.x, self.y, self.z = 1, 2, 3

        reused = 0
        for _ in range(20):
            bigger = make("Sightglass_Bigger", [f"s{i}" for i in range(30)])
            last = make("Sightglass_Last")
            last.__init__ = init
            objs = [last() for _ in range(10)]
            address = id(last)
            del objs, last
            gc.collect()        # the last owner dies, then the other
            del bigger
            gc.collect()
            new = make("Sightglass_New")
            if id(new) != address:
                continue
            reused += 1
            new.__init__ = init
            block = instance_block(new)
            objs = [new() for _ in range(N)]
            usage = sys.type_memory_usage()
            self.assertGreaterEqual(usage["Sightglass_New"],
                                    N * (block + 3 * POINTER))
            self.assertNotIn("Sightglass_Last", usage)
            del objs, new, usage
        self.assertGreater(reused, 0)

    def test_arenas_given_back_and_made_again(self):
        # Between two readings, arenas fill, empty and are made again, at
        # the same indexes, many times over: each time their pools are
        # listed as changed again (until the list is given up for a look
        # into every pool).  The reading after counts what is there.
        before = sys.type_allocation_counts()["bytes"]
        for _ in range(40):
            objs = [bytes(400) for _ in range(20_000)]     # 9 arenas
            del objs
        objs = [bytes(400) for _ in range(100)]
        self.assertEqual(sys.type_allocation_counts()["bytes"], before + 100)
        del objs

    def test_finalizer_assigning_class(self):
        class A:
            __slots__ = ()

            def __del__(self):
                self.__class__ = B

        class B(A):
            __slots__ = ()
        for _ in range(100):
            A()
        usage = sys.type_memory_usage(by_type=True)
        self.assertNotIn(A, usage)
        self.assertNotIn(B, usage)

    def test_resurrection(self):
        saved = []

        class Phoenix:
            __slots__ = ("__weakref__",)

            def __del__(self):
                saved.append(self)
        for _ in range(10):
            Phoenix()
        self.assertEqual(sys.type_memory_usage(by_type=True)[Phoenix],
                         objects_block(saved))
        saved.clear()       # finalizers run once: now they go for good
        self.assertNotIn(Phoenix, sys.type_memory_usage(by_type=True))

    def test_trashcan(self):
        # Deleting a long chain defers most deallocations (the trashcan);
        # a deferred finalizer may still assign __class__.  In a process
        # of its own: in regrtest's, this chain did not reach the
        # deferred path (not looked into further).
        code = """if 1:
            import sys
            class Link:
                __slots__ = ("next",)
                def __del__(self):
                    self.__class__ = Spent
            class Spent(Link):
                __slots__ = ()
            head = None
            for _ in range(10_000):
                link = Link()
                link.next, head = head, link
            del link
            print(sys.type_memory_usage(by_type=True)[Link])
            del head
            usage = sys.type_memory_usage(by_type=True)
            print(usage.get(Link, 0), usage.get(Spent, 0))
        """
        res = script_helper.assert_python_ok("-c", code)
        alive, dead = res.out.decode().splitlines()
        self.assertGreater(int(alive), 0)
        self.assertEqual(dead, "0 0")

    def test_trashcan_reusing_a_kept_block(self):
        # A deallocator may keep its object's block on a free list and then
        # run the trashcan's deferred deallocations, whose finalizers can
        # take the block and free it for good.  Under the debug hooks,
        # asking the allocator for the size of a freed block is fatal.
        code = """if 1:
            import gc, sys
            class Ouch:
                n = 0
                def __del__(self):
                    Ouch.n += 1
                    if Ouch.n % 17 == 0:
                        gc.collect()    # also frees the kept blocks
            gc.collect()
            before = sys.type_memory_usage()
            for _ in range(2):
                t, l = (), []
                for i in range(150):
                    t, l = (t, Ouch()), [l, Ouch()]
                del t, l
            gc.collect()
            after = sys.type_memory_usage()
            print([after.get(k, 0) - before.get(k, 0)
                   for k in ("tuple", "list", "Ouch")])
        """
        res = script_helper.assert_python_ok("-c", code, PYTHONMALLOC="debug")
        self.assertEqual(res.out.strip(), b"[0, 0, 0]")

    def test_free_list_reuse(self):
        # Ints of one digit, floats, tuples and lists are kept for reuse
        # when they die.  A kept object still counts under its type (its
        # block is still allocated, for it), and the next object takes it
        # up again.
        for make, name in ((lambda i: 1000 * POINTER + i, "int"),
                           (lambda i: i + 0.5, "float"),
                           (lambda i: (i, i), "tuple"),
                           (lambda i: [], "list")):
            with self.subTest(name):
                # Room for the readings' ints, and make()'s temporary one.
                fill_int_free_list()
                objs = [make(i) for i in range(50)]
                objs[:] = [None] * 50       # now at least 50 are kept
                before = sys.type_allocation_counts()[name]
                for _ in range(3):
                    for i in range(50):
                        objs[i] = make(i)
                    self.assertEqual(sys.type_allocation_counts()[name],
                                     before)
                    objs[:] = [None] * 50
                    self.assertEqual(sys.type_allocation_counts()[name],
                                     before)
                gc.collect()                # empties the free lists
                self.assertLess(sys.type_allocation_counts().get(name, 0),
                                before - 40)

    def test_objects_in_blocks_that_held_data(self):
        # A block that held data holds an object once freed and handed out
        # again, and the object counts, however the data went: an
        # anonymous buffer given back by PyMem_Free(), buffers freed by
        # their owners, moved by a reallocation, or freed by their owners
        # under tracemalloc (which wraps the allocator: its frees are no
        # claims').
        class Sightglass_Reborn:
            __slots__ = ()
        name = Sightglass_Reborn.__name__
        size = pre_header(Sightglass_Reborn) + Sightglass_Reborn.__basicsize__
        # A list of as many items owns a buffer of the instances' size.
        items = size // POINTER
        api.PyMem_Malloc.restype = ctypes.c_void_p
        api.PyMem_Malloc.argtypes = [ctypes.c_size_t]
        api.PyMem_Free.argtypes = [ctypes.c_void_p]
        tracemalloc = import_helper.import_module("tracemalloc")

        def anonymous():
            blocks = [api.PyMem_Malloc(size) for _ in range(N)]
            for p in blocks:
                api.PyMem_Free(p)

        def owned():
            lists = [[None] * items for _ in range(N)]
            del lists

        def moved():
            # The first append makes a buffer of four items, the fifth moves
            # them to a larger one.
            self.assertEqual(items, 4)
            lists = [[] for _ in range(N)]
            for lst in lists:
                for _ in range(items + 1):
                    lst.append(None)
            del lists

        def owned_under_tracemalloc():
            lists = [[None] * items for _ in range(N)]
            tracemalloc.start()
            try:
                del lists
            finally:
                tracemalloc.stop()

        for free in (anonymous, owned, moved, owned_under_tracemalloc):
            with self.subTest(free.__name__):
                free()
                before = sys.type_allocation_counts().get(name, 0)
                objects = [Sightglass_Reborn() for _ in range(N)]
                after = sys.type_allocation_counts().get(name, 0)
                self.assertEqual(after - before, N)
                del objects

    def test_block_of_a_dead_object_reused_as_a_buffer(self):
        # A freed block may be handed out again for data.  Taken up by a
        # buffer, it must not be read as an object: here the buffer holds,
        # where the object's type was, a class that never has instances.
        class Sightglass_Dead:
            __slots__ = ("a",)

        class Sightglass_Never:
            pass
        # Item arrays that fill the instances' blocks: their size rounded
        # up to pymalloc's 16 bytes.  (malloc()'s sizes, under
        # PYTHONMALLOC=malloc, are not to be found by probing it: see
        # object_block().)
        size = Sightglass_Dead.__basicsize__ + pre_header(Sightglass_Dead)
        items = -(-size // 16) * 16 // POINTER
        objs = [Sightglass_Dead() for _ in range(N)]
        del objs
        bufs = [[Sightglass_Never] * items for _ in range(N)]
        counts = sys.type_allocation_counts()
        self.assertNotIn(Sightglass_Dead.__name__, counts)
        self.assertNotIn(Sightglass_Never.__name__, counts)
        del bufs

    def test_buffer_block_reused_for_an_object(self):
        # The other way round: a block that held data holds an object now.
        # Buffers of 41 bytes and ints of three digits (36 bytes, and too
        # large to be kept for reuse) share a size class.
        bufs = [bytearray(40) for _ in range(N)]
        large = 1 << (2 * sys.int_info.bits_per_digit + 10)
        fill_int_free_list()
        before = sys.type_allocation_counts()["int"]
        del bufs
        ints = [large + i for i in range(N)]    # in the buffers' blocks
        # ... and `before`, an int too.
        self.assertEqual(sys.type_allocation_counts()["int"],
                         before + N + (not kept_for_reuse(before)))
        del ints

    def test_pool_reused_for_another_size(self):
        # A pool whose blocks are all freed may serve another size class,
        # whose blocks start where the old ones did every so often.  The
        # old blocks held data (bytearray buffers of 31 bytes); none of the
        # new ones must be taken for data.
        class Sightglass_Fresh:
            pass
        keep, old = [], []
        for i in range(100_000):
            old.append(bytearray(30))
            if i % 100 == 0:
                keep.append(bytes(400))     # a pool of these in each arena
        del old
        objs = [Sightglass_Fresh() for _ in range(N)]
        counts = sys.type_allocation_counts()
        self.assertEqual(counts[Sightglass_Fresh.__name__], 2 * N)
        del objs, keep

    def collect_often(self, callback):
        """Until gc.disable(), a collection, with callback, at every second
        object with a GC header allocated (not taken from a free list), or
        later where such objects are freed between."""
        self.addCleanup(gc.set_threshold, *gc.get_threshold())
        self.addCleanup(gc.callbacks.remove, callback)
        gc.callbacks.append(callback)
        gc.set_threshold(1)
        gc.enable()

    def test_objects_made_after_other_allocations(self):
        # A collection can run between the allocation of an object's block
        # and the object's making, and allocate; so can any C code.  The
        # block is taken for data then, until the object is made in it.
        class Sightglass_Late:
            pass

        def callback(phase, info):      # info: a dict made for each call
            pass
        self.collect_often(callback)
        objs = [Sightglass_Late() for _ in range(1000)]
        gc.disable()
        self.assertEqual(
            sys.type_allocation_counts()[Sightglass_Late.__name__], 2000)
        del objs

    def test_objects_made_after_a_walk(self):
        # An object with a GC header is named in its block's place before
        # the collection its allocation may start; a reading in that
        # collection must take the block for data, until the object is
        # made in it.  Instances are made by _PyType_AllocNoTrack(), list
        # iterators by gc_alloc().
        class Sightglass_Walked:
            pass

        def callback(phase, info):
            if phase == "start":
                sys.type_allocation_counts()
        lists = [[] for _ in range(300)]
        before = sys.type_allocation_counts().get("list_iterator", 0)
        self.collect_often(callback)
        objs = [Sightglass_Walked() for _ in range(300)]
        its = [iter(x) for x in lists]
        gc.disable()
        counts = sys.type_allocation_counts()
        # Each instance, and its values.
        self.assertEqual(counts[Sightglass_Walked.__name__], 600)
        self.assertEqual(counts["list_iterator"] - before, 300)
        self.check_tags_add_up()
        del objs, its, lists

    def test_block_freed_before_its_use_is_known(self):
        # C code may free the block it allocated last before anything else
        # is allocated: the next allocation must not take it for data then.
        # This test function reallocates a block of 42 bytes to 200 and
        # frees it, with nothing in between.
        before = sys.type_allocation_counts()["bytes"]
        _testcapi.test_pyobject_setallocators()
        objs = [bytes(200 - 33) for _ in range(100)]    # one in that block
        self.assertEqual(sys.type_allocation_counts()["bytes"], before + 100)
        del objs

    def test_data_holding_a_type_is_not_an_object(self):
        # A block of data may hold, where an object would keep its type, the
        # address of one: C code's array of objects, say.  It is anonymous
        # memory all the same.
        class Sightglass_Held:
            pass
        api.PyMem_Malloc.restype = ctypes.c_void_p
        api.PyMem_Malloc.argtypes = [ctypes.c_size_t]
        api.PyMem_Free.argtypes = [ctypes.c_void_p]
        size = 6 * POINTER
        words = ctypes.c_void_p * 6
        blocks = [api.PyMem_Malloc(size) for _ in range(100)]
        try:
            for p in blocks:
                # Every place where the walk may look for a type.
                words.from_address(p)[:] = [id(Sightglass_Held)] * 6
            counts = sys.type_allocation_counts()
            self.assertNotIn(Sightglass_Held.__name__, counts)
            self.check_tags_add_up()
        finally:
            for p in blocks:
                api.PyMem_Free(p)

    def test_list_items_count_under_list(self):
        before = sys.type_memory_usage()["list"]
        big = [None] * 10**6
        grown = sys.type_memory_usage()["list"] - before
        self.assertGreaterEqual(grown, 8 * 10**6)
        self.assertLess(grown, 8 * 10**6 + 64 * 1024)
        del big
        gc.collect()        # the list object may be kept for reuse
        self.assertLessEqual(sys.type_memory_usage()["list"], before)

    def test_growing_list_moves_bytes_without_leaking(self):
        before = sys.type_memory_usage()["list"]
        lst = []
        for i in range(100_000):
            lst.append(i)
        self.assertGreaterEqual(sys.type_memory_usage()["list"] - before,
                                8 * 100_000)
        while lst:
            lst.pop()
        lst.clear()
        del lst
        gc.collect()        # the list object may be kept for reuse
        self.assertLessEqual(sys.type_memory_usage()["list"], before + 64)

    def check_owned(self, make, name, min_size):
        """make() builds one object owning at least min_size bytes: they
        count under name, not as anonymous memory, and come back."""
        usage = sys.type_memory_usage()
        before, anonymous = usage.get(name, 0), usage[""]
        del usage
        obj = make()
        usage = sys.type_memory_usage()
        self.assertGreaterEqual(usage[name] - before, min_size)
        self.assertLess(usage[""] - anonymous, min_size // 20)
        del obj, usage
        self.assertLess(sys.type_memory_usage().get(name, 0) - before,
                        4096)

    def test_owned_buffers(self):
        n = 100_000
        self.check_owned(lambda: {i: None for i in range(n)}, "dict",
                         n * 3 * POINTER)
        self.check_owned(lambda: set(range(n)), "set", n * 2 * POINTER)
        self.check_owned(lambda: frozenset(range(n)), "frozenset",
                         n * 2 * POINTER)
        self.check_owned(lambda: bytearray(10**6), "bytearray", 10**6)
        self.check_owned(lambda: bytearray(b"x") * 10**6, "bytearray",
                         10**6)

    def test_deque_blocks_count_under_deque(self):
        collections = import_helper.import_module("collections")
        n = 100_000

        class Sub(collections.deque):
            pass
        for cls in collections.deque, Sub:
            self.check_owned(lambda: cls(itertools.repeat(None, n)), "deque",
                             n * POINTER)

    def test_io_buffers_count_under_buffered_io(self):
        io = import_helper.import_module("io")
        size = 2**20
        with open(__file__, "rb") as f:
            fd = f.fileno()
            self.check_owned(lambda: open(fd, "rb", buffering=size,
                                          closefd=False),
                             "_BufferedIOBase", size)
        self.check_owned(lambda: io.BufferedWriter(io.BytesIO(), size),
                         "_BufferedIOBase", size)
        self.check_owned(lambda: io.BufferedRandom(io.BytesIO(), size),
                         "_BufferedIOBase", size)

    def test_struct_formats_count_under_struct(self):
        struct = import_helper.import_module("struct")
        # Each code of the format is a pointer and three sizes.
        self.check_owned(lambda: struct.Struct("bh" * 2000), "Struct",
                         4000 * 4 * POINTER)

    def test_decimal_digits_count_under_decimal(self):
        decimal = import_helper.import_module("decimal")
        if not hasattr(decimal, "__libmpdec_version__"):
            self.skipTest("the pure Python decimal keeps its digits in ints")
        # 100,000 digits take 19 to a 64-bit word.
        self.check_owned(lambda: decimal.Decimal("7" * 100_000), "Decimal",
                         100_000 // 19 * 8)

    def test_pickle_memos_count_under_pickler_and_unpickler(self):
        pickle = import_helper.import_module("_pickle")
        io = import_helper.import_module("io")
        n = 50_000
        items = [[i] for i in range(n)]
        data = pickle.dumps(items)
        wide = pickle.dumps(tuple(range(n)))

        class SubPickler(pickle.Pickler):
            pass

        def pickled(cls):
            pickler = cls(io.BytesIO())
            pickler.dump(items)         # its memo keeps an entry per list
            return pickler

        def unpickled(data):
            unpickler = pickle.Unpickler(io.BytesIO(data))
            unpickler.load()            # so does its memo
            return unpickler
        # A pickler's memo entry is a key and a value.
        self.check_owned(lambda: pickled(pickle.Pickler), "Pickler",
                         n * 2 * POINTER)
        self.check_owned(lambda: pickled(SubPickler), "Pickler",
                         n * 2 * POINTER)
        self.check_owned(lambda: unpickled(data), "Unpickler", n * POINTER)
        # A tuple's items wait on the unpickler's stack, which keeps its
        # size.
        self.check_owned(lambda: unpickled(wide), "Pdata", n * POINTER)
        # Protocol 0 reads lines; the unpickler keeps a copy of the last
        # (here a str's, its UNICODE opcode, before STOP).
        long_line = b"V" + b"x" * 100_000 + b"\n."
        self.check_owned(lambda: unpickled(long_line), "Unpickler",
                         100_000)

    def test_re_matching_space_counts_under_pattern(self):
        re = import_helper.import_module("re")
        # Each pass through the group leaves a context on the matcher's
        # stack, which a scanner keeps after its match, with its marks.
        pattern = re.compile(r"(?:(ab)|cd)*e")
        text = "ab" * 50_000 + "e"

        def matched():
            scanner = pattern.scanner(text)
            self.assertIsNotNone(scanner.search())
            return scanner
        self.check_owned(matched, "Pattern", 50_000 * POINTER)

    def test_join_arrays_count_under_bytes_and_bytearray(self):
        # A join of many parts keeps an array of their buffers (a Py_buffer
        # each, ten words here) while it copies them, and copies a large
        # result with the GIL released: another thread, reading then, sees
        # the array with the result, not as anonymous memory.
        parts = [b"x" * 64] * 200_000
        array = len(parts) * 8 * POINTER
        for sep, name in (b"", "bytes"), (bytearray(), "bytearray"):
            with self.subTest(name):
                before = sys.type_memory_usage()
                readings = []
                done = threading.Event()

                def read():
                    while not done.is_set():
                        usage = sys.type_memory_usage()
                        readings.append((usage[name] - before[name],
                                         usage[""] - before[""]))
                reader = threading.Thread(target=read)
                reader.start()
                try:
                    for _ in range(100):
                        sep.join(parts)
                        if any(owned >= array + 64 * len(parts)
                               for owned, _ in readings):
                            break
                    else:
                        self.fail(f"no reading saw the array under {name}")
                finally:
                    done.set()
                    reader.join()
                self.assertLess(max(anonymous for _, anonymous in readings),
                                array // 20)

    def test_utf8_copies_count_under_str(self):
        api.PyUnicode_AsUTF8.restype = ctypes.c_void_p
        api.PyUnicode_AsUTF8.argtypes = [ctypes.py_object]

        def with_utf8(text):
            api.PyUnicode_AsUTF8(text)      # made once, kept with the str
            return text
        n = 100_000
        # The text's own n bytes, and its UTF-8 copy's 2n.
        self.check_owned(lambda: with_utf8("\xe9" * n), "str", 3 * n)

    def test_wchar_copies_count_under_str(self):
        api.PyUnicode_AsUnicodeAndSize.restype = ctypes.c_void_p
        api.PyUnicode_AsUnicodeAndSize.argtypes = [ctypes.py_object,
                                                   ctypes.c_void_p]

        def with_wstr(text):
            # Deprecated, but it still keeps a wchar_t copy with the str.
            api.PyUnicode_AsUnicodeAndSize(text, None)
            return text
        n = 100_000
        wchar = ctypes.sizeof(ctypes.c_wchar)
        # (Other strings may come and go meanwhile: bounds with a margin.)
        self.check_owned(lambda: with_wstr("\xe9" * n), "str", n * wchar)
        # A legacy string, made empty and filled through its wchar_t
        # copy; then made ready, its characters apart from it.
        api.PyUnicode_FromUnicode.restype = ctypes.py_object
        api.PyUnicode_FromUnicode.argtypes = [ctypes.c_void_p,
                                              ctypes.c_ssize_t]
        api.PyUnicode_AsUnicode.restype = ctypes.c_void_p
        api.PyUnicode_AsUnicode.argtypes = [ctypes.py_object]
        wide = ctypes.create_unicode_buffer("\xe9" * n)

        def legacy(ready):
            # Not warned: the warning would load this file's lines.
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", DeprecationWarning)
                text = api.PyUnicode_FromUnicode(None, n)
            ctypes.memmove(api.PyUnicode_AsUnicode(text), wide, n * wchar)
            if ready:
                self.assertEqual(text, "\xe9" * n)
            return text
        self.check_owned(lambda: legacy(False), "str", n * (wchar - 1))
        self.check_owned(lambda: legacy(True), "str", n * 9 // 10)

    def test_str_subclass_characters_count_under_str(self):
        class Name(str):
            pass
        n = 100_000
        # A subclass's instance keeps its characters apart.
        self.check_owned(lambda: Name("x" * n), "str", n)

    def test_class_docstrings_count_under_type(self):
        doc = "x" * 100_000
        usage = sys.type_memory_usage()
        before, anonymous = usage["type"], usage[""]
        del usage
        cls = type("Documented", (), {"__doc__": doc})
        usage = sys.type_memory_usage()
        self.assertGreaterEqual(usage["type"] - before, len(doc))
        self.assertLess(usage[""] - anonymous, 4096)
        del cls, usage
        gc.collect()
        self.assertLess(sys.type_memory_usage()["type"] - before, 4096)

    def test_anonymous_share_of_a_realistic_program(self):
        # The json and re test suites: the memory nothing claimed stays
        # under 1% of the total, before and after.
        code = """if True:
            import io, sys, unittest
            def share():
                usage = sys.type_memory_usage()
                return usage[""] / sum(usage.values())
            suite = unittest.defaultTestLoader.loadTestsFromNames(
                ["test.test_json", "test.test_re"])
            start = share()
            result = unittest.TextTestRunner(io.StringIO()).run(suite)
            print(result.testsRun, start, share())
            """
        res = script_helper.assert_python_ok("-c", code)
        runs, start, end = res.out.split()
        self.assertGreater(int(runs), 300)
        self.assertLess(float(start), 0.01)
        self.assertLess(float(end), 0.01)

    def test_set_operations_keep_owners(self):
        a = set(range(1000))
        usage = sys.type_memory_usage()
        before = usage.get("set", 0), usage.get("frozenset", 0)
        del usage
        a ^= set(range(500, 2000))          # swaps bodies with a new set
        a &= frozenset(range(100, 1800))
        del a
        usage = sys.type_memory_usage()
        self.assertLess(usage.get("set", 0) - before[0], 4096)
        self.assertEqual(usage.get("frozenset", 0), before[1])

    def test_array_items_count_under_array(self):
        array = import_helper.import_module("array")
        n = 100_000
        self.check_owned(lambda: array.array("d", range(n)), "array", n * 8)
        self.check_owned(lambda: array.array("u", "x" * n), "array", n * 2)

        class Sub(array.array):
            pass

        class Other(array.array):
            pass
        self.check_owned(lambda: Sub("q", range(n)), "array", n * 8)
        before = sys.type_memory_usage().get("array", 0)
        a = Sub("b", bytes(n))
        a.__class__ = Other         # the items stay with array.array
        a.extend(a)
        self.assertGreaterEqual(sys.type_memory_usage()["array"] - before,
                                2 * n)
        del a[n // 2:]
        a.frombytes(bytes(n))
        del a[:]
        del a
        self.assertLessEqual(sys.type_memory_usage().get("array", 0), before)

    def test_code_line_tables_count_under_code(self):
        # Tracing makes each code object it runs build its line array.
        src = "def f():\n" + "    x = 1\n" * 2000
        funcs = []
        for i in range(20):
            ns = {}
            exec(compile(src, f"<memtrack {i}>", "exec"), ns)
            funcs.append(ns["f"])
        before = sys.type_memory_usage()
        sys.setprofile(lambda *args: None)
        try:
            for f in funcs:
                f()
        finally:
            sys.setprofile(None)
        grown = delta(before, sys.type_memory_usage())
        # Two code units a line, two bytes for each one's line number.
        self.assertGreaterEqual(grown.get("code", 0), 20 * 2000 * 2 * 2)
        self.assertLess(grown.get("", 0), 4096)
        del funcs, ns, f
        gc.collect()                # each function's globals hold it
        self.assertLess(sys.type_memory_usage().get("code", 0)
                        - before.get("code", 0), 4096)

    def test_code_extra_counts_under_code(self):
        api._PyEval_RequestCodeExtraIndex.argtypes = [ctypes.c_void_p]
        api._PyCode_SetExtra.argtypes = [ctypes.py_object, ctypes.c_ssize_t,
                                         ctypes.c_void_p]
        index = api._PyEval_RequestCodeExtraIndex(None)
        codes = [compile(f"x = {i}", "<memtrack>", "exec")
                 for i in range(1000)]
        before = sys.type_memory_usage()["code"]
        for code in codes:
            self.assertEqual(api._PyCode_SetExtra(code, index, 1), 0)
        # The extra data holds a size and a pointer at least.
        self.assertGreaterEqual(sys.type_memory_usage()["code"] - before,
                                1000 * 2 * POINTER)
        del codes, code
        self.assertLess(sys.type_memory_usage()["code"], before)

    def test_module_state_counts_under_module(self):
        import importlib.util
        import types
        spec = importlib.util.find_spec("array")
        before = sys.type_memory_usage().get("module", 0)
        mods = []
        for _ in range(50):
            mod = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(mod)
            mods.append(mod)
        grown = sys.type_memory_usage()["module"] - before
        # Each module object, and its state: the array module keeps
        # several pointers there.
        self.assertGreaterEqual(grown,
                                50 * (instance_block(types.ModuleType) + 32))
        del mods, mod
        gc.collect()
        self.assertLess(sys.type_memory_usage().get("module", 0) - before,
                        1024)

    def test_type_name_counts_under_type(self):
        # PyType_FromSpec() copies the name it is given.
        class Slot(ctypes.Structure):
            _fields_ = [("slot", ctypes.c_int), ("pfunc", ctypes.c_void_p)]

        class Spec(ctypes.Structure):
            _fields_ = [("name", ctypes.c_char_p),
                        ("basicsize", ctypes.c_int),
                        ("itemsize", ctypes.c_int),
                        ("flags", ctypes.c_uint),
                        ("slots", ctypes.POINTER(Slot))]
        from_spec = api.PyType_FromSpec
        from_spec.restype = ctypes.py_object
        from_spec.argtypes = [ctypes.POINTER(Spec)]
        slots = (Slot * 1)()
        spec = Spec(b"memtrack." + b"x" * 100_000, 0, 0, 0, slots)
        before = sys.type_memory_usage()["type"]
        cls = from_spec(ctypes.byref(spec))
        self.assertGreaterEqual(sys.type_memory_usage()["type"] - before,
                                100_000)
        del cls
        gc.collect()
        self.assertLess(sys.type_memory_usage()["type"] - before, 1024)

    def test_instance_values_count_under_the_class(self):
        class Sightglass_Point:
            def __init__(self):
                self.x, self.y, self.z = 1, 2, 3
        name = Sightglass_Point.__name__
        block = instance_block(Sightglass_Point)
        anonymous = sys.type_memory_usage()[""]
        objs = [Sightglass_Point() for _ in range(N)]
        usage = sys.type_memory_usage()
        # Each instance and its values array, 3 values in it.
        self.assertGreaterEqual(usage[name], N * (block + 3 * POINTER))
        self.assertLess(usage[""] - anonymous, N)
        del usage
        # Asking for __dict__ hands the values over to a dict.
        dicts = [o.__dict__ for o in objs]
        self.assertEqual(sys.type_memory_usage()[name], objects_block(objs))
        del dicts, objs
        self.assertNotIn(name, sys.type_memory_usage())

    def check_type(self, make, name, min_size):
        """N objects from make() grow the name's entry by at least
        N * min_size, and their deletion gives it back."""
        before = sys.type_memory_usage().get(name, 0)
        objs = [make(i) for i in range(N)]
        grown = sys.type_memory_usage()[name] - before
        self.assertGreaterEqual(grown, N * min_size, name)
        del objs
        gc.collect()        # some are kept for reuse until then
        after = sys.type_memory_usage().get(name, 0)
        self.assertLess(after - before, N * min_size // 10, name)

    def test_core_types(self):
        self.check_type(lambda i: 10**30 + i, "int", 32)
        self.check_type(lambda i: float(i) + 0.5, "float", 16)
        self.check_type(lambda i: "x" * 100 + str(i), "str", 140)
        self.check_type(lambda i: b"y" * 100 + bytes([i % 256]), "bytes",
                        130)
        self.check_type(lambda i: (i, i, i), "tuple", 48)
        self.check_type(lambda i: lambda: i, "function", 128)
        self.check_type(lambda i: [i], "list", 56)
        self.check_type(lambda i: {"k": i}, "dict", 48)
        self.check_type(lambda i: {i}, "set", 200)
        self.check_type(lambda i: bytearray(8), "bytearray", 56)

        def gen(i):
            yield i
        self.check_type(gen, "generator", 100)

        def frame(i):
            return sys._getframe()
        self.check_type(frame, "frame", 60)

    def test_large_objects(self):
        # Objects pymalloc does not serve are found by their own table.
        def make():
            return [tuple(range(i, i + 1000)) for i in range(100)]
        make()      # a tuple it drops is kept for reuse, and counts
        before = sys.type_memory_usage()
        objs = make()
        grown = delta(before, sys.type_memory_usage())
        blocks = objects_block(objs)
        self.assertEqual(grown.get("tuple"), blocks)
        before = sys.type_memory_usage()
        del objs
        self.assertEqual(delta(before, sys.type_memory_usage()).get("tuple"),
                         -blocks)

    def test_objects_in_foreign_memory(self):
        # C code may make an object in memory of its own (static, or from
        # malloc()) with PyObject_Init().  That memory is not Python's: the
        # object does not count, and once the memory is freed, nothing may
        # read it.
        before = sys.type_allocation_counts().get("float", 0)
        blocks = [libc.malloc(4096) for _ in range(100)]
        for p in blocks:
            object_init(p, float)
        self.assertEqual(sys.type_allocation_counts().get("float", 0), before)
        for p in blocks:
            libc.free(p)
        self.assertEqual(sys.type_allocation_counts().get("float", 0), before)

    def test_objects_inside_blocks_held_for_other_data(self):
        # C code may make an object inside a block it holds, then write
        # other data there without freeing the block.  Where the object
        # started, what looks like a type is then any bytes at all: the
        # accounting must not follow them.
        before = sys.type_allocation_counts().get("float", 0)
        buffers = [bytearray(40) for _ in range(100)]
        for buf in buffers:
            view = (ctypes.c_char * len(buf)).from_buffer(buf)
            object_init(ctypes.addressof(view), float)
            del view
            buf[:] = b"\xfe" * len(buf)
        self.assertEqual(sys.type_allocation_counts().get("float", 0), before)
        self.check_tags_add_up()
        del buffers

    def test_data_that_reads_as_an_object(self):
        # A list of two items, the second a class, has a buffer that
        # reads as an instance of it (object's fit a block of that size):
        # the accounting must know it is data, in every block of every
        # pool, however the blocks around it come and go.  (With pymalloc
        # and no debug hooks, the buffers are neighbours in their pools'
        # maps.)
        def objects():
            return sys.type_allocation_counts().get("object", 0)
        counts = objects()
        rows = [[None, object] for _ in range(N)]
        self.assertLess(objects() - counts, 10)
        del rows[::3]
        rows += [[None, object] for _ in range(N)]
        self.assertLess(objects() - counts, 10)
        self.check_tags_add_up()
        del rows

    def test_objects_outliving_their_class(self):
        # A C extension's free list may hold the blocks of dead objects
        # without holding their class, which may then be freed.  The
        # blocks count as anonymous memory from then on, and nothing may
        # read the freed class.
        class Sightglass_Outlived:
            __slots__ = ()
        name = Sightglass_Outlived.__name__
        api.PyObject_Malloc.restype = ctypes.c_void_p
        api.PyObject_Malloc.argtypes = [ctypes.c_size_t]
        api.PyObject_Free.argtypes = [ctypes.c_void_p]
        api.Py_DecRef.argtypes = [ctypes.py_object]
        # Laid out as the class's own instances are: after a GC header,
        # which starts zeroed.
        pre = pre_header(Sightglass_Outlived)
        size = pre + Sightglass_Outlived.__basicsize__
        blocks = [api.PyObject_Malloc(size) for _ in range(100)]
        try:
            for p in blocks:
                ctypes.memset(p, 0, pre)
                object_init(p + pre, Sightglass_Outlived)
                # The free list keeps no reference to the class.
                api.Py_DecRef(Sightglass_Outlived)
            self.assertEqual(sys.type_allocation_counts()[name], 100)
            alive = weakref.ref(Sightglass_Outlived)
            del Sightglass_Outlived
            gc.collect()
            self.assertIsNone(alive())
            self.assertNotIn(name, sys.type_allocation_counts())
            self.assertNotIn(name, sys.type_memory_usage())
            self.check_tags_add_up()
        finally:
            for p in blocks:
                api.PyObject_Free(p)
        self.check_tags_add_up()

    def test_blocks_of_a_replacing_allocator(self):
        # An embedder may replace the mem domain's allocator with one that
        # counts nothing.  An owner must not claim the blocks it gives:
        # they are in no total, and malloc() cannot tell their size.
        def read():
            return sys.type_memory_usage(), sys.type_allocation_counts()
        spare = []
        del spare       # the helper's list is this one, from the free list
        before = read()
        during = _testcapi.call_with_replaced_allocator(10_000, read)
        after = read()
        for reading in during, after:
            self.assertEqual(reading[0]["list"], before[0]["list"])
            self.assertEqual(reading[1]["list"], before[1]["list"])
        self.check_tags_add_up()

    def test_resized_objects(self):
        # bytes, str and tuple are reallocated in place by their resize
        # functions; the block must move with them.
        before = sys.type_memory_usage()
        data = [bytes(range(i % 200)) + b"z" for i in range(2000)]
        text = ["".join(["ab"] * (i % 100)) for i in range(2000)]
        tups = [tuple(x for x in range(i % 50)) for i in range(2000)]
        del data, text, tups
        gc.collect()        # some tuples are kept for reuse until then
        after = sys.type_memory_usage()
        for name in ("bytes", "str", "tuple"):
            self.assertLess(abs(after.get(name, 0) - before.get(name, 0)),
                            4096, name)

    def test_resized_objects_count_where_they_end(self):
        # A tuple made from a generator grows as the items come and then
        # shrinks to fit; a str extended in place grows.  Each resize may
        # move the object to another block: it counts once, at its last
        # one.  (Which may be larger than it needs: pymalloc shrinks a
        # block in place by up to a quarter.)
        def text(i):
            s = "x" * 40
            s += "y" * (200 + i % 7)        # resized: nothing else holds s
            return s
        for name, make in (("tuple", lambda i: tuple(x for x in range(40))),
                           ("str", text)):
            with self.subTest(name):
                counts = sys.type_allocation_counts()[name]
                usage = sys.type_memory_usage()[name]
                objs = [make(i) for i in range(N)]
                self.assertAlmostEqual(
                    sys.type_allocation_counts()[name] - counts, N, delta=10)
                self.assertGreaterEqual(sys.type_memory_usage()[name] - usage,
                                        objects_block(objs))
                del objs

    def test_gc_resize_moves_the_mark(self):
        # An extension type may grow its objects with PyObject_GC_Resize()
        # and nothing else: each object counts at the block it moved to.
        counts = sys.type_allocation_counts()["tuple"]
        objs = [_testcapi.gc_resized_tuple(40) for _ in range(N)]
        self.assertEqual(objs[0], (None,) * 40)
        self.assertAlmostEqual(
            sys.type_allocation_counts()["tuple"] - counts, N, delta=10)
        del objs

    def test_peak(self):
        sys.reset_peak_memory_used()
        start = sys.total_memory_used()
        self.assertLessEqual(sys.peak_memory_used() - start, 1024)
        blob = bytes(10 * 2**20)
        # Less what was freed since the start was read (a few small blocks).
        self.assertGreaterEqual(sys.peak_memory_used(),
                                start + 10 * 2**20 - 4096)
        del blob
        self.assertGreaterEqual(sys.peak_memory_used(),
                                start + 10 * 2**20 - 4096)
        sys.reset_peak_memory_used()
        self.assertLess(sys.peak_memory_used(), start + 2**20)

    def test_peak_of_small_blocks(self):
        # The peak is taken as the total falls from it.  No fall saw the
        # objects made after the list's last resize: the first free after
        # the comprehension's does.
        sys.reset_peak_memory_used()
        start = sys.total_memory_used()
        objs = [object() for _ in range(100_000)]
        high = sys.total_memory_used()
        del objs
        self.assertGreaterEqual(sys.peak_memory_used(), high - 4096)
        self.assertGreater(high - start, 100_000 * 2 * POINTER)

    def test_peak_as_frame_stacks_fall(self):
        # Frames of a thousand locals each fill the frame stack with
        # chunks, freed as the calls return: nothing else is allocated or
        # freed meanwhile, so the peak is taken as the stack falls.
        names = " = ".join(f"v{i}" for i in range(1000))
        ns = {}
        exec(f"def deep(n):\n"
             f"    {names} = None\n"
             f"    return deep(n - 1) if n else 0\n", ns)
        deep = ns["deep"]
        deep(1)
        sys.reset_peak_memory_used()
        start = sys.total_memory_used()
        deep(200)
        # Half the frames' locals, as chunks hold whole frames.
        self.assertGreaterEqual(sys.peak_memory_used(),
                                start + 200 * 1000 * POINTER // 2)

    def test_peak_as_the_raw_domain_falls(self):
        mib = 2**20
        sys.reset_peak_memory_used()
        start = sys.total_memory_used()
        _testcapi.pymem_raw_malloc_free(10 * mib)
        self.assertGreaterEqual(sys.peak_memory_used(), start + 10 * mib)

    def test_peak_counts_the_raw_domain(self):
        # A CDLL call releases the GIL: the raw domain's allocator runs
        # without it, as it may.
        libpython = ctypes.CDLL(None)
        libpython.PyMem_RawMalloc.restype = ctypes.c_void_p
        libpython.PyMem_RawMalloc.argtypes = [ctypes.c_size_t]
        libpython.PyMem_RawFree.argtypes = [ctypes.c_void_p]
        mib = 2**20
        sys.reset_peak_memory_used()
        start = sys.total_memory_used()
        blob = bytes(2 * mib)
        del blob
        # The object domain has 2 MiB of room below the peak now.  A raw
        # block of 10 MiB must take it away: the megabyte allocated next is
        # a new peak.  (Reading the peak would raise it to the total, so it
        # is read only after the moment it must have seen.)
        raw = libpython.PyMem_RawMalloc(10 * mib)
        blob = bytes(mib)
        del blob
        libpython.PyMem_RawFree(raw)
        self.assertGreaterEqual(sys.peak_memory_used(), start + 11 * mib)
        self.assertLess(sys.total_memory_used(), start + mib)

    def test_extension_tag(self):
        # _testcapi uses PyObject_T_MALLOC and friends as extensions do.
        tag = "sightglass.extension"
        addr = _testcapi.pyobject_t_malloc(tag, 300)
        self.assertEqual(sys.type_memory_usage()[tag], block_size(300))
        addr = _testcapi.pyobject_t_realloc(tag, addr, 100_000)
        self.assertGreaterEqual(sys.type_memory_usage()[tag], 100_000)
        self.assertEqual(sys.type_allocation_counts()[tag], 1)
        _testcapi.pyobject_t_free(tag, addr)
        self.assertEqual(sys.type_memory_usage()[tag], 0)
        self.assertEqual(sys.type_allocation_counts()[tag], 0)

    def test_tracked_malloc_api(self):
        api.PyObject_TrackedMalloc.restype = ctypes.c_void_p
        api.PyObject_TrackedMalloc.argtypes = [ctypes.c_char_p,
                                               ctypes.c_size_t]
        api.PyObject_TrackedRealloc.restype = ctypes.c_void_p
        api.PyObject_TrackedRealloc.argtypes = [ctypes.c_char_p,
                                                ctypes.c_void_p,
                                                ctypes.c_size_t]
        api.PyObject_TrackedFree.argtypes = [ctypes.c_char_p,
                                             ctypes.c_void_p]
        api.Py_AdjustTrackedMemory.argtypes = [ctypes.c_char_p,
                                               ctypes.c_ssize_t]
        tag = b"sightglass.test"
        p = api.PyObject_TrackedMalloc(tag, 100)
        self.assertEqual(sys.type_memory_usage()["sightglass.test"],
                         block_size(100))
        self.assertEqual(sys.type_allocation_counts()["sightglass.test"], 1)
        p = api.PyObject_TrackedRealloc(tag, p, 5000)
        self.assertGreaterEqual(sys.type_memory_usage()["sightglass.test"],
                                5000)
        self.assertEqual(sys.type_allocation_counts()["sightglass.test"], 1)
        api.PyObject_TrackedFree(tag, p)
        self.assertEqual(sys.type_memory_usage()["sightglass.test"], 0)
        self.assertEqual(sys.type_allocation_counts()["sightglass.test"], 0)
        # From NULL, a realloc allocates.
        p = api.PyObject_TrackedRealloc(tag, None, 100)
        self.assertEqual(sys.type_memory_usage()["sightglass.test"],
                         block_size(100))
        self.assertEqual(sys.type_allocation_counts()["sightglass.test"], 1)
        api.PyObject_TrackedFree(tag, p)
        self.assertEqual(sys.type_memory_usage()["sightglass.test"], 0)
        api.Py_AdjustTrackedMemory(tag, 4096)
        self.assertEqual(sys.type_memory_usage()["sightglass.test"], 4096)
        fill_int_free_list()
        total = sys.total_memory_used()
        api.Py_AdjustTrackedMemory(tag, -4096)
        # The int holding the first reading is all that was allocated.
        self.assertEqual(total - sys.total_memory_used(),
                         4096 - int_block(total))
        self.assertEqual(sys.type_memory_usage()["sightglass.test"], 0)

    def test_many_names(self):
        # A name is found by its text, not by the buffer that holds it.
        # In a child: names live as long as the interpreter, and their keys
        # in each later reading would count in other tests' deltas.
        script_helper.assert_python_ok("-c", """if True:
            import ctypes, sys
            api = ctypes.pythonapi
            api.PyObject_TrackedMalloc.restype = ctypes.c_void_p
            api.PyObject_TrackedMalloc.argtypes = [ctypes.c_char_p,
                                                   ctypes.c_size_t]
            api.PyObject_TrackedFree.argtypes = [ctypes.c_char_p,
                                                 ctypes.c_void_p]
            names = [f"sightglass.name{i}".encode() for i in range(500)]
            blocks = [api.PyObject_TrackedMalloc(name, 16 * (i % 7 + 1))
                      for i, name in enumerate(names)]
            counts = sys.type_allocation_counts()
            if [counts[name.decode()] for name in names] != [1] * 500:
                sys.exit("a name's block is not counted under it")
            for name, block in zip(names, blocks):
                copy = ctypes.create_string_buffer(name)
                api.PyObject_TrackedFree(copy.value, block)
            usage = sys.type_memory_usage()
            if [usage[name.decode()] for name in names] != [0] * 500:
                sys.exit("a name's block is not given back under its text")
            """)

    def test_finalizers_switching_threads(self):
        # A finalizer lets other threads run in the middle of a
        # deallocation: each thread's deallocation stays its own.
        class Slow:
            __slots__ = ("pad",)

            def __del__(self):
                time.sleep(0)

        def work():
            for _ in range(2000):
                Slow()
        threads = [threading.Thread(target=work) for _ in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        usage = sys.type_memory_usage(by_type=True)
        self.assertNotIn(Slow, usage)
        self.assertGreaterEqual(min(usage.values()), 0)

    def test_threads(self):
        stop = threading.Event()

        def work():
            while not stop.is_set():
                [{"a": [i]} for i in range(200)]
        threads = [threading.Thread(target=work) for _ in range(4)]
        for t in threads:
            t.start()
        try:
            for _ in range(200):
                for key, value in self.check_tags_add_up().items():
                    self.assertGreaterEqual(value, 0, key)
        finally:
            stop.set()
            for t in threads:
                t.join()


class AllocatorTests(unittest.TestCase):
    """The same accounting under other allocators and beside tracemalloc."""

    CODE = """if 1:
        import sys
        class Probe:
            pass
        objs = [Probe() for _ in range(1000)]
        usage = sys.type_memory_usage()
        counts = sys.type_allocation_counts()
        # Each instance, and the values array 3.11 gives it at once.
        assert counts["Probe"] == 2000, counts["Probe"]
        # malloc() may give some blocks more than others: at least this.
        assert usage["Probe"] >= 1000 * Probe.__basicsize__, usage["Probe"]
        before = sys.total_memory_used()
        snap = sys.type_memory_usage()
        assert before <= sum(snap.values()) <= sys.total_memory_used()
        assert min(snap.values()) >= 0, snap
        del objs
        assert "Probe" not in sys.type_memory_usage()
        print("ok")
    """

    def run_with(self, *args, **env):
        res = script_helper.assert_python_ok(*args, "-c", self.CODE, **env)
        self.assertEqual(res.out.strip(), b"ok")

    def test_pythonmalloc_malloc(self):
        self.run_with(PYTHONMALLOC="malloc")

    def test_pythonmalloc_debug(self):
        self.run_with(PYTHONMALLOC="debug")

    def test_pythonmalloc_malloc_debug(self):
        self.run_with(PYTHONMALLOC="malloc_debug")

    def test_beside_tracemalloc(self):
        self.run_with("-X", "tracemalloc=5")

    def test_wrapper_sees_owned_buffers(self):
        # pymalloc hands out the buffers objects own without the domain's
        # call only while it serves the domain itself: a wrapper sees
        # each, and they still count under their owner.
        tracemalloc = import_helper.import_module("tracemalloc")
        n, items = 1000, 20
        before = sys.type_memory_usage()["list"]
        tracemalloc.start()
        try:
            lists = [[None] * items for _ in range(n)]
            traced = tracemalloc.get_traced_memory()[0]
            owned = sys.type_memory_usage()["list"] - before
        finally:
            tracemalloc.stop()
        self.assertGreaterEqual(traced, n * items * POINTER)
        self.assertGreaterEqual(owned, n * items * POINTER)
        del lists

    BUFFERS = """if 1:
        import gc, io, sys
        def usage():
            gc.collect()
            return sys.type_memory_usage().get("_BufferedIOBase", 0)
        before = usage()
        for _ in range(10):
            io.BufferedWriter(io.BytesIO(), 8192).close()
        print(before, usage())
    """

    def test_large_owned_blocks_beside_tracemalloc(self):
        # pymalloc passes its large requests to the raw domain, which
        # tracemalloc wraps: what tracemalloc allocates and frees for its
        # traces meanwhile is the raw domain's.  And the layout of the
        # blocks under tracemalloc stays that of what it wraps, though
        # Python puts the default allocator in place for a while when it
        # runs a file (and the wrapper back after).
        allocators = ["debug", "malloc"]
        if support.with_pymalloc():
            allocators.append("pymalloc")
        with os_helper.temp_dir() as tmp:
            script = script_helper.make_script(tmp, "buffers", self.BUFFERS)
            for allocator in allocators:
                with self.subTest(allocator=allocator):
                    alone = script_helper.assert_python_ok(
                        script, PYTHONMALLOC=allocator)
                    traced = script_helper.assert_python_ok(
                        "-X", "tracemalloc", script, PYTHONMALLOC=allocator)
                    before, after = alone.out.split()
                    self.assertEqual(before, after)
                    self.assertGreater(int(before), 0)
                    self.assertEqual(traced.out, alone.out)


if __name__ == "__main__":
    unittest.main()
