"""Tests for profiling.sampling, the sampling profiler, and its engine.

No test asserts a time or a rate: the accuracy tests give the sampler a
fixed amount of work in known proportions and check the proportions."""

import asyncio
import contextlib
import gc
import json
import marshal
import math
import os
import pstats
import re
import signal
import sys
import sysconfig
import tempfile
import textwrap
import threading
import time
import unittest
from test import support
from test.support import os_helper
from test.support import script_helper
from test.support import threading_helper

import _sampling
import profiling.sampling
from profiling.sampling import Sampler, STATUSES

TRACKS_MEMORY = bool(sysconfig.get_config_var("Py_TRACK_MEMORY"))
RUNNING, IN_C, WAITING_FOR_GIL, IDLE = STATUSES

# A unit of work: 2-5 ms in a release build, as the machine goes, so a
# few hundred samples at the rates used here for the work a test does.
# Debug and sanitizer builds are slower, and take more.  A test that needs
# a number of ticks whatever the machine runs for a time (spin()).
UNIT = 100_000


def work(units):
    total = 0
    for i in range(units * UNIT):
        total += i
    return total


# The work of two threads, told apart by their functions' names.
def first():
    work(4)


def second():
    work(4)


def one_share(units):
    total = 0
    for i in range(units * UNIT):
        total += i
    return total


def three_shares(units):
    total = 0
    for i in range(units * UNIT):
        total += i
    return total


def thread_name(tid):
    with open(f"/proc/self/task/{tid}/comm", encoding="utf-8") as f:
        return f.read().rstrip("\n")


def split_work(rounds):
    for _ in range(rounds):
        one_share(1)
        three_shares(3)


def stalled(info):
    """Whether the sampler woke for under 97% of a run's ticks, missing more
    than a few: the system kept its thread off the CPU (for 200 ms, at
    times, on a loaded machine).  The ticks it never woke for are those it
    missed and, if it was away at the end, those that went to stop()'s
    sample."""
    return info["ticks"] - info["taken"] > max(0.03 * info["ticks"], 5)


def share_delta(samples, share):
    """How far a share of the work, expected to be *share*, may be off in
    these samples: at least 0.05, and four standard deviations of the
    share if each sample fell in it with that probability.  On a loaded
    machine, a stall of the sampler's thread makes a lump of ticks where
    the thread was when the sampler came back: the shares stay right on
    average, but a few lumps can weigh more than all the other samples."""
    weights = [s["weight"] for s in samples]
    spread = math.sqrt(share * (1 - share) * sum(w * w for w in weights))
    return max(0.05, 4 * spread / sum(weights))


def on_schedule(function, *args, **options):
    """A Sampler(**options) that ran function(*args) without stalling, run
    again while it stalled: the ticks of a stall all go to where each
    thread was at its end, which skews the shares of functions, and work
    shorter than the stall, or threads that come and go meanwhile, go
    unseen.  function must do the same work each time.  If every run
    stalls for SHORT_TIMEOUT, the machine is too loaded to tell what the
    sampler sees on schedule: the test is skipped, saying so."""
    deadline = time.monotonic() + support.SHORT_TIMEOUT
    runs = 0
    while True:
        sampler = Sampler(**options)
        sampler.run(function, *args)
        runs += 1
        if not stalled(sampler.info()):
            return sampler
        if time.monotonic() > deadline:
            raise unittest.SkipTest(
                f"the sampler stalled in all {runs} runs: the system kept "
                f"its thread off the CPU")


# The heaviest work on schedule: under AddressSanitizer its ticks and its
# work are slow enough that, beside the other test process on two cores,
# no run in SHORT_TIMEOUT stayed on schedule (CI, 2026-12-07: each of
# these four waited 30 s and skipped).  They skip at once there instead;
# the other builds run them.
heavy_on_schedule = unittest.skipIf(
    support.check_sanitizer(address=True, memory=True),
    "too slow under a sanitizer for the sampler to stay on schedule")


def until_taken(sampler, ticks, function, *args):
    """Calls function(*args), and again until the running sampler has taken
    *ticks* ticks more: enough work for them, however long the sampler was
    kept from the CPU."""
    deadline = time.monotonic() + support.SHORT_TIMEOUT
    first = sampler._engine.info()["taken"]
    function(*args)
    while (taken := sampler._engine.info()["taken"] - first) < ticks:
        if time.monotonic() > deadline:
            raise AssertionError(
                f"{taken} of {ticks} ticks in {support.SHORT_TIMEOUT} s")
        function(*args)


def until_sampled(sampler):
    """Works until the running sampler has taken two ticks: the first one's
    sample was of the caller, however long the sampler was away (the
    second comes after it was recorded).  For tests that need their
    code sampled, not sampled on schedule."""
    until_taken(sampler, 2, work, 1)


def recurse(depth, then):
    if depth == 0:
        return then()
    return recurse(depth - 1, then)


def long_c_call():
    return sum(range(40 * UNIT))  # the C call


def multiply_then_call(x):
    # No check point comes after a multiplication: the next one is at the
    # start of the function called.
    return takes_product(x * x)  # the multiplication


def takes_product(product):
    return product & 1


def spinning_generator(units):
    for _ in range(units):
        work(1)
        yield


def consume_generator(units):
    for _ in spinning_generator(units):
        pass


async def inner_coroutine(units):
    await asyncio.sleep(0)
    work(units)


async def outer_coroutine(units):
    await inner_coroutine(units)


def spin(seconds):
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        pass


def bursts(seconds, pause, used):
    """Uses a CPU in bursts of 0.1 ms, shorter than a tick at 4 kHz, with
    pauses of *pause* seconds (the GIL released) between them, and puts
    the CPU time it used in the list *used*."""
    start = time.thread_time()
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        spin(0.0001)
        time.sleep(pause)
    used.append(time.thread_time() - start)


def burn(seconds, used):
    """Uses *seconds* of CPU time, and puts the CPU time of its thread so
    far in the dict *used*, by the thread's name."""
    end = time.thread_time() + seconds
    while time.thread_time() < end:
        pass
    used[threading.current_thread().name] = time.thread_time()


def sleeper(stop):
    stop.wait()  # sleeps here


def wait_until_asleep(thread):
    """Returns once *thread* sleeps (so says the kernel, where there is
    /proc) in Condition.wait(), at two looks a millisecond apart: at one,
    it may still be waiting for the GIL on its way into the lock's
    acquire()."""
    deadline = time.monotonic() + support.SHORT_TIMEOUT
    looks = 0
    while looks < 2:
        if time.monotonic() > deadline:
            raise AssertionError(f"{thread} did not fall asleep")
        frame = sys._current_frames().get(thread.ident)
        stat = f"/proc/self/task/{thread.native_id}/stat"
        try:
            with open(stat, encoding="utf-8") as f:
                state = f.read().rpartition(")")[2].split()[0]
        except FileNotFoundError:
            state = "S"
        if (state == "S" and frame is not None
                and frame.f_code is threading.Condition.wait.__code__):
            looks += 1
        else:
            looks = 0
        del frame
        time.sleep(0.001)


def wait_until_gone(thread):
    """Returns once the kernel's thread of a joined *thread* has exited,
    where /proc says."""
    deadline = time.monotonic() + support.SHORT_TIMEOUT
    while os.path.exists(f"/proc/self/task/{thread.native_id}"):
        if time.monotonic() > deadline:
            raise AssertionError(f"{thread} did not exit")
        time.sleep(0.0002)


@contextlib.contextmanager
def sleeping_thread():
    """A thread sleeping in sleeper() for the duration."""
    stop = threading.Event()
    thread = threading.Thread(target=sleeper, args=(stop,))
    thread.start()
    try:
        wait_until_asleep(thread)
        yield thread
    finally:
        stop.set()
        thread.join()


def line_of(function, text):
    """The line of `function`'s source holding `text`."""
    import inspect
    lines, first = inspect.getsourcelines(function)
    for i, line in enumerate(lines):
        if text in line:
            return first + i
    raise AssertionError(f"{text!r} not in {function.__name__}")


def source_line(line):
    with open(__file__, encoding="utf-8") as f:
        return f.read().splitlines()[line - 1]


def results(sampler):
    """results(), with each sample's frames as dicts and its thread's
    ident."""
    r = sampler.results()
    for sample in r["samples"]:
        sample["stack"] = [r["frames"][i] for i in sample["frames"]]
        sample["ident"] = r["threads"][sample["thread"]]["ident"]
    return r


def largest(samples, count=5):
    """The heaviest samples, described for a failure's message."""
    heaviest = sorted(samples, key=lambda s: s["weight"], reverse=True)
    return "; ".join(
        f"{s['weight']} at {s['time']:.4f} s, {s['status']}, in "
        f"{'/'.join(stack_names(s)[-2:])}" for s in heaviest[:count])


def stack_names(sample):
    """The functions' names (the last part of their qualified names)."""
    return [f["name"].rpartition(".")[2] for f in sample["stack"]]


def functions_by_thread_name(r, functions=("first", "second")):
    """Which of *functions* the samples of each thread (by name) show."""
    seen = {}
    for sample in r["samples"]:
        name = r["threads"][sample["thread"]]["name"]
        for function in functions:
            if function in stack_names(sample):
                seen.setdefault(name, set()).add(function)
    return seen


def ticks_out_of_order(r):
    """Where a thread's sample takes a tick its previous sample took:
    (thread, the previous one's last tick, this one's first)."""
    last = {}
    wrong = []
    for sample in r["samples"]:
        end = round(sample["time"] / r["interval"])
        first = end - sample["weight"] + 1
        previous = last.get(sample["thread"], 0)
        if first <= previous:
            wrong.append((sample["thread"], previous, first))
        last[sample["thread"]] = end
    return wrong


class BadInputTests(unittest.TestCase):

    def test_rates(self):
        for rate in (0, -1, 0.0, 1e9, 100_001, float("nan"), float("inf")):
            with self.subTest(rate=rate):
                with self.assertRaisesRegex(ValueError, "rate must be"):
                    Sampler(rate)
        for rate in ("1000", True, None.__class__, [1]):
            with self.subTest(rate=rate):
                with self.assertRaisesRegex(TypeError, "rate must be"):
                    Sampler(rate)
        for interval in (0, 1e-6, 3601, -1, float("nan")):
            with self.subTest(interval=interval):
                with self.assertRaisesRegex(ValueError, "interval must be"):
                    Sampler(interval=interval)
        with self.assertRaisesRegex(TypeError, "rate or interval"):
            Sampler(1000, interval=0.001)

    def test_other_arguments(self):
        with self.assertRaisesRegex(ValueError, "mode must be"):
            Sampler(mode="process")
        with self.assertRaisesRegex(ValueError, "all_threads or thread"):
            Sampler(all_threads=True, thread=threading.get_ident())
        with self.assertRaisesRegex(TypeError, "thread must be"):
            Sampler(thread="main")
        for memory_rate in (-1, 2000, float("nan")):
            with self.subTest(memory_rate=memory_rate):
                with self.assertRaisesRegex(ValueError, "memory_rate"):
                    Sampler(1000, memory_rate=memory_rate)
        with self.assertRaisesRegex(TypeError, "memory_rate"):
            Sampler(memory_rate="often")

    def test_engine_arguments(self):
        with self.assertRaisesRegex(ValueError, "interval"):
            _sampling.Sampler(0.0)
        with self.assertRaisesRegex(ValueError, "mode"):
            _sampling.Sampler(0.001, mode="gil")
        with self.assertRaisesRegex(TypeError, "thread"):
            _sampling.Sampler(0.001, thread=1.5)
        with self.assertRaisesRegex(ValueError, "memory_interval"):
            _sampling.Sampler(0.001, memory_interval=-1.0)
        engine = _sampling.Sampler.__new__(_sampling.Sampler)
        with self.assertRaisesRegex(RuntimeError, "not initialized"):
            engine.start()

    def test_one_sampler_at_a_time(self):
        first = Sampler(1000)
        second = Sampler(1000)
        with first:
            with self.assertRaisesRegex(RuntimeError, "already running"):
                first.start()
            with self.assertRaisesRegex(RuntimeError, "another sampler"):
                second.start()
            self.assertFalse(second.running)
            self.assertTrue(first.running)
            with self.assertRaisesRegex(RuntimeError, "running"):
                first.results()
        self.assertFalse(first.running)
        with second:
            work(1)
        self.assertGreater(results(second)["total"], 0)

    def test_stop_without_start(self):
        sampler = Sampler(1000)
        with self.assertRaisesRegex(RuntimeError, "not running"):
            sampler.stop()
        with self.assertRaisesRegex(RuntimeError, "has not run"):
            sampler.results()
        with sampler:
            pass
        with self.assertRaisesRegex(RuntimeError, "not running"):
            sampler.stop()
        engine = _sampling.Sampler(0.001)
        with self.assertRaisesRegex(RuntimeError, "not running"):
            engine.stop()

    def test_unwritable_path(self):
        sampler = Sampler(1000)
        sampler.run(work, 1)
        missing = os.path.join(tempfile.gettempdir(), "no such dir", "x")
        for format in profiling.sampling.FORMATS:
            with self.subTest(format=format):
                with self.assertRaises(FileNotFoundError):
                    sampler.dump(missing, format)
        with self.assertRaisesRegex(ValueError, "format must be one of"):
            sampler.dump(missing, "svg")
        self.assertFalse(sampler.running)
        # Nothing is left running: another sampler starts.
        Sampler(1000).run(work, 1)

    def test_reinitializing_a_running_engine(self):
        engine = _sampling.Sampler(0.001)
        engine.start()
        try:
            with self.assertRaisesRegex(RuntimeError, "reinitialize"):
                engine.__init__(0.002)
        finally:
            engine.stop()


class BasicTests(unittest.TestCase):

    def test_run_returns_and_stops(self):
        sampler = Sampler(2000)
        self.assertEqual(sampler.run(work, 1), work(1))
        self.assertFalse(sampler.running)
        sampler.run(until_taken, sampler, 1, time.sleep, 0.001)
        info = sampler.info()
        self.assertGreater(info["taken"], 0)
        self.assertGreater(info["samples"], 0)
        self.assertEqual(info["rate"], 2000)
        self.assertAlmostEqual(info["interval"], 0.0005)
        self.assertLessEqual(info["taken"], info["ticks"] + 1)
        self.assertGreaterEqual(info["missed_share"], 0)

    def test_run_stops_on_exception(self):
        sampler = Sampler(1000)
        with self.assertRaises(ZeroDivisionError):
            sampler.run(lambda: 1 / 0)
        self.assertFalse(sampler.running)
        # The last sample, at stop, is always there.
        self.assertGreater(results(sampler)["total"], 0)

    def test_last_sample_at_stop(self):
        # Stopped at once, before the first tick: still one sample.
        sampler = Sampler(interval=3600)
        with sampler:
            pass
        r = results(sampler)
        self.assertEqual(r["total"], 1)
        [sample] = r["samples"]
        self.assertEqual(sample["ident"], threading.get_ident())
        self.assertIn("test_last_sample_at_stop", stack_names(sample))

    def test_restart_drops_what_was_recorded(self):
        sampler = Sampler(2000)
        sampler.run(work, 1)
        self.assertGreater(results(sampler)["total"], 0)
        sampler.run(lambda: None)
        # The second run's ticks and stop()'s sample, none of the first's.
        # (Held against the first run's total, this failed under load,
        # where the run of nothing took as long as the work: 6 ticks.)
        self.assertLessEqual(results(sampler)["total"],
                             sampler.info()["ticks"] + 1)
        self.assertNotIn("work", {
            f["name"] for f in results(sampler)["frames"]})

    def test_results_shape(self):
        sampler = Sampler(2000, memory_rate=200)
        sampler.start()
        # Past the first memory tick however loaded the machine; stop()
        # adds the final one.
        while sampler._engine.info()["taken"] < 11:
            work(1)
        # Those ticks may all have come while the thread waited for a CPU
        # outside work(): two more calls, which take many ticks.
        work(2)
        sampler.stop()
        r = results(sampler)
        self.assertEqual(set(r), {
            "interval", "start_time", "duration", "total", "frames",
            "samples", "threads", "memory", "start_memory", "max_memory",
            "end_memory"})
        self.assertEqual(r["total"], sum(s["weight"] for s in r["samples"]))
        for sample in r["samples"]:
            self.assertIn(sample["status"], STATUSES)
            self.assertGreater(sample["weight"], 0)
            self.assertLessEqual(sample["time"], r["duration"] + 0.01)
            for i in sample["frames"]:
                self.assertLess(i, len(r["frames"]))
        self.assertEqual(
            [t["ident"] for t in r["threads"]], [threading.get_ident()])
        self.assertEqual(r["threads"][0]["name"],
                         threading.current_thread().name)
        self.assertEqual(r["threads"][0]["native_id"],
                         threading.get_native_id())
        work_frames = [f for f in r["frames"] if f["name"] == "work"]
        self.assertTrue(work_frames)
        for frame in work_frames:
            self.assertEqual(frame["file"], __file__)
            self.assertEqual(frame["first_line"],
                             work.__code__.co_firstlineno)
        # Memory: the resident set, and the tracked bytes where counted.
        self.assertGreaterEqual(len(r["memory"]), 2)
        for m in r["memory"]:
            self.assertGreater(m["rss"], 0)
            if TRACKS_MEMORY:
                self.assertGreater(m["tracked"], 0)
            else:
                self.assertIsNone(m["tracked"])
                self.assertIsNone(m["types"])
        if TRACKS_MEMORY:
            # The last is read at stop(), by the thread that stops.
            self.assertIsInstance(r["memory"][-1]["types"], dict)
        values = [m["tracked"] if TRACKS_MEMORY else m["rss"]
                  for m in r["memory"]]
        self.assertEqual(r["start_memory"], values[0])
        self.assertEqual(r["max_memory"], max(values))
        self.assertEqual(r["end_memory"], values[-1])
        self.assertTrue(any(s["memory"] is not None for s in r["samples"]))

    @unittest.skipUnless(TRACKS_MEMORY, "needs --with-memory-tracking")
    def test_memory_samples_top_types(self):
        class Ballast:
            __slots__ = ("a", "b")

        ballast = [Ballast() for _ in range(100_000)]
        sampler = Sampler(1000, memory_rate=200)
        with sampler:
            # Past a few memory ticks however loaded the machine, with
            # Python code running after them.
            while sampler._engine.info()["taken"] < 20:
                work(1)
            work(1)
        usage = sys.type_memory_usage()
        memory = results(sampler)["memory"]
        read = [m["types"] for m in memory if m["types"] is not None]
        # Read at a check point while work() ran (the first memory sample
        # always is), and at stop().
        self.assertGreaterEqual(len(read), 2)
        self.assertIsNotNone(memory[-1]["types"])
        for types in read:
            self.assertLessEqual(len(types), 10)
            self.assertEqual(list(types.values()),
                             sorted(types.values(), reverse=True))
            self.assertTrue(all(v > 0 for v in types.values()))
            # The ballast is among the largest, with what sys says it has.
            self.assertEqual(types["Ballast"], usage["Ballast"])
        self.assertGreaterEqual(usage["Ballast"],
                                len(ballast) * Ballast.__basicsize__)

    @unittest.skipUnless(TRACKS_MEMORY, "needs --with-memory-tracking")
    def test_memory_types_of_one_name_are_summed(self):
        # Classes made by a function share a name: sys sums them, and so
        # does a memory sample, before it picks the largest.  No class
        # alone is among the largest; all together they are.
        def make_class():
            class Row:
                __slots__ = ("a", "b", "c")
            return Row

        rows = [cls() for cls in [make_class() for _ in range(2_000)]
                for _ in range(100)]
        sampler = Sampler(1000)
        with sampler:
            pass
        usage = sys.type_memory_usage()
        types = results(sampler)["memory"][-1]["types"]
        self.assertGreaterEqual(usage["Row"],
                                len(rows) * type(rows[0]).__basicsize__)
        self.assertEqual(types["Row"], usage["Row"])
        per_class = sys.type_memory_usage(by_type=True)[type(rows[0])]
        self.assertLess(per_class, min(types.values()))

    @unittest.skipUnless(TRACKS_MEMORY, "needs --with-memory-tracking")
    def test_memory_types_readings_are_spaced(self):
        # Objects freed all over a large heap: each reading looks into most
        # pools again, and the next memory samples go without, so that the
        # readings take a small share of the time.
        ballast = [[i] for i in range(300_000)]

        def scatter(count):
            for i in range(count):
                ballast[i * 7919 % len(ballast)] = [i]

        sampler = Sampler(1000, memory_rate=1000)
        with sampler:
            # A memory sample at each tick taken.
            until_taken(sampler, 40, scatter, 100_000)
        memory = results(sampler)["memory"]
        read = [m for m in memory if m["types"] is not None]
        self.assertGreater(len(memory), 20)
        self.assertGreaterEqual(len(read), 2)
        self.assertLess(len(read), len(memory) / 4)

    @unittest.skipUnless(TRACKS_MEMORY, "needs --with-memory-tracking")
    def test_memory_types_need_python_code_running(self):
        # No thread runs Python code while this one sleeps: no check point
        # reads the tags, until this one runs again.  (So the sleep cannot
        # be cut short at a number of ticks taken: looking would run
        # code.)
        sampler = on_schedule(time.sleep, 0.3, rate=1000, memory_rate=100)
        memory = results(sampler)["memory"]
        self.assertGreater(len(memory), 10)
        unread = [m for m in memory if m["types"] is None]
        self.assertGreaterEqual(len(unread), len(memory) - 3)
        self.assertIsInstance(memory[-1]["types"], dict)

    def test_no_memory_samples(self):
        sampler = Sampler(1000, memory_rate=0)
        sampler.run(work, 1)
        r = results(sampler)
        self.assertEqual(r["memory"], [])
        self.assertIsNone(r["max_memory"])
        self.assertTrue(all(s["memory"] is None for s in r["samples"]))

    def test_repr(self):
        sampler = Sampler(500, mode="cpu")
        self.assertEqual(repr(sampler), "<Sampler 500 Hz cpu stopped>")

    def test_consecutive_ticks_make_one_sample(self):
        # A thread doing the same thing at consecutive ticks has one sample
        # standing for them all.
        with sleeping_thread() as thread:
            sampler = Sampler(2000, thread=thread.ident)
            # A time, not an amount of work: work(5) took 10 ms here.
            sampler.run(spin, 0.05)
        r = results(sampler)
        self.assertGreater(r["total"], 20)
        self.assertEqual(len(r["samples"]), 1)
        self.assertEqual(r["samples"][0]["weight"], r["total"])
        self.assertEqual(sampler.info()["samples"], 1)


def shares_of_split_work(sampler):
    """The samples of a run of split_work() in one_share() or
    three_shares()."""
    return [s for s in results(sampler)["samples"]
            if {"one_share", "three_shares"} & set(stack_names(s))]


class AccuracyTests(unittest.TestCase):

    @heavy_on_schedule
    def test_split_of_work(self):
        # one_share() and three_shares() run the same loop, one and three
        # times as long: a quarter and three quarters of the time.
        # On-CPU time: the share stays the same when other processes
        # take the CPU.  No memory samples: a reading's ticks go to where
        # the thread was when it read.
        sampler = on_schedule(split_work, 20, rate=4000, mode="cpu",
                              memory_rate=0)
        own = {}
        samples = shares_of_split_work(sampler)
        for sample in samples:
            names = stack_names(sample)
            for name in ("one_share", "three_shares"):
                if name in names:
                    own[name] = own.get(name, 0) + sample["weight"]
        total = own["one_share"] + own["three_shares"]
        self.assertGreater(total, 100)
        self.assertAlmostEqual(own["one_share"] / total, 0.25,
                               delta=share_delta(samples, 0.25),
                               msg=largest(samples))

    @heavy_on_schedule
    def test_pstats_split(self):
        sampler = on_schedule(split_work, 20, rate=4000, mode="cpu",
                              memory_rate=0)
        stats = pstats.Stats(sampler)
        by_name = {func[2].rpartition(".")[2]: value
                   for func, value in stats.stats.items()}
        one, three = by_name["one_share"], by_name["three_shares"]
        share = one[2] / (one[2] + three[2])
        samples = shares_of_split_work(sampler)
        self.assertAlmostEqual(share, 0.25, delta=share_delta(samples, 0.25),
                               msg=largest(samples))
        # Cumulative time of the caller covers both.
        split = by_name["split_work"]
        self.assertGreaterEqual(split[3] + 1e-9, one[3] + three[3])
        self.assertEqual(set(one[4]), {
            (__file__, split_work.__code__.co_firstlineno, "split_work")})
        self.assertEqual(one[4][(__file__, split_work.__code__.co_firstlineno,
                                 "split_work")][3], one[3])

    def test_sleeping_thread_wall_and_cpu(self):
        def sampled(mode):
            with sleeping_thread() as thread:
                sampler = Sampler(2000, mode=mode, all_threads=True)
                sampler.run(work, 5)
            r = results(sampler)
            return [s for s in r["samples"] if s["ident"] == thread.ident]

        wall = sampled("wall")
        self.assertTrue(wall)
        for sample in wall:
            self.assertEqual(sample["status"], IDLE)
            self.assertEqual(stack_names(sample)[-3:],
                             ["sleeper", "wait", "wait"])
        self.assertEqual(
            wall[-1]["stack"][-3]["line"],
            line_of(sleeper, "sleeps here"))
        cpu = sampled("cpu")
        self.assertEqual(
            [s for s in cpu if "sleeper" in stack_names(s)], [])

    def test_cpu_mode_samples_the_working_thread(self):
        # Ticks enough that the thread is on a CPU at some (the system
        # may run other processes on it for milliseconds at a time).
        sampler = Sampler(2000, mode="cpu")
        sampler.run(until_taken, sampler, 100, work, 1)
        names = {n for s in results(sampler)["samples"]
                 for n in stack_names(s)}
        self.assertIn("work", names)

    def bursts_weight(self, pause, then):
        """The ticks of CPU time a thread running bursts() used, and its
        weight in cpu mode, while this thread runs then()."""
        used = []
        sampler = Sampler(4000, mode="cpu", all_threads=True, memory_rate=0)
        with sampler:
            thread = threading.Thread(target=bursts, args=(0.5, pause, used))
            thread.start()
            then()
            thread.join()
        samples = results(sampler)["samples"]
        weight = sum(s["weight"] for s in samples
                     if s["ident"] == thread.ident)
        return used[0] / sampler.interval, weight, largest(samples)

    def test_cpu_mode_counts_bursts_shorter_than_a_tick(self):
        # Each look sees a fraction of a tick used: what is not yet a
        # whole tick counts at a later look.
        ticks, weight, heaviest = self.bursts_weight(0.0002, lambda: None)
        self.assertAlmostEqual(weight, ticks, delta=0.05 * ticks + 3,
                               msg=heaviest)

    def test_cpu_mode_counts_the_cpu_before_a_gil_wait(self):
        # This thread holds the GIL, so that the other waits for it after
        # each burst (sleep(0) releases it): the CPU it used before it
        # began to wait counts.
        ticks, weight, heaviest = self.bursts_weight(0, lambda: spin(0.5))
        self.assertAlmostEqual(weight, ticks, delta=0.05 * ticks + 3,
                               msg=heaviest)

    def threads_in_turn(self, rate, seconds, count):
        """Runs *count* threads one after another, each using *seconds* of
        CPU time in burn(), sampled in cpu mode at *rate*: the CPU time
        each used in ticks, by its name, their threads' records by index,
        and their samples."""
        used = {}
        native_ids = set()

        def run_in_turn():
            used.clear()
            native_ids.clear()
            for i in range(count):
                thread = threading.Thread(target=burn, args=(seconds, used),
                                          name=f"burner-{i}")
                thread.start()
                thread.join()
                native_ids.add(thread.native_id)

        sampler = on_schedule(run_in_turn, rate=rate, mode="cpu",
                              all_threads=True, memory_rate=0)
        r = results(sampler)
        ours = {i for i, t in enumerate(r["threads"])
                if t["native_id"] in native_ids}
        samples = [s for s in r["samples"] if s["thread"] in ours]
        return ({name: cpu / sampler.interval for name, cpu in used.items()},
                {i: r["threads"][i] for i in ours}, samples)

    @heavy_on_schedule
    def test_cpu_mode_counts_a_thread_from_its_start_to_its_end(self):
        # Each thread lives about three ticks: the CPU time before its
        # first look and after its last counts, at its stack at the
        # nearest look.  (One that a stall of the sampler kept from being
        # looked at counts too, with no stack.)
        used, threads, samples = self.threads_in_turn(2000, 0.0015, 40)
        ticks = sum(used.values())
        weight = sum(s["weight"] for s in samples)
        self.assertAlmostEqual(weight, ticks, delta=0.05 * ticks + 2,
                               msg=largest(samples))
        looked_at = {s["thread"] for s in samples if s["stack"]}
        self.assertGreaterEqual(len(looked_at), 20)
        theirs = [s for s in samples if s["thread"] in looked_at]
        in_burn = sum(s["weight"] for s in theirs
                      if "burn" in stack_names(s))
        self.assertGreaterEqual(
            in_burn, 0.9 * sum(s["weight"] for s in theirs), largest(theirs))
        named = [i for i in looked_at
                 if threads[i]["name"].startswith("burner-")]
        self.assertGreaterEqual(len(named), 0.9 * len(looked_at))
        # Each thread's own time, but for rounding (the time left over
        # goes to the next thread that ends); not a tick less, as when the
        # time before its first look was counted at its end, cut to the
        # ticks since its last look.
        weights = {threads[i]["name"]: 0 for i in named}
        for s in samples:
            if s["thread"] in named:
                weights[threads[s["thread"]]["name"]] += s["weight"]
        off = {name: (w, round(used[name], 2))
               for name, w in weights.items() if abs(w - used[name]) >= 1}
        self.assertLessEqual(len(off), len(named) // 10, off)

    def test_cpu_mode_counts_threads_between_two_ticks(self):
        # Most of them start and end between two ticks, and are never
        # looked at: their CPU time counts as they end, with no stack; the
        # time left over, less than half a tick, goes to the next one.
        used, _, samples = self.threads_in_turn(1000, 0.0002, 200)
        ticks = sum(used.values())
        weight = sum(s["weight"] for s in samples)
        self.assertAlmostEqual(weight, ticks, delta=0.15 * ticks + 3,
                               msg=largest(samples))

    def test_long_c_call_is_in_c_at_its_line(self):
        sampler = on_schedule(lambda: [long_c_call() for _ in range(3)],
                              rate=5000)
        line = line_of(long_c_call, "the C call")
        in_c = [s for s in results(sampler)["samples"]
                if s["status"] == IN_C and s["stack"]
                and s["stack"][-1]["name"] == "long_c_call"]
        self.assertTrue(in_c)
        source = source_line(line)
        at_sum = 0
        for sample in in_c:
            frame = sample["stack"][-1]
            self.assertEqual(frame["line"], line)
            if (source[frame["column"]:frame["end_column"]]
                    == "sum(range(40 * UNIT))"):
                at_sum += sample["weight"]
        # The call's columns: sum(...).  A few ticks may fall at range(...)
        # when the system took the CPU away from the thread just before,
        # and the thread answered late there.
        self.assertGreater(at_sum, 0.9 * sum(s["weight"] for s in in_c))

    @heavy_on_schedule
    def test_c_work_before_a_call_is_the_callers(self):
        # The thread answers late at the start of takes_product(), which
        # has run none of its code: the ticks are the caller's, at the
        # call, in C.
        x = 7 ** 300_000
        sampler = on_schedule(
            lambda: [multiply_then_call(x) for _ in range(5)], rate=2000)
        samples = results(sampler)["samples"]
        line = line_of(multiply_then_call, "the multiplication")
        in_c = [s for s in samples if s["status"] == IN_C and s["stack"]
                and s["stack"][-1]["name"] == "multiply_then_call"]
        self.assertTrue(in_c)
        source = source_line(line)
        for sample in in_c:
            frame = sample["stack"][-1]
            self.assertEqual(frame["line"], line)
            self.assertEqual(source[frame["column"]:frame["end_column"]],
                             "takes_product(x * x)")
        start = takes_product.__code__.co_firstlineno
        self.assertEqual(
            [s for s in samples if s["stack"]
             and s["stack"][-1]["name"] == "takes_product"
             and s["stack"][-1]["line"] == start], [])

    def test_lines_of_a_thread_read_directly(self):
        # A thread not holding the GIL is read as it is: the line and
        # columns of the call it is blocked in.
        with sleeping_thread() as thread:
            sampler = Sampler(2000, thread=thread.ident)
            sampler.run(work, 2)
        r = results(sampler)
        self.assertEqual({s["ident"] for s in r["samples"]}, {thread.ident})
        frame = [f for f in r["samples"][0]["stack"]
                 if f["name"] == "sleeper"][0]
        line = line_of(sleeper, "sleeps here")
        self.assertEqual(frame["line"], line)
        self.assertEqual(frame["end_line"], line)
        source = source_line(line)
        self.assertEqual(source[frame["column"]:frame["end_column"]],
                         "stop.wait()")

    def test_waiting_for_the_gil(self):
        def spin():
            work(8)

        def run_threads():
            threads = [threading.Thread(target=spin) for _ in range(2)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()

        sampler = on_schedule(run_threads, rate=2000, all_threads=True)
        statuses = {s["status"] for s in results(sampler)["samples"]
                    if "spin" in stack_names(s)}
        self.assertIn(WAITING_FOR_GIL, statuses)
        self.assertIn(RUNNING, statuses)


class StackTests(unittest.TestCase):

    def samples_with(self, name, sampler):
        return [s for s in results(sampler)["samples"]
                if name in stack_names(s)]

    def test_generator(self):
        sampler = on_schedule(consume_generator, 10, rate=4000)
        samples = self.samples_with("work", sampler)
        self.assertTrue(samples)
        for sample in samples:
            names = stack_names(sample)
            self.assertEqual(names[-3:], ["consume_generator",
                                          "spinning_generator", "work"])

    def test_coroutine(self):
        self.addCleanup(asyncio.set_event_loop_policy, None)
        # A coroutine of its own for each run.
        sampler = on_schedule(lambda: asyncio.run(outer_coroutine(10)),
                              rate=4000)
        samples = self.samples_with("work", sampler)
        self.assertTrue(samples)
        for sample in samples:
            names = stack_names(sample)
            self.assertEqual(names[-3:], ["outer_coroutine",
                                          "inner_coroutine", "work"])

    def test_deep_recursion(self):
        depth = 10_000
        # Until sampled, rather than on schedule: a stack this deep takes
        # the sampler longer than a tick under the sanitizers.
        sampler = Sampler(2000)
        with support.infinite_recursion(depth + 1000):
            sampler.run(recurse, depth, lambda: until_sampled(sampler))
        samples = self.samples_with("work", sampler)
        self.assertTrue(samples)
        for sample in samples:
            names = stack_names(sample)
            self.assertEqual(names.count("recurse"), depth + 1)
            self.assertEqual(names[-1], "work")

    def test_threads(self):
        def run_threads():
            threads = [threading.Thread(target=f, name=f.__name__)
                       for f in (first, second)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()

        # The threads run for a few milliseconds each: a stall of the
        # sampler meanwhile would not see them.
        sampler = on_schedule(run_threads, rate=2000, all_threads=True)
        self.assertEqual(functions_by_thread_name(results(sampler)),
                         {"first": {"first"}, "second": {"second"}})

    def test_threads_gone_before_stop_keep_their_names(self):
        # One after another, so that the second often has the first's
        # ident, and neither referred to at stop: named while they ran.
        def run_thread(function):
            t = threading.Thread(target=function, name=function.__name__)
            t.start()
            t.join()
            return t.ident, t.native_id

        def run_threads():
            ids[:] = [run_thread(first), run_thread(second)]
            gc.collect()

        # A stall of the sampler's thread could outlast a thread.
        ids = []
        sampler = on_schedule(run_threads, rate=2000, all_threads=True)
        self.assertFalse({(t.ident, t.native_id) for t in threading._dangling}
                         & set(ids))
        r = results(sampler)
        self.assertEqual(
            [t["name"] for t in r["threads"]
             if (t["ident"], t["native_id"]) in ids], ["first", "second"])
        self.assertEqual(functions_by_thread_name(r),
                         {"first": {"first"}, "second": {"second"}})

    def test_export_of_a_reused_ident_is_the_latest_thread(self):
        # glibc gives a new thread the stack, so the ident, of one that
        # has exited.  join() returns a little before the kernel's thread
        # is gone (a third of the time, the next thread got another
        # stack): waiting for that makes the reuse all but certain.
        for _ in range(5):
            sampler = Sampler(2000, all_threads=True)
            with sampler:
                threads = [threading.Thread(target=f) for f in (first, second)]
                for t in threads:
                    t.start()
                    t.join()
                    wait_until_gone(t)
            # Both sampled: a stalled sampler may miss a thread.
            idents = [ident for ident, _, _ in sampler.threads()]
            if (threads[0].ident == threads[1].ident
                    and idents.count(threads[1].ident) == 2):
                break
        else:
            self.skipTest("no ident was used again by two threads sampled")
        with tempfile.TemporaryDirectory() as tmp:
            path = os.path.join(tmp, "p.cpuprofile")
            sampler.dump_cpuprofile(path, thread=threads[1].ident)
            with open(path, encoding="utf-8") as f:
                nodes = json.load(f)["nodes"]
        names = {n["callFrame"]["functionName"].rpartition(".")[2]
                 for n in nodes}
        self.assertIn("second", names)
        self.assertNotIn("first", names)

    def test_thread_names_looked_up_without_running_code(self):
        # A thread class whose _name is a property: looking it up would
        # run Python code at the eval loop's check point, so the sampler
        # leaves it, and the thread, gone at stop, goes by its native id.
        calls = []
        working = threading.Event()

        class OddThread(threading.Thread):
            @property
            def _name(self):
                if working.is_set():
                    calls.append(threading.get_ident())
                return self.__dict__["odd_name"]

            @_name.setter
            def _name(self, value):
                self.__dict__["odd_name"] = value

        def run():
            working.set()
            work(4)
            working.clear()

        sampler = Sampler(2000, all_threads=True)
        with sampler:
            thread = OddThread(target=run, name="odd")
            thread.start()
            thread.join()
            native_id = thread.native_id
            del thread
            gc.collect()
        self.assertEqual(calls, [])
        for _, n, name in sampler.threads():
            if n == native_id:
                self.assertEqual(name, str(native_id))

    def test_thread_not_started_by_threading(self):
        # _thread's threads are not in threading's table: native ids.
        import _thread
        worked = threading.Event()
        finish = threading.Event()
        native_ids = []

        def run():
            native_ids.append(threading.get_native_id())
            work(4)
            worked.set()
            finish.wait()

        sampler = Sampler(2000, all_threads=True)
        with threading_helper.wait_threads_exit():
            try:
                with sampler:
                    _thread.start_new_thread(run, ())
                    self.assertTrue(worked.wait(support.SHORT_TIMEOUT))
            finally:
                finish.set()
        # Still running at stop, so sampled then at least.
        names = {n: name for _, n, name in sampler.threads()}
        self.assertEqual(names[native_ids[0]], str(native_ids[0]))

    def test_thread_named_once_threading_has_it(self):
        # Looked at (and asked for its stack) before threading has it in
        # its table, it is looked up again at the first tick after, though
        # in cpu mode nothing asks it then (it uses no CPU time to speak
        # of).  Its Thread is gone by stop(), so only the engine can have
        # named it.  (Each wait is for ticks taken, not a time: a stall of
        # the sampler's thread could pass a time.)
        sampler = Sampler(2000, mode="cpu", all_threads=True, memory_rate=0)

        class LateEntry(threading.Thread):
            def _set_native_id(self):
                # Holding the GIL, not yet in threading._active.
                until_taken(sampler, 10, spin, 0.001)
                super()._set_native_id()

        def run_late():
            thread = LateEntry(target=until_taken,
                               args=(sampler, 2, time.sleep, 0.001),
                               name="late")
            thread.start()
            thread.join()

        sampler.run(run_late)
        self.assertIn("late", [name for _, _, name in sampler.threads()],
                      sampler.info())

    def test_one_given_thread(self):
        def other():
            work(4)
        thread = threading.Thread(target=other)
        sampler = Sampler(2000, thread=threading.get_ident())
        with sampler:
            thread.start()
            thread.join()
        self.assertEqual({s["ident"] for s in results(sampler)["samples"]},
                         {threading.get_ident()})

    def test_threads_known_once_started(self):
        # A new thread's state exists, holding the ident of the thread
        # that made it, before the new thread runs: the sampler must not
        # take it for its maker's.
        main = threading.get_ident()
        for all_threads in (False, True):
            sampler = Sampler(50_000, all_threads=all_threads)
            with sampler:
                for _ in range(300):
                    thread = threading.Thread(target=work, args=(0,))
                    thread.start()
                    thread.join()
            threads = sampler.threads()
            if all_threads:
                native_ids = [native_id for _, native_id, _ in threads]
                self.assertEqual(len(set(native_ids)), len(native_ids))
            else:
                self.assertEqual([ident for ident, _, _ in threads], [main])

    def test_many_threads_one_record_each(self):
        # Each thread has one record, found again at every tick however
        # many there are (the last tick, at stop(), sees them all).
        stop = threading.Event()
        threads = [threading.Thread(target=stop.wait) for _ in range(200)]
        sampler = Sampler(1000, all_threads=True)
        try:
            with sampler:
                for t in threads:
                    t.start()
                time.sleep(0.1)
        finally:
            stop.set()
            for t in threads:
                t.join()
        idents = [ident for ident, _, _ in sampler.threads()]
        self.assertEqual(sorted(idents),
                         sorted([threading.get_ident()]
                                + [t.ident for t in threads]))

    def test_code_freed_while_sampling(self):
        # Code objects sampled and freed while the sampler runs keep their
        # names, and a code object made at a freed one's address is not
        # taken for it.
        def make_call_and_free(sampler):
            for k in range(40):
                namespace = {"until_sampled": until_sampled,
                             "sampler": sampler}
                exec(compile(f"def fn_{k}():\n    until_sampled(sampler)\n",
                             f"<generated {k}>", "exec"), namespace)
                namespace[f"fn_{k}"]()
                del namespace
                gc.collect()

        sampler = Sampler(5000)
        sampler.run(make_call_and_free, sampler)
        names = set()
        for frame in results(sampler)["frames"]:
            if frame["name"].startswith("fn_"):
                names.add(frame["name"])
                self.assertEqual(frame["file"],
                                 f"<generated {frame['name'][3:]}>")
                # At the call: an answer at its start is its caller's.
                self.assertEqual(frame["line"], 2)
        self.assertEqual(names, {f"fn_{k}" for k in range(40)})


class StressTests(unittest.TestCase):

    @threading_helper.requires_working_threading()
    def test_highest_rate_over_threads_coming_and_going(self):
        # In cpu mode the threads' ends add samples too.
        for mode in ("wall", "cpu"):
            with self.subTest(mode=mode):
                self.threads_coming_and_going(mode)

    def threads_coming_and_going(self, mode):
        stop = threading.Event()
        started = [0, 0]  # threads each spawner started
        names = {}  # by (ident, native_id): idents are reused at once

        def short_lived(depth):
            recurse(depth, lambda: work(0) if depth % 2 else time.sleep(0))

        def spawner(index):
            n = 0
            while not stop.is_set():
                threads = [threading.Thread(target=short_lived,
                                            args=(n % 50 + i,),
                                            name=f"short-{index}-{n}-{i}")
                           for i in range(4)]
                for t in threads:
                    t.start()
                    names[t.ident, t.native_id] = t.name
                started[index] += len(threads)
                for t in threads:
                    t.join()
                n += 1

        spawners = [threading.Thread(target=spawner, args=(i,))
                    for i in range(2)]
        sampler = Sampler(profiling.sampling.MAX_RATE, mode=mode,
                          all_threads=True, memory_rate=1000)
        with sampler:
            for t in spawners:
                t.start()
            # A second, and at least 64 threads: on a loaded machine this
            # thread's GIL keeps the spawners to a few threads a second.
            at_least = time.monotonic() + 1.0
            give_up = at_least + support.SHORT_TIMEOUT
            while ((time.monotonic() < at_least or sum(started) < 64)
                   and time.monotonic() < give_up):
                recurse(200, lambda: work(1))
            stop.set()
            for t in spawners:
                t.join()
        r = results(sampler)
        self.assertGreater(len(r["threads"]), 8)
        self.assertEqual(ticks_out_of_order(r), [])
        # Each thread has its own name, or (gone before it was looked up)
        # its native id; and some were looked up in time.
        named = 0
        for t in r["threads"]:
            given = names.get((t["ident"], t["native_id"]))
            if given is not None and t["name"] != str(t["native_id"]):
                self.assertEqual(t["name"], given)
                named += 1
        self.assertGreater(named, 0)
        for sample in r["samples"]:
            self.assertIn(sample["thread"], range(len(r["threads"])))
            functions = stack_names(sample)
            if "short_lived" in functions[:-1]:
                self.assertEqual(
                    functions[functions.index("short_lived") + 1], "recurse")

    def test_ticks_of_threads_contending_for_the_gil(self):
        # At a tick when the sampler cannot take the GIL's mutex at once,
        # it asks the thread that holds the GIL and owes the others the
        # tick: each tick still goes to one sample, in order, though the
        # thread asked may have left the GIL (its answer then stands for
        # the tick) and a thread owed ticks may be asked next.
        def contend():
            threads = [threading.Thread(target=work, args=(20,))
                       for _ in range(4)]
            for t in threads:
                t.start()
            work(20)
            for t in threads:
                t.join()

        for mode in ("wall", "cpu"):
            # In wall mode, a thread never looked at while it lived (a
            # stall) has no record.
            sampler = on_schedule(contend, rate=10_000, mode=mode,
                                  all_threads=True)
            r = results(sampler)
            self.assertEqual(ticks_out_of_order(r), [], msg=mode)
            self.assertEqual(len(r["threads"]), 5)

    def test_start_stop_repeatedly_from_threads(self):
        errors = []

        def worker():
            for _ in range(50):
                try:
                    with Sampler(profiling.sampling.MAX_RATE,
                                 all_threads=True):
                        work(0)
                except RuntimeError as exc:
                    # Another thread's sampler runs.
                    if "another sampler" not in str(exc):
                        errors.append(exc)

        threads = [threading.Thread(target=worker) for _ in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        self.assertEqual(errors, [])


class ProcessTests(unittest.TestCase):

    @support.requires_fork()
    def test_fork(self):
        sampler = Sampler(5000, all_threads=True)
        sampler.start()
        # Something recorded before the fork, however loaded the machine.
        while not sampler._engine.info()["samples"]:
            work(1)
        pid = os.fork()
        if pid == 0:
            status = 0
            try:
                # The child has no sampler running, keeps what was
                # recorded before, and can sample again.
                if sampler.running:
                    status = 1
                elif not sampler.results()["samples"]:
                    status = 2
                else:
                    # Until it samples work(), however loaded the machine.
                    for _ in range(100):
                        other = Sampler(5000)
                        other.run(work, 1)
                        if "work" in {f["name"]
                                      for f in other.results()["frames"]}:
                            break
                    else:
                        status = 3
            except BaseException:
                status = 4
            os._exit(status)
        work(1)
        sampler.stop()
        support.wait_process(pid, exitcode=0)
        self.assertIn("work", {f["name"] for f in results(sampler)["frames"]})

    def test_signals_and_blocking_calls(self):
        # The sampler sends no signal: blocking calls are not interrupted,
        # and the program's own handlers run as they would.
        received = []
        old = signal.signal(signal.SIGUSR1,
                            lambda *args: received.append(args[0]))
        self.addCleanup(signal.signal, signal.SIGUSR1, old)
        r, w = os.pipe()
        self.addCleanup(os.close, r)
        self.addCleanup(os.close, w)

        def later():
            time.sleep(0.2)
            os.write(w, b"x")

        writer = threading.Thread(target=later)
        with Sampler(profiling.sampling.MAX_RATE, all_threads=True):
            writer.start()
            self.assertEqual(os.read(r, 1), b"x")
            time.sleep(0.05)
            signal.raise_signal(signal.SIGUSR1)
            writer.join()
        self.assertEqual(received, [signal.SIGUSR1])

    @unittest.skipUnless(sys.platform == "linux", "Linux only")
    def test_sampler_keeps_off_the_cpu_of_the_running_thread(self):
        # Woken on the CPU of the thread holding the GIL, the sampler
        # thread would preempt it at every tick: it moves to the others.
        cpus = os.sched_getaffinity(0)
        if len(cpus) < 2:
            self.skipTest("needs two CPUs")
        first = min(cpus)
        self.addCleanup(os.sched_setaffinity, 0, cpus)
        with Sampler(1000, all_threads=True):
            [sampler] = [tid for tid in os.listdir("/proc/self/task")
                         if thread_name(tid) == "sampler"]
            # This thread (0 is the calling thread) runs on the first CPU
            # only, and the sampler is put there too.
            os.sched_setaffinity(0, {first})
            os.sched_setaffinity(int(sampler), {first})
            deadline = time.monotonic() + support.SHORT_TIMEOUT
            while (first in os.sched_getaffinity(int(sampler))
                   and time.monotonic() < deadline):
                work(1)
            self.assertEqual(os.sched_getaffinity(int(sampler)),
                             cpus - {first})

    @unittest.skipUnless(sys.platform == "linux", "Linux only")
    def test_ticks_of_a_stall_before_stop_are_missed(self):
        # The process is stopped (SIGSTOP) for 0.2 s, and stop() called as
        # it continues, before the sampler's thread wakes: the ticks of the
        # stall are the last sample's weight, and missed.  A helper
        # continues it, once it sees it stopped.  The sampler's thread
        # shares this thread's one CPU (so the GIL's holder cannot move
        # it) in the idle class: it runs only once this thread waits for
        # it in stop().
        import subprocess
        code = textwrap.dedent(f"""
            import os, signal, time
            def state():
                with open("/proc/{os.getpid()}/stat") as f:
                    return f.read().rpartition(")")[2].split()[0]
            deadline = time.monotonic() + {support.SHORT_TIMEOUT}
            while state() != "T" and time.monotonic() < deadline:
                time.sleep(0.001)
            time.sleep(0.2)
            os.kill({os.getpid()}, signal.SIGCONT)
        """)
        waker = subprocess.Popen([sys.executable, "-c", code])
        self.addCleanup(waker.wait)
        cpus = os.sched_getaffinity(0)
        self.addCleanup(os.sched_setaffinity, 0, cpus)
        os.sched_setaffinity(0, {min(cpus)})
        sampler = Sampler(1000)
        with sampler:
            # Past the sampler's own choice of scheduling, at its start.
            while not sampler._engine.info()["taken"]:
                time.sleep(0.001)
            [tid] = [tid for tid in os.listdir("/proc/self/task")
                     if thread_name(tid) == "sampler"]
            os.sched_setscheduler(int(tid), os.SCHED_IDLE,
                                  os.sched_param(0))
            os.kill(os.getpid(), signal.SIGSTOP)
        info = sampler.info()
        self.assertGreaterEqual(info["ticks"], 200)
        # The ticks of the 0.2 s stall are missed, but the one the sampler
        # slept for, which stop() takes; not those of the wait for the
        # sampler in stop(), which another process on this CPU can make
        # long (its ticks are neither taken nor missed).
        self.assertGreaterEqual(info["missed"], 180)

    def test_sampler_left_running_at_exit(self):
        code = textwrap.dedent("""
            import profiling.sampling
            s = profiling.sampling.Sampler(10000, all_threads=True)
            s.start()
            sum(range(100000))
        """)
        script_helper.assert_python_ok("-c", code)

    def test_with_tracemalloc(self):
        # tracemalloc's hooks on Python's allocators take the GIL, which
        # the sampler's thread must never wait for: it holds the GIL's
        # mutex at a tick.  In a child process, so that a hang fails.
        code = textwrap.dedent("""
            import threading, tracemalloc
            from profiling.sampling import Sampler
            def work():
                return [str(i) for i in range(100_000)]
            tracemalloc.start()
            sampler = Sampler(10_000, all_threads=True)
            with sampler:
                threads = [threading.Thread(target=work) for _ in range(4)]
                for t in threads:
                    t.start()
                work()
                for t in threads:
                    t.join()
            print(sampler.info()["samples"] > 0)
        """)
        import subprocess
        proc = subprocess.run([sys.executable, "-c", code],
                              capture_output=True, text=True,
                              timeout=support.SHORT_TIMEOUT)
        self.assertEqual(proc.stdout, "True\n", proc.stderr)


class Recorded(unittest.TestCase):
    """A profile of two threads, the main one splitting its work."""

    @classmethod
    def setUpClass(cls):
        def record():
            thread = threading.Thread(target=work, args=(5,),
                                      name="worker")
            thread.start()
            split_work(5)
            thread.join()

        cls.sampler = on_schedule(record, rate=4000, memory_rate=100,
                                  all_threads=True)
        # Gone with the class's tests: how many names a profile holds
        # varies from run to run, and would read as a leak under -R.
        cls.addClassCleanup(delattr, cls, "sampler")

    def setUp(self):
        self.tmp = tempfile.mkdtemp()
        self.addCleanup(os_helper.rmtree, self.tmp)

    def path(self, name):
        return os.path.join(self.tmp, name)


class ExportTests(Recorded):

    def test_pstats_file(self):
        self.sampler.dump_stats(self.path("p.prof"))
        stats = pstats.Stats(self.path("p.prof"))
        names = {func[2] for func in stats.stats}
        self.assertLessEqual({"split_work", "one_share", "three_shares"},
                             names)
        with open(self.path("p.prof"), "rb") as f:
            self.assertEqual(marshal.load(f), stats.stats)

    def test_pstats_callers_and_callees(self):
        import io
        out = io.StringIO()
        stats = pstats.Stats(self.sampler, stream=out)
        stats.sort_stats("cumulative").print_callees("split_work")
        stats.print_callers("one_share")
        text = out.getvalue()
        self.assertIn("one_share", text)
        self.assertIn("three_shares", text)

    def test_print_stats(self):
        import io
        out = io.StringIO()
        self.sampler.print_stats("cumtime", 5, file=out)
        lines = out.getvalue().splitlines()
        self.assertIn("samples of 2 threads", lines[0])
        self.assertEqual(len(lines), 3 + 5)
        with self.assertRaisesRegex(ValueError, "sort must be"):
            self.sampler.print_stats("calls")

    def test_collapsed(self):
        self.sampler.dump_collapsed(self.path("c.txt"))
        total = 0
        with open(self.path("c.txt"), encoding="utf-8") as f:
            for line in f:
                stack, _, count = line.rstrip("\n").rpartition(" ")
                total += int(count)
                frames = stack.split(";")
                self.assertTrue(frames[0].startswith("thread "))
        self.assertEqual(total, results(self.sampler)["total"])

    def test_speedscope(self):
        self.sampler.dump_speedscope(self.path("s.json"))
        with open(self.path("s.json"), encoding="utf-8") as f:
            data = json.load(f)
        names = {p["name"] for p in data["profiles"]}
        self.assertEqual(names, {"thread MainThread", "thread worker"})
        for profile in data["profiles"]:
            self.assertEqual(profile["type"], "sampled")
            self.assertEqual(len(profile["samples"]),
                             len(profile["weights"]))

    def test_cpuprofile(self):
        self.sampler.dump_cpuprofile(self.path("p.cpuprofile"))
        with open(self.path("p.cpuprofile"), encoding="utf-8") as f:
            profile = json.load(f)
        nodes = {n["id"]: n for n in profile["nodes"]}
        self.assertEqual(profile["nodes"][0]["callFrame"]["functionName"],
                         "(root)")
        self.assertEqual(len(profile["samples"]),
                         len(profile["timeDeltas"]))
        self.assertEqual(sum(n["hitCount"] for n in nodes.values()),
                         len(profile["samples"]))
        for node in nodes.values():
            for child in node["children"]:
                self.assertIn(child, nodes)
        names = {n["callFrame"]["functionName"] for n in nodes.values()}
        self.assertLessEqual({"split_work", "one_share", "three_shares"},
                             names)
        self.assertNotIn("worker", names)
        one = [n for n in nodes.values()
               if n["callFrame"]["functionName"] == "one_share"]
        self.assertEqual(one[0]["callFrame"]["lineNumber"],
                         one_share.__code__.co_firstlineno - 1)
        lines = {t["line"] for n in one for t in n.get("positionTicks", ())}
        self.assertTrue(lines)
        self.assertLessEqual(lines, set(range(
            one_share.__code__.co_firstlineno,
            one_share.__code__.co_firstlineno + 5)))
        self.assertTrue(all(d >= 0 for d in profile["timeDeltas"]))
        self.assertGreaterEqual(profile["endTime"], profile["startTime"])
        # Another thread's.
        worker = [t for t in self.sampler.threads() if t[2] == "worker"][0]
        self.sampler.dump_cpuprofile(self.path("w.cpuprofile"), worker[0])
        with open(self.path("w.cpuprofile"), encoding="utf-8") as f:
            names = {n["callFrame"]["functionName"]
                     for n in json.load(f)["nodes"]}
        self.assertIn("work", names)
        self.assertNotIn("split_work", names)
        with self.assertRaisesRegex(ValueError, "no thread"):
            self.sampler.dump_cpuprofile(self.path("x"), 12345)

    def test_gecko(self):
        self.sampler.dump_gecko(self.path("g.json"))
        with open(self.path("g.json"), encoding="utf-8") as f:
            profile = json.load(f)
        meta = profile["meta"]
        self.assertEqual(meta["interval"], 0.25)
        self.assertEqual(len(profile["threads"]), 2)
        ticks = 0
        for thread in profile["threads"]:
            self.assertEqual(thread["pid"], os.getpid())
            strings = thread["stringTable"]
            frames = thread["frameTable"]["data"]
            stacks = thread["stackTable"]["data"]
            for prefix, frame in stacks:
                self.assertTrue(prefix is None or prefix < len(stacks))
                self.assertLess(frame, len(frames))
            for frame in frames:
                self.assertLess(frame[0], len(strings))
                self.assertEqual(len(frame), 8)
            times = [s[1] for s in thread["samples"]["data"]]
            self.assertEqual(times, sorted(times))
            ticks += len(times)
        self.assertEqual(ticks, results(self.sampler)["total"])
        main = [t for t in profile["threads"] if t["name"] == "MainThread"]
        self.assertEqual(main[0]["tid"], threading.main_thread().native_id)
        locations = set(main[0]["stringTable"])
        self.assertIn(f"one_share ({__file__}:"
                      f"{one_share.__code__.co_firstlineno})", locations)
        [counter] = profile["counters"]
        self.assertEqual(counter["name"], "Memory")
        self.assertGreater(sum(p[1] for p in counter["samples"]["data"]), 0)

    def test_flamegraph(self):
        self.sampler.dump_flamegraph(self.path("f.html"))
        with open(self.path("f.html"), encoding="utf-8") as f:
            page = f.read()
        self.assertTrue(page.startswith("<!DOCTYPE html>"))
        self.assertNotIn("http://", page.replace(
            "https://www.speedscope.app", ""))
        self.assertNotIn("src=", page)
        self.assertIn("three_shares", page)

    def test_flamegraph_escapes_names(self):
        sampler = Sampler(4000)
        namespace = {"until_sampled": until_sampled, "sampler": sampler}
        exec("def f():\n    until_sampled(sampler)\n", namespace)
        namespace["f"].__code__ = namespace["f"].__code__.replace(
            co_name="</script><!--", co_qualname="</script><!--")
        sampler.run(namespace["f"])
        sampler.dump_flamegraph(self.path("e.html"))
        with open(self.path("e.html"), encoding="utf-8") as f:
            page = f.read()
        self.assertEqual(page.count("</script>"), 2)
        self.assertIn(r"\u003c/script>\u003c!--", page)


class ViewerTests(Recorded):
    """The files, loaded by the viewers' own code (test.support.viewers)."""

    def shown_in_speedscope(self, path):
        from test.support import viewers
        shown = viewers.speedscope_import(path)
        return {p["name"]: {f["name"] for f in p["frames"]}
                for p in shown["profiles"]}

    def test_speedscope_in_speedscope(self):
        self.sampler.dump_speedscope(self.path("s.json"))
        shown = self.shown_in_speedscope(self.path("s.json"))
        self.assertEqual(set(shown), {"thread MainThread", "thread worker"})
        self.assertLessEqual({"split_work", "one_share", "three_shares"},
                             shown["thread MainThread"])
        self.assertIn("work", shown["thread worker"])
        # The waits for the GIL show in the profiles of the threads that
        # waited, and only there.  (Whether the two threads took turns
        # depends on the system: on a loaded one, the worker may finish
        # before the main thread runs again.)
        r = results(self.sampler)
        waited = {f"thread {r['threads'][s['thread']]['name']}"
                  for s in r["samples"] if s["status"] == WAITING_FOR_GIL}
        for name, frames in shown.items():
            with self.subTest(profile=name):
                self.assertEqual("<waiting for the GIL>" in frames,
                                 name in waited)

    def test_cpuprofile_in_speedscope(self):
        self.sampler.dump_cpuprofile(self.path("p.cpuprofile"))
        [frames] = self.shown_in_speedscope(
            self.path("p.cpuprofile")).values()
        self.assertLessEqual({"split_work", "one_share", "three_shares"},
                             frames)

    def test_collapsed_in_speedscope(self):
        self.sampler.dump_collapsed(self.path("c.txt"))
        [frames] = self.shown_in_speedscope(self.path("c.txt")).values()
        self.assertIn("thread worker", frames)
        self.assertIn(f"three_shares ({__file__}:"
                      f"{three_shares.__code__.co_firstlineno})", frames)

    def test_cpuprofile_in_devtools(self):
        from test.support import viewers
        self.sampler.dump_cpuprofile(self.path("p.cpuprofile"))
        shown = viewers.devtools_cpuprofile(self.path("p.cpuprofile"))
        self.assertLessEqual({"split_work", "one_share", "three_shares"},
                             set(shown["function_names"]))

    def test_flamegraph_in_chromium(self):
        from test.support import viewers
        self.sampler.dump_flamegraph(self.path("f.html"))
        shown = viewers.html_page(self.path("f.html"), wait_for=".frame")
        self.assertEqual(shown["title"], "profiling.sampling")
        self.assertIn("samples", shown["text"])
        # The menu of threads, and the graph of the first.
        self.assertIn("MainThread", shown["text"])
        self.assertIn("worker", shown["text"])
        self.assertIn("three_shares", shown["text"])


class CommandLineTests(unittest.TestCase):

    def setUp(self):
        self.tmp = tempfile.mkdtemp()
        self.addCleanup(os_helper.rmtree, self.tmp)
        self.script = os.path.join(self.tmp, "prog.py")
        with open(self.script, "w", encoding="utf-8") as f:
            f.write(textwrap.dedent("""
                import sys
                def busy():
                    return sum(i * i for i in range(300_000))
                def main():
                    for _ in range(3):
                        busy()
                    print("program output", sys.argv[1:])
                main()
                sys.exit(int(sys.argv[1]) if sys.argv[1:] else 0)
            """))

    def run_cli(self, *args, exit=0, isolated=True):
        result = script_helper.run_python_until_end(
            "-m", "profiling.sampling", "run", *args, __cwd=self.tmp,
            __isolated=isolated)
        result = result[0]
        self.assertEqual(result.rc, exit, result.err.decode())
        return result.out.decode(), result.err.decode()

    def run_cli_sampled(self, *args, **options):
        """run_cli(), run again while the summary says a quarter of the
        ticks were missed: a stall of the sampler may have hidden the
        program's 30 ms of work.  (Some ticks are always late while the
        program starts, 10% at 5 kHz.)"""
        for _ in range(4):
            out, err = self.run_cli(*args, **options)
            missed = re.search(r"([\d.]+)% missed", err)
            self.assertIsNotNone(missed, err)
            if float(missed[1]) < 25:
                break
        return out, err

    def test_table_by_default(self):
        out, err = self.run_cli_sampled("-r", "5khz", self.script, "0")
        self.assertTrue(out.startswith("program output ['0']\n"), out)
        self.assertIn("own%", out)
        self.assertIn("busy (prog.py:3)", out)
        self.assertRegex(err, r"profiling.sampling: [\d,]+ ticks in ")

    def test_exit_status_is_the_programs(self):
        out, err = self.run_cli(self.script, "3", exit=3)
        self.assertIn("program output ['3']", out)

    def test_formats(self):
        for option in ("--format=speedscope", "--collapsed", "--gecko",
                       "--flamegraph", "--pstats", "--format=cpuprofile"):
            with self.subTest(option=option):
                path = os.path.join(self.tmp, "out")
                out, err = self.run_cli_sampled(option, "-o", path,
                                                self.script)
                self.assertEqual(out, "program output []\n")
                self.assertIn("written to " + path, err)
                with open(path, "rb") as f:
                    content = f.read()
                if option == "--pstats":
                    self.assertIn("busy", {
                        func[2] for func in marshal.loads(content)})
                else:
                    self.assertIn(b"busy", content)

    def test_default_file_names(self):
        out, err = self.run_cli("--collapsed", self.script)
        [name] = [n for n in os.listdir(self.tmp)
                  if n.startswith("collapsed.")]
        self.assertRegex(name, r"collapsed\.\d+\.txt")

    def test_module(self):
        os.mkdir(os.path.join(self.tmp, "pkg"))
        with open(os.path.join(self.tmp, "pkg", "__init__.py"), "w"):
            pass
        os.rename(self.script, os.path.join(self.tmp, "pkg", "prog.py"))
        # As python -m does, the module is found from the current
        # directory.
        out, err = self.run_cli_sampled("-a", "--mode", "cpu", "-m",
                                        "pkg.prog", "0", isolated=False)
        self.assertIn("program output ['0']", out)
        self.assertIn("busy (prog.py:3)", out)

    def test_duration(self):
        with open(self.script, "w", encoding="utf-8") as f:
            f.write("import time\nfor _ in range(100):\n"
                    "    time.sleep(0.01)\nprint('done')\n")
        out, err = self.run_cli("-d", "0.2", "-s", "cumtime", self.script)
        # The table is printed when sampling stops, before the program
        # ends.
        self.assertLess(out.index("own%"), out.index("done"))

    def test_bad_arguments(self):
        for args, message in (
                (["-r", "0", self.script], "the rate must be"),
                (["-r", "fast", self.script], "not a rate"),
                (["-r", "200khz", self.script], "at most"),
                (["--format", "svg", self.script], "invalid choice"),
                (["--mode", "gil", self.script], "invalid choice"),
                (["-d", "-1", self.script], "not a duration"),
                (["-o", os.path.join(self.tmp, "no", "such"), self.script],
                 "cannot write"),
                ([os.path.join(self.tmp, "missing.py")], "cannot read"),
                (["--collapsed", "--gecko", self.script], "not allowed")):
            with self.subTest(args=args):
                out, err = self.run_cli(*args, exit=2)
                self.assertIn(message, err)
                self.assertNotIn("program output", out)


if __name__ == "__main__":
    unittest.main()
