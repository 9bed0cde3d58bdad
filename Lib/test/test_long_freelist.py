"""Sightglass keeps freed ints of one digit for reuse, as it keeps floats.

The ints of the arithmetic in a loop are made and dropped more than any
other object: taken from a free list, they spare the allocator (and in a
tracking build, its accounting).  A full collection empties the list.
"""

import gc
import sys
import threading
import unittest
from test.support import import_helper, threading_helper

# Above the small ints, and a quarter of the way to two digits (2**30,
# or 2**15 on builds with 15-bit digits): the ints made here keep to one.
BASE = 1 << (sys.int_info.bits_per_digit - 2)
COUNT = 50
KEPT = 60       # more than COUNT, fewer than the list keeps (100)


def blocks():
    return sys.getallocatedblocks()


@unittest.skipUnless(blocks() > 0,
                     "pymalloc is not in use (PYTHONMALLOC=malloc, sanitizers):"
                     " the allocator counts no blocks")
class FreeListTests(unittest.TestCase):

    def setUp(self):
        gc.collect()        # starts from an empty list

    # Each check allows for the block of the int that the first reading
    # returned, which the second counts unless the list gave it.

    def test_freed_ints_are_kept_until_a_collection(self):
        ints = [BASE + i for i in range(COUNT)]
        before = blocks()
        for i in range(COUNT):
            ints[i] = None
        self.assertIn(blocks() - before, (0, 1))
        gc.collect()
        self.assertLessEqual(blocks(), before - COUNT + 1)

    def keep(self):
        """Frees KEPT ints."""
        ints = [BASE + i for i in range(KEPT)]
        for i in range(KEPT):
            ints[i] = None

    def test_kept_ints_are_taken_again(self):
        self.keep()
        ints = [None] * COUNT
        before = blocks()
        for i in range(COUNT):
            ints[i] = BASE - i
        self.assertIn(blocks() - before, (0, 1))
        self.assertEqual(ints, [BASE - i for i in range(COUNT)])

    def test_ints_dying_in_the_eval_loop_are_kept(self):
        # Its specializations for ints free them without their type's
        # deallocator.  Were those not kept, each would take a kept block
        # out of the allocator's count.
        def work(n, total, items, big):
            for i in range(n):
                total += i                  # BINARY_OP_ADD_INT
                total = total - 0           # BINARY_OP_SUBTRACT_INT
                total = total * 1           # BINARY_OP_MULTIPLY_INT
                if total - 0 < BASE:        # COMPARE_OP_INT_JUMP
                    break
                items[i % 8] = big[i + 300]   # BINARY_SUBSCR_LIST_INT
                big[i + 300] = total        # STORE_SUBSCR_LIST_INT
            return total
        items, big = [0] * 8, [0] * 1000
        work(200, BASE, items, big)         # specialized from now on
        self.keep()
        before = blocks()
        total = work(200, BASE, items, big)
        self.assertIn(blocks() - before, (0, 1))
        self.assertEqual(total, BASE + sum(range(200)))

    def test_other_ints_are_freed(self):
        class Int(int):
            pass
        for make in (lambda i: Int(BASE + i),       # a subclass
                     lambda i: 2**100 + i,          # more digits
                     lambda i: -(2**40) - i):
            with self.subTest(make(0)):
                gc.collect()
                ints = [make(i) for i in range(COUNT)]
                before = blocks()
                for i in range(COUNT):
                    ints[i] = None
                self.assertLessEqual(blocks(), before - COUNT + 1)


class ConcurrencyTests(unittest.TestCase):
    """Under any allocator."""

    @threading_helper.requires_working_threading()
    def test_threads(self):
        # The list is the interpreter's, used with the GIL held.
        def churn(seed):
            total = 0
            for i in range(20_000):
                total += (BASE + i) * seed % 1_000_003
            results[seed] = total
        results = {}
        threads = [threading.Thread(target=churn, args=(seed,))
                   for seed in range(1, 7)]
        with threading_helper.start_threads(threads):
            pass
        for seed in range(1, 7):
            self.assertEqual(
                results[seed],
                sum((BASE + i) * seed % 1_000_003 for i in range(20_000)))

    def test_subinterpreter(self):
        # Each interpreter has a list of its own, emptied when it ends.
        _testcapi = import_helper.import_module("_testcapi")
        code = ("total = 0\n"
                "for i in range(10_000):\n"
                f"    total += {BASE} + i\n"
                f"assert total == {10_000 * BASE + sum(range(10_000))}\n")
        self.assertEqual(_testcapi.run_in_subinterp(code), 0)


if __name__ == "__main__":
    unittest.main()
