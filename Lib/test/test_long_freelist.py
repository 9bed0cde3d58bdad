"""Sightglass keeps freed ints of one or two digits for reuse, as it keeps
floats.

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
BITS = sys.int_info.bits_per_digit
BASE = 1 << (BITS - 2)
# Of two digits, as the squares of ints of one digit may be; negative, so
# that the ints made here keep to two.
TWO_DIGITS = -(1 << (BITS + 2))
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
        for base in (BASE, TWO_DIGITS):
            with self.subTest(base):
                gc.collect()
                ints = [base + i for i in range(COUNT)]
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
        # Whatever the digits of those kept and of those made: here one,
        # and two for the squares.  (The sum or difference of ints of two
        # digits asks for room for three, and is not made in a kept int.)
        for make in (lambda i: BASE - i, lambda i: (BASE + i) * (BASE + i)):
            with self.subTest(make(0)):
                self.keep()
                ints = [None] * COUNT
                before = blocks()
                for i in range(COUNT):
                    ints[i] = make(i)
                self.assertIn(blocks() - before, (0, 1))
                self.assertEqual(ints, [make(i) for i in range(COUNT)])

    def test_other_ints_are_freed(self):
        class Int(int):
            pass
        for make in (lambda i: Int(BASE + i),       # a subclass
                     lambda i: 2**100 + i,          # more digits
                     lambda i: (TWO_DIGITS << BITS) - i):
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
