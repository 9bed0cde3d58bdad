"""Tests for profiling.tracing and the cProfile engine on sys.monitoring."""

import cProfile
import dis
import gc
import io
import json
import marshal
import os
import pstats
import re
import sys
import sysconfig
import tempfile
import textwrap
import threading
import unittest
from test import support
from test.support import os_helper
from test.support import script_helper

import _lsprof
import profiling.tracing
from profiling.tracing import Profile

M = sys.monitoring
TRACKS_MEMORY = bool(sysconfig.get_config_var("Py_TRACK_MEMORY"))


class Clock:
    """A timer that only moves where a test moves it, in whole ticks."""

    def __init__(self):
        self.now = 0

    def __call__(self):
        return self.now


def name(code):
    return code if isinstance(code, str) else code.co_name


def by_name(entries):
    """getstats() entries by function name, of the functions of this file
    and the built-ins (whose names are unique in the tests)."""
    result = {}
    for entry in entries:
        if (isinstance(entry.code, str)
                or entry.code.co_filename in (__file__, "<string>")):
            assert name(entry.code) not in result, name(entry.code)
            result[name(entry.code)] = entry
    return result


def ticking_profile(**kwargs):
    clock = Clock()
    kwargs.setdefault("builtins", False)
    kwargs.setdefault("timeunit", 1.0)
    return clock, Profile(timer=clock, **kwargs)


def nested_profile(**kwargs):
    """A profile of top() calling mid() calling leaf() twice, which spend
    100, 10 and 1 ticks of their own."""
    clock, profile = ticking_profile(**kwargs)

    def leaf():
        clock.now += 1

    def mid():
        clock.now += 10
        leaf()
        leaf()

    def top():
        clock.now += 100
        mid()

    with profile:
        top()
    return profile


class TestTimes(unittest.TestCase):
    """Counts and times, with a clock that moves only in the code."""

    def test_nested_calls(self):
        profile = nested_profile()
        stats = by_name(profile.getstats())
        self.assertEqual((stats["top"].callcount, stats["top"].inlinetime,
                          stats["top"].totaltime), (1, 100, 112))
        self.assertEqual((stats["mid"].callcount, stats["mid"].inlinetime,
                          stats["mid"].totaltime), (1, 10, 12))
        self.assertEqual((stats["leaf"].callcount, stats["leaf"].inlinetime,
                          stats["leaf"].totaltime), (2, 2, 2))
        callees = {name(sub.code): sub for sub in stats["mid"].calls}
        self.assertEqual(callees["leaf"].callcount, 2)
        self.assertEqual(callees["leaf"].totaltime, 2)

    def test_times_add_up(self):
        # Every tick spent in a recorded frame is in exactly one tottime.
        clock, profile = ticking_profile()

        def f(n):
            clock.now += 3
            if n:
                f(n - 1)
                g(n)
            clock.now += 5

        def g(n):
            clock.now += n
            try:
                h()
            except ValueError:
                clock.now += 7

        def h():
            clock.now += 11
            raise ValueError

        with profile:
            start = clock.now
            f(6)
            spent = clock.now - start
        entries = profile.getstats()
        self.assertEqual(sum(e.inlinetime for e in entries), spent)
        self.assertEqual(by_name(entries)["f"].totaltime, spent)

    def test_recursion(self):
        clock, profile = ticking_profile()

        def fib(n):
            clock.now += 1
            return n if n < 2 else fib(n - 1) + fib(n - 2)

        with profile:
            fib(10)
        entry = by_name(profile.getstats())["fib"]
        self.assertEqual(entry.callcount, 177)
        self.assertEqual(entry.callcount - entry.reccallcount, 1)
        # Counted once, in the outermost call, not once per level.
        self.assertEqual(entry.totaltime, 177)
        self.assertEqual(entry.inlinetime, 177)
        self_calls = {name(s.code): s for s in entry.calls}["fib"]
        self.assertEqual(self_calls.callcount, 176)
        self.assertEqual(self_calls.reccallcount, 174)

    def test_more_edges_than_cached(self):
        # Each edge of the tree taken twice: more edges than the profiler
        # keeps at hand, many to the same callee from another caller.
        # Every node is found again, none made twice, none taken for
        # another.
        clock, profile = ticking_profile()
        namespace = {}
        exec("\n".join(f"def f{i}(): pass" for i in range(8)), namespace)
        leaves = [namespace[f"f{i}"] for i in range(8)]
        codes = [leaf.__code__ for leaf in leaves]

        def caller(depth):
            for leaf in leaves:
                leaf()
            if depth:
                caller(depth - 1)

        with profile:
            caller(200)
            caller(200)
        [(_, nodes)] = profile.calltree()
        ours = [n for n in nodes if n[1] in (caller.__code__, *codes)]
        self.assertEqual(len(ours), 201 + 201 * 8)
        self.assertEqual({n[2] for n in ours}, {2})
        for node in ours:
            if node[1] in codes:
                self.assertIs(nodes[node[0]][1], caller.__code__)

    def test_mutual_recursion(self):
        clock, profile = ticking_profile()

        def even(n):
            clock.now += 1
            return True if n == 0 else odd(n - 1)

        def odd(n):
            clock.now += 1
            return False if n == 0 else even(n - 1)

        with profile:
            even(9)
        stats = by_name(profile.getstats())
        self.assertEqual(stats["even"].callcount, 5)
        self.assertEqual(stats["odd"].callcount, 5)
        self.assertEqual(stats["even"].reccallcount, 4)
        self.assertEqual(stats["even"].totaltime, 10)
        self.assertEqual(stats["odd"].totaltime, 9)

    def test_generator_counts_one_call(self):
        # 3.11 counted every resume as a call (gh-86717), and charged the
        # time the generator was suspended to nothing.
        clock, profile = ticking_profile()

        def gen():
            clock.now += 1
            yield
            clock.now += 2
            yield
            clock.now += 4

        def consume():
            g = gen()
            next(g)
            clock.now += 100
            next(g)
            clock.now += 1000
            next(g, None)

        with profile:
            consume()
        stats = by_name(profile.getstats())
        self.assertEqual(stats["gen"].callcount, 1)
        self.assertEqual(stats["gen"].inlinetime, 7)
        self.assertEqual(stats["gen"].totaltime, 7)
        self.assertEqual(stats["consume"].inlinetime, 1100)
        self.assertEqual(stats["consume"].totaltime, 1107)

    def test_generator_resumed_elsewhere(self):
        clock, profile = ticking_profile()

        def gen():
            while True:
                clock.now += 1
                yield

        def a(g):
            next(g)

        def b(g):
            next(g)
            next(g)

        with profile:
            g = gen()
            a(g)
            b(g)
        stats = by_name(profile.getstats())
        self.assertEqual(stats["gen"].callcount, 1)
        self.assertEqual(stats["gen"].inlinetime, 3)
        callers = {}
        for entry in profile.getstats():
            for sub in entry.calls or ():
                if name(sub.code) == "gen":
                    callers[name(entry.code)] = (sub.callcount,
                                                 sub.inlinetime)
        # The call was made under a; b only resumed it.
        self.assertEqual(callers, {"a": (1, 1), "b": (0, 2)})

    def test_coroutine(self):
        import asyncio
        clock, profile = ticking_profile()

        async def child():
            clock.now += 1
            await asyncio.sleep(0)
            clock.now += 2

        async def parent():
            await child()
            await child()

        with profile:
            asyncio.run(parent())
        stats = by_name(e for e in profile.getstats()
                        if name(e.code) in ("child", "parent"))
        self.assertEqual(stats["child"].callcount, 2)
        self.assertEqual(stats["child"].inlinetime, 6)
        self.assertEqual(stats["parent"].callcount, 1)

    def test_throw_and_close(self):
        clock, profile = ticking_profile()

        def gen():
            try:
                clock.now += 1
                yield
            except KeyError:
                clock.now += 10
                yield
            finally:
                clock.now += 100

        with profile:
            g = gen()
            next(g)
            g.throw(KeyError)
            g.close()
        entry = by_name(profile.getstats())["gen"]
        self.assertEqual(entry.callcount, 1)
        self.assertEqual(entry.inlinetime, 111)

    def test_exception_unwinds_frames(self):
        clock, profile = ticking_profile()

        def inner():
            clock.now += 1
            raise KeyError

        def middle():
            clock.now += 10
            inner()

        def outer():
            try:
                middle()
            except KeyError:
                clock.now += 100

        with profile:
            outer()
        stats = by_name(profile.getstats())
        self.assertEqual(stats["inner"].totaltime, 1)
        self.assertEqual(stats["middle"].totaltime, 11)
        self.assertEqual(stats["outer"].totaltime, 111)

    def test_exec_eval_and_comprehensions(self):
        clock, profile = ticking_profile()
        namespace = {"clock": clock}
        with profile:
            exec("def f(x):\n    clock.now += x\n    return x\n", namespace)
            eval("[f(i) for i in range(4)]", namespace)
        entries = profile.getstats()
        names = [name(e.code) for e in entries]
        # exec's code and eval's.
        self.assertEqual(names.count("<module>"), 2)
        self.assertEqual(names.count("<listcomp>"), 1)
        [f] = [e for e in entries if name(e.code) == "f"]
        self.assertEqual((f.callcount, f.inlinetime), (4, 6))

    def test_enabled_mid_call(self):
        # Frames open when the profiler starts are on no stack: what runs
        # after, in them and below, is what counts.
        clock, profile = ticking_profile()

        def leaf():
            clock.now += 1

        def outer():
            profile.enable()
            leaf()
            clock.now += 50

        outer()
        leaf()
        profile.disable()
        stats = by_name(profile.getstats())
        self.assertNotIn("outer", stats)
        self.assertEqual(stats["leaf"].callcount, 2)

    def test_open_calls_count_so_far(self):
        # Statistics taken while calls are open count those calls with the
        # time they took so far: a caller's own time is what it took less
        # what its callees took.
        clock, profile = ticking_profile()
        taken = {}

        def leaf():
            clock.now += 1

        def outer():
            clock.now += 10
            leaf()
            clock.now += 5
            taken.update(by_name(profile.getstats()))
            clock.now += 100

        with profile:
            outer()
        self.assertEqual((taken["outer"].callcount, taken["outer"].inlinetime,
                          taken["outer"].totaltime), (1, 15, 16))
        self.assertEqual((taken["leaf"].inlinetime, taken["leaf"].totaltime),
                         (1, 1))
        [(_, nodes)] = profile.calltree()
        outer_node = next(n for n in nodes if name(n[1]) == "outer")
        self.assertEqual(outer_node[3:5], (116, 115))

    def test_open_calls_count_on_disable(self):
        clock, profile = ticking_profile()

        def running():
            clock.now += 5
            profile.disable()

        profile.enable()
        running()
        entry = by_name(profile.getstats())["running"]
        self.assertEqual((entry.callcount, entry.inlinetime), (1, 5))


class TestOverhead(unittest.TestCase):

    def times(self, profile):
        return {n: (e.inlinetime, e.totaltime)
                for n, e in by_name(profile.getstats()).items()}

    def test_set_overhead(self):
        profile = nested_profile()
        raw = self.times(profile)
        # Half a tick of each call to the callee, a quarter to the caller.
        profile.set_overhead(((0.5, 0.25), (0.0, 0.0)))
        self.assertEqual(self.times(profile), {
            "leaf": (1, 1), "mid": (9, 10), "top": (99, 109)})
        [(_, nodes)] = profile.calltree()
        self.assertEqual(sorted((name(n[1]), n[3], n[4]) for n in nodes
                                if name(n[1]) in ("leaf", "mid", "top")),
                         [("leaf", 1, 1), ("mid", 10, 9), ("top", 109, 99)])
        profile.set_overhead(None)
        self.assertEqual(self.times(profile), raw)

    def test_never_below_zero(self):
        profile = nested_profile(timeunit=1e-9)
        profile.set_overhead(((0.5, 0.5), (0.5, 0.5)))
        for inline, total in self.times(profile).values():
            self.assertEqual((inline, total), (0, 0))

    def test_bad_overhead(self):
        profile = Profile()
        for bad in ((1, 2), ((0.1, 0.1), (0.1,)), "x", ((-1, 0), (0, 0)),
                    ((float("nan"), 0), (0, 0)), ((2.0, 0), (0, 0))):
            with self.subTest(bad=bad):
                with self.assertRaises((TypeError, ValueError)):
                    profile.set_overhead(bad)

    def test_calibrate(self):
        def nothing():
            pass

        profile = Profile()
        (py_in, py_out), (c_in, c_out) = profile.calibrate(calls=20_000)
        for value in (py_in, py_out, c_in, c_out):
            self.assertGreaterEqual(value, 0.0)
            self.assertLess(value, 1e-3)
        with profile:
            for _ in range(1000):
                nothing()
        for entry in profile.getstats():
            self.assertGreaterEqual(entry.inlinetime, 0.0)
            self.assertGreaterEqual(entry.totaltime, entry.inlinetime)


class TestBuiltins(unittest.TestCase):

    def test_builtin_functions_and_methods(self):
        profile = Profile()
        with profile:
            len([1])
            [].append(1)
            "x".join(["a"])
            sorted([3, 1], key=abs)
        names = {name(e.code): e.callcount for e in profile.getstats()}
        self.assertEqual(names["<built-in method builtins.len>"], 1)
        self.assertEqual(names["<method 'append' of 'list' objects>"], 1)
        self.assertEqual(names["<method 'join' of 'str' objects>"], 1)
        self.assertEqual(names["<built-in method builtins.sorted>"], 1)
        # Called by sorted(), from C: not a call the profiler sees.
        self.assertNotIn("<built-in method builtins.abs>", names)

    def test_builtins_off(self):
        profile = Profile(builtins=False)
        with profile:
            len([1])
        self.assertFalse([e for e in profile.getstats()
                          if isinstance(e.code, str)])

    def test_subcalls_off(self):
        profile = Profile(subcalls=False)

        def f():
            len([])

        with profile:
            f()
        self.assertTrue(all(e.calls is None for e in profile.getstats()))

    def test_builtin_raising(self):
        # C_RAISE closes the built-in's frame.
        clock, profile = ticking_profile(builtins=True)

        def after():
            clock.now += 1

        def f():
            try:
                divmod(1, 0)
            except ZeroDivisionError:
                pass
            after()

        with profile:
            f()
        stats = by_name(profile.getstats())
        self.assertEqual(stats["<built-in method builtins.divmod>"]
                         .callcount, 1)
        callers = {name(e.code) for e in profile.getstats()
                   for s in e.calls or () if name(s.code) == "after"}
        self.assertEqual(callers, {"f"})

    def test_other_tools_still_hear_every_call(self):
        # The profiler hears of calls of built-ins only; a Python tool
        # beside it is told of every call.
        seen = []
        M.use_tool_id(M.DEBUGGER_ID, "test")
        try:
            M.register_callback(
                M.DEBUGGER_ID, M.events.CALL,
                lambda code, offset, callable, arg0: seen.append(callable))
            M.set_events(M.DEBUGGER_ID, M.events.CALL)

            def f():
                pass

            with Profile():
                f()
                len([])
            M.set_events(M.DEBUGGER_ID, 0)
        finally:
            M.free_tool_id(M.DEBUGGER_ID)
        self.assertIn(f, seen)
        self.assertIn(len, seen)


class TestProfilers(unittest.TestCase):

    def test_nested_profilers_both_record(self):
        def a():
            pass

        def b():
            pass

        outer, inner = Profile(), Profile()
        with outer:
            a()
            with inner:
                b()
            a()
        outer_names = {name(e.code): e.callcount for e in outer.getstats()}
        inner_names = {name(e.code): e.callcount for e in inner.getstats()}
        self.assertEqual(outer_names["a"], 2)
        self.assertEqual(outer_names["b"], 1)
        self.assertNotIn("a", inner_names)
        self.assertEqual(inner_names["b"], 1)

    def test_one_profiler_per_thread(self):
        results = {}
        barrier = threading.Barrier(2)

        def work(tag):
            def f():
                pass
            with Profile() as profile:
                barrier.wait()
                for _ in range(10 + tag):
                    f()
                barrier.wait()
            results[tag] = by_name(profile.getstats())["f"].callcount

        threads = [threading.Thread(target=work, args=(i,)) for i in (0, 1)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        self.assertEqual(results, {0: 10, 1: 11})

    def test_records_only_its_thread_by_default(self):
        def in_thread():
            pass

        with Profile() as profile:
            t = threading.Thread(target=in_thread)
            t.start()
            t.join()
        names = {name(e.code) for e in profile.getstats()}
        self.assertNotIn("in_thread", names)
        self.assertEqual(profile.threads(), [threading.get_ident()])

    def test_all_threads(self):
        # Alive together, so that their idents differ.
        together = threading.Barrier(2)

        def in_thread():
            together.wait()
            for _ in range(3):
                leaf()

        def leaf():
            pass

        with Profile(all_threads=True) as profile:
            threads = [threading.Thread(target=in_thread) for _ in range(2)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            leaf()
        self.assertEqual(by_name(profile.getstats())["leaf"].callcount, 7)
        idents = profile.threads()
        self.assertEqual(len(idents), 3)
        main = threading.get_ident()
        self.assertEqual(
            by_name(profile.getstats(main))["leaf"].callcount, 1)
        others = [i for i in idents if i != main]
        for ident in others:
            stats = by_name(profile.getstats(ident))
            self.assertEqual(stats["in_thread"].callcount, 1)
        # Each thread on its own stack: leaf is always under in_thread.
        for ident in others:
            for _, nodes in profile.calltree(ident):
                for parent, code, *_ in nodes:
                    if name(code) == "leaf":
                        self.assertEqual(name(nodes[parent][1]), "in_thread")

    def test_getprofile(self):
        profile = Profile()
        self.assertIsNone(sys.getprofile())
        with profile:
            self.assertIs(sys.getprofile(), profile)
            with Profile() as inner:
                self.assertIs(sys.getprofile(), inner)
            self.assertIs(sys.getprofile(), profile)
        self.assertIsNone(sys.getprofile())

    def test_another_tool_on_profiler_id(self):
        M.use_tool_id(M.PROFILER_ID, "someone else")
        try:
            with self.assertRaisesRegex(ValueError, "Another profiling tool"):
                Profile().enable()
        finally:
            M.free_tool_id(M.PROFILER_ID)
        with Profile():
            self.assertEqual(M.get_tool(M.PROFILER_ID), "cProfile")
        self.assertIsNone(M.get_tool(M.PROFILER_ID))

    def test_enable_disable_from_another_thread(self):
        profile = Profile(all_threads=True)

        def other():
            pass

        t = threading.Thread(target=profile.enable)
        t.start()
        t.join()
        other()
        t = threading.Thread(target=profile.disable)
        t.start()
        t.join()
        self.assertIn("other", {name(e.code) for e in profile.getstats()})

    def test_clear_while_enabled(self):
        def f():
            pass

        with Profile() as profile:
            f()
            profile.clear()
            f()
        self.assertEqual(by_name(profile.getstats())["f"].callcount, 1)

    def test_fork(self):
        if not hasattr(os, "fork"):
            self.skipTest("needs os.fork")
        code = textwrap.dedent("""
            import os, profiling.tracing
            def f():
                pass
            profile = profiling.tracing.Profile()
            profile.enable()
            pid = os.fork()
            f()
            profile.disable()
            names = [e.code.co_name for e in profile.getstats()
                     if not isinstance(e.code, str)]
            assert names.count("f") == 1, names
            if pid == 0:
                os._exit(0)
            _, status = os.waitpid(pid, 0)
            assert os.waitstatus_to_exitcode(status) == 0
            print("ok")
        """)
        rc, out, err = script_helper.assert_python_ok("-c", code)
        self.assertEqual(out.strip(), b"ok")

    def test_deep_recursion(self):
        def down(n):
            return down(n - 1) if n else 0

        limit = sys.getrecursionlimit()
        sys.setrecursionlimit(12_000)
        try:
            with Profile() as profile:
                down(10_000)
        finally:
            sys.setrecursionlimit(limit)
        entry = by_name(profile.getstats())["down"]
        self.assertEqual(entry.callcount, 10_001)
        [(_, nodes)] = profile.calltree()
        self.assertEqual(sum(name(n[1]) == "down" for n in nodes), 10_001)

    def test_threads_start_and_exit_under_profilers(self):
        # Many short threads, several profilers enabled and disabled.
        def short():
            sum(range(100))

        profiles = [Profile(all_threads=True) for _ in range(3)]
        profiles[0].enable()
        threads = []
        for i in range(40):
            t = threading.Thread(target=short)
            threads.append(t)
            t.start()
            if i % 10 == 5:
                profiles[1 + i // 20].enable()
        for t in threads:
            t.join()
        for profile in profiles:
            profile.disable()
        self.assertEqual(
            by_name(profiles[0].getstats())["short"].callcount, 40)


class TestInclude(unittest.TestCase):

    def make_module(self, directory, modname, source):
        path = os.path.join(directory, modname + ".py")
        with open(path, "w") as f:
            f.write(textwrap.dedent(source))
        return path

    def test_include_path(self):
        with tempfile.TemporaryDirectory() as tmp:
            self.make_module(tmp, "sg_mine", """
                import sg_theirs
                def work():
                    return sg_theirs.helper(lambda: leaf())
                def leaf():
                    return 1
            """)
            self.make_module(tmp, "sg_theirs", """
                def helper(callback):
                    return callback() + inner()
                def inner():
                    return 2
            """)
            sys.path.insert(0, tmp)
            try:
                import sg_mine
                mine = sg_mine.__file__
                with Profile(include=[mine]) as profile:
                    sg_mine.work()
                    sg_mine.work()
            finally:
                sys.path.remove(tmp)
                sys.modules.pop("sg_mine", None)
                sys.modules.pop("sg_theirs", None)
        stats = {name(e.code): e for e in profile.getstats()
                 if not isinstance(e.code, str)}
        self.assertEqual(set(stats), {"work", "leaf", "<lambda>"})
        self.assertEqual(stats["leaf"].callcount, 2)
        # The lambda is called by helper, which is not recorded: its
        # caller is the nearest recorded frame.
        callers = {name(e.code) for e in profile.getstats()
                   for s in e.calls or () if name(s.code) == "<lambda>"}
        self.assertEqual(callers, {"work"})

    def test_include_module_names(self):
        import json.encoder
        with Profile(include=["json"]) as profile:
            json.dumps({"a": [1, 2]})
            os.path.join("a", "b")
        files = {e.code.co_filename for e in profile.getstats()
                 if not isinstance(e.code, str)}
        self.assertTrue(files)
        directory = os.path.dirname(json.__file__)
        for filename in files:
            self.assertTrue(filename.startswith(directory), filename)

    def test_excluded_code_is_left_alone(self):
        # Once it has started, code outside the filter runs as unprofiled:
        # nothing instrumented, calls specialized.
        def callee(x):
            return x

        def outside():
            total = 0
            for i in range(20):
                total += callee(i) + len([i])
            return total

        with Profile(include=["/nowhere/at/all"]) as profile:
            for _ in range(3):
                outside()
            ops = {i.opname for i in dis.get_instructions(outside,
                                                          adaptive=True)}
        self.assertEqual(profile.getstats(), [])
        self.assertFalse({op for op in ops if op.startswith("INSTRUMENTED")},
                         ops)
        # Specialized forms, which an instrumented call site never has.
        self.assertIn("PRECALL_PYFUNC", ops)
        self.assertIn("PRECALL_NO_KW_LEN", ops)

    def test_filtered_and_unfiltered_together(self):
        import json
        with tempfile.TemporaryDirectory() as tmp:
            self.make_module(tmp, "sg_a", "def a():\n    return 1\n")
            self.make_module(tmp, "sg_b", "def b():\n    return 2\n")
            sys.path.insert(0, tmp)
            try:
                import sg_a
                import sg_b
                only_a = Profile(include=["sg_a"])
                only_b = Profile(include=["sg_b"])
                everything = Profile()
                with only_a:
                    sg_a.a()
                    with only_b:
                        sg_a.a()
                        sg_b.b()
                        with everything:
                            sg_a.a()
                            sg_b.b()
                        sg_b.b()
            finally:
                sys.path.remove(tmp)
                sys.modules.pop("sg_a", None)
                sys.modules.pop("sg_b", None)

        def counts(profile):
            return {name(e.code): e.callcount for e in profile.getstats()
                    if name(e.code) in ("a", "b")}

        self.assertEqual(counts(only_a), {"a": 3})
        self.assertEqual(counts(only_b), {"b": 3})
        self.assertEqual(counts(everything), {"a": 1, "b": 1})

    def test_filtered_then_unfiltered(self):
        def f():
            pass

        with Profile(include=["/nowhere"]):
            f()
        with Profile() as profile:
            f()
        self.assertEqual(by_name(profile.getstats())["f"].callcount, 1)

    def test_bad_include(self):
        with self.assertRaises(TypeError):
            Profile(include="json")
        with self.assertRaises(TypeError):
            Profile(include=[1])
        with self.assertRaises(ValueError):
            Profile(include=["no_such_module_anywhere_xyz"])
        with self.assertRaises(TypeError):
            _lsprof.Profiler(include=[b"/tmp"])


@unittest.skipUnless(TRACKS_MEMORY, "needs --with-memory-tracking")
class TestMemory(unittest.TestCase):

    def test_allocated_and_retained(self):
        def make(n):
            return [bytearray(1000) for _ in range(n)]

        def outer():
            kept = make(10)
            make(20)
            return kept

        with Profile(builtins=False) as profile:
            kept = outer()
        stats = by_name(profile.getstats())
        self.assertGreaterEqual(stats["outer"].allocated, 30 * 1000)
        self.assertGreaterEqual(stats["outer"].retained, 10 * 1000)
        self.assertLess(stats["outer"].retained, 20 * 1000)
        # make's list comprehension allocates; outer itself little.
        self.assertLess(stats["outer"].inlineallocated, 1000)
        self.assertGreaterEqual(stats["<listcomp>"].inlineallocated,
                                30 * 1000)
        # What outer's own code freed: the second list, made below it.
        self.assertLess(stats["outer"].inlineretained, -19 * 1000)
        del kept

    def test_bytes_of_open_calls(self):
        taken = {}

        def make(n):
            return [bytearray(1000) for _ in range(n)]

        def outer():
            kept = make(20)
            taken.update(by_name(profile.getstats()))
            return kept

        with Profile(builtins=False) as profile:
            kept = outer()
        self.assertGreaterEqual(taken["outer"].allocated, 20 * 1000)
        self.assertGreaterEqual(taken["outer"].retained, 20 * 1000)
        self.assertLess(abs(taken["outer"].inlineallocated), 1000)
        del kept

    def test_pstats_columns_and_keys(self):
        def big():
            return bytes(200_000)

        def small():
            return bytes(10)

        with Profile() as profile:
            keep = [big(), small()]
        out = io.StringIO()
        stats = pstats.Stats(profile, stream=out)
        stats.sort_stats("cumalloc").print_stats()
        text = out.getvalue()
        self.assertIn("cumalloc", text)
        lines = [l for l in text.splitlines() if "(big)" in l or "(small)"
                 in l]
        self.assertIn("(big)", lines[0])
        with tempfile.TemporaryDirectory() as tmp:
            path = os.path.join(tmp, "prof")
            profile.dump_stats(path)
            with open(path, "rb") as f:
                first = marshal.load(f)
            # What a stock pstats reads: the statistics alone.
            self.assertTrue(all(len(v) == 5 for v in first.values()))
            loaded = pstats.Stats(path)
            self.assertEqual(loaded.memory_stats, stats.memory_stats)
            loaded.add(path)
            func = next(f for f in loaded.memory_stats if f[2] == "big")
            self.assertEqual(loaded.memory_stats[func][0],
                             2 * stats.memory_stats[func][0])
        del keep

    def test_memory_off(self):
        with Profile(memory=False) as profile:
            bytes(100)
        self.assertTrue(all(e.allocated is None for e in profile.getstats()))
        self.assertIsNone(pstats.Stats(profile).memory_stats)


@unittest.skipIf(TRACKS_MEMORY, "a build without memory tracking")
class TestNoMemory(unittest.TestCase):

    def test_memory_refused(self):
        with self.assertRaisesRegex(ValueError, "memory-tracking"):
            Profile(memory=True)
        with Profile() as profile:
            bytes(100)
        self.assertTrue(all(e.allocated is None for e in profile.getstats()))


class Exported(unittest.TestCase):
    """A profile of three functions, and a directory for its files."""

    def setUp(self):
        self.tmp = tempfile.mkdtemp()
        self.addCleanup(os_helper.rmtree, self.tmp)

        def leaf():
            sum(range(10))

        def middle():
            leaf()
            leaf()

        def root():
            middle()
            leaf()

        self.profile = Profile()
        with self.profile:
            root()
        self.lines = {f.__name__: f.__code__.co_firstlineno
                      for f in (leaf, middle, root)}

    def path(self, name):
        return os.path.join(self.tmp, name)


class TestExports(Exported):

    def test_folded(self):
        self.profile.dump_folded(self.path("f"))
        with open(self.path("f"), encoding="utf-8") as f:
            lines = f.read().splitlines()
        stacks = {}
        for line in lines:
            stack, weight = line.rsplit(" ", 1)
            self.assertGreater(int(weight), 0)
            stacks[tuple(s.split(" (")[0] for s in stack.split(";"))] = 1
        self.assertIn(("root", "middle", "leaf"), stacks)
        self.assertIn(("root", "leaf"), stacks)

    def test_stacks(self):
        [(ident, stacks)] = self.profile.stacks()
        self.assertEqual(ident, threading.get_ident())
        paths = [tuple(f[0] for f in stack) for stack, _ in stacks]
        self.assertIn(("root", "middle", "leaf"), paths)
        self.assertIn(("root", "middle", "leaf",
                       "<built-in method builtins.sum>"), paths)
        total = sum(w for _, w in stacks)
        self.assertAlmostEqual(
            total, sum(e.inlinetime for e in self.profile.getstats()),
            places=9)

    def test_speedscope(self):
        self.profile.dump_speedscope(self.path("s.json"))
        with open(self.path("s.json"), encoding="utf-8") as f:
            data = json.load(f)
        frames = data["shared"]["frames"]
        [profile] = data["profiles"]
        self.assertEqual(profile["type"], "sampled")
        self.assertEqual(len(profile["samples"]), len(profile["weights"]))
        names = {frames[i]["name"] for s in profile["samples"] for i in s}
        self.assertLessEqual({"root", "middle", "leaf"}, names)
        self.assertAlmostEqual(profile["endValue"], sum(profile["weights"]))

    def test_callgrind(self):
        self.profile.dump_callgrind(self.path("callgrind.out"))
        with open(self.path("callgrind.out"), encoding="utf-8") as f:
            text = f.read()
        self.assertTrue(text.startswith("# callgrind format\n"))
        functions = {}
        current = None
        names = {}
        for line in text.splitlines():
            key, _, value = line.partition("=")
            if key in ("fn", "cfn"):
                number, full = re.fullmatch(r"\((\d+)\)(?: (.*))?",
                                            value).groups()
                if full:
                    names[number] = full
                fname = names[number].split(" (")[0]
                if key == "fn":
                    current = functions.setdefault(fname, {"calls": {}})
                else:
                    callee = fname
            elif key == "calls":
                current["calls"][callee] = int(value.split()[0])
        self.assertEqual(functions["middle"]["calls"], {"leaf": 2})
        self.assertEqual(functions["root"]["calls"],
                         {"middle": 1, "leaf": 1})

    def test_cli(self):
        script = self.path("script.py")
        with open(script, "w") as f:
            f.write("def spin():\n    return sum(range(100))\n"
                    "import sys\nprint('out', sys.argv[1:])\nspin()\n")
        rc, out, err = script_helper.assert_python_ok(
            "-m", "profiling.tracing", script, "a", "b")
        self.assertIn(b"out ['a', 'b']", out)
        self.assertIn(b"(spin)", out)
        for fmt, check in [("speedscope", lambda t: json.loads(t)),
                           ("folded", lambda t: t.index("spin")),
                           ("callgrind", lambda t: t.index("spin")),
                           ("pstats", None)]:
            target = self.path("out." + fmt)
            rc, out, err = script_helper.assert_python_ok(
                "-m", "profiling.tracing", "--format", fmt, "-o", target,
                script)
            self.assertEqual(out.strip(), b"out []")
            if check is None:
                self.assertIn(("spin",), {f[2:] for f in
                                          pstats.Stats(target).stats})
            else:
                with open(target, encoding="utf-8") as f:
                    check(f.read())
        rc, out, err = script_helper.assert_python_failure(
            "-m", "profiling.tracing", "--format", "speedscope", script)
        self.assertIn(b"needs --outfile", err)


class ViewerTests(Exported):
    """The files, loaded by the viewers' own code (test.support.viewers)."""

    def shown_in_speedscope(self, path):
        """The frame names speedscope's app shows, per profile."""
        from test.support import viewers
        shown = viewers.speedscope_import(path)
        return {p["name"]: {f["name"] for f in p["frames"]}
                for p in shown["profiles"]}

    def test_speedscope_in_speedscope(self):
        self.profile.dump_speedscope(self.path("s.json"))
        [(profile, frames)] = self.shown_in_speedscope(
            self.path("s.json")).items()
        self.assertEqual(profile, f"thread {threading.get_ident()}")
        self.assertLessEqual({"root", "middle", "leaf"}, frames)

    def test_folded_in_speedscope(self):
        self.profile.dump_folded(self.path("f.txt"))
        [frames] = self.shown_in_speedscope(self.path("f.txt")).values()
        self.assertLessEqual({f"{n} ({__file__}:{line})" for n, line in
                              self.lines.items()}, frames)


class TestBadInput(unittest.TestCase):

    def test_timer_not_callable(self):
        # 3.11 takes it and fails at the first event.
        profile = Profile(timer=1)
        with support.catch_unraisable_exception() as cm:
            profile.enable()
            len([])
            self.assertEqual(cm.unraisable.exc_type, TypeError)
        profile.disable()
        self.assertIsNone(sys.getprofile())

    def test_timer_raising_stops_the_profiler(self):
        calls = 0

        def timer():
            nonlocal calls
            calls += 1
            if calls > 5:
                raise ZeroDivisionError("timer")
            return calls

        def f():
            pass

        profile = Profile(timer=timer, timeunit=1.0)
        with support.catch_unraisable_exception() as cm:
            with profile:
                for _ in range(10):
                    f()
            self.assertEqual(cm.unraisable.exc_type, ZeroDivisionError)
        self.assertEqual(calls, 6)
        self.assertIsNone(M.get_tool(M.PROFILER_ID))
        # The program goes on, unprofiled; the profiler can start again.
        calls = -100
        with profile:
            f()
        self.assertGreaterEqual(by_name(profile.getstats())["f"].callcount, 1)

    def test_timer_garbage(self):
        profile = Profile(timer=lambda: "soon")
        with support.catch_unraisable_exception() as cm:
            with profile:
                len([])
            self.assertEqual(cm.unraisable.exc_type, TypeError)

    def test_timer_during_exception(self):
        # A timer runs while an exception propagates, which it must not
        # see or lose.
        seen = []

        def timer():
            seen.append(sys.exc_info()[0])
            return 0

        def fail():
            raise KeyError

        with Profile(timer=timer):
            with self.assertRaises(KeyError):
                fail()
        self.assertTrue(seen)

    def test_bad_arguments(self):
        with self.assertRaises(TypeError):
            Profile().getstats("main")
        with self.assertRaises(TypeError):
            Profile(1, 2, 3, 4, 5)
        with self.assertRaises(TypeError):
            Profile().enable(subcalls="yes")
        self.assertEqual(Profile().getstats(12345), [])
        self.assertEqual(Profile().calltree(), [])
        Profile().disable()

    def test_subclass(self):
        class Mine(Profile):
            def __init__(self):
                super().__init__(builtins=False)
                self.extra = 1

        with Mine() as profile:
            len([])
        self.assertEqual(by_name(profile.getstats()), {})
        self.assertEqual(profile.extra, 1)

    def test_reinit_while_enabled(self):
        profile = Profile()
        with profile:
            with self.assertRaises(RuntimeError):
                profile.__init__()

    def test_profiler_dropped_while_enabled(self):
        # Kept alive while enabled, as 3.11 kept it as the profile object.
        profile = Profile()
        profile.enable()
        del profile
        gc.collect()
        self.assertIsInstance(sys.getprofile(), Profile)
        sys.getprofile().disable()
        self.assertIsNone(sys.getprofile())


class TestSetprofile(unittest.TestCase):
    """sys.setprofile on sys.monitoring: 3.11's events, without putting the
    eval loop on its tracing path."""

    def test_code_specializes_under_a_profile_function(self):
        def loop():
            total = 0
            for i in range(1000):
                total += i
            return total

        sys.setprofile(lambda *args: None)
        try:
            for _ in range(3):
                loop()
        finally:
            sys.setprofile(None)
        opnames = {i.opname for i in dis.get_instructions(loop,
                                                          adaptive=True)}
        self.assertIn("BINARY_OP_ADD_INT", opnames)

    def test_events_in_order(self):
        events = []

        def profiler(frame, event, arg):
            events.append((event, frame.f_code.co_name,
                           getattr(arg, "__name__", None)))

        def gen():
            yield 1

        def f():
            len([])
            list(gen())

        sys.setprofile(profiler)
        f()
        sys.setprofile(None)
        self.assertEqual(events[:8], [
            ("call", "f", None),
            ("c_call", "f", "len"),
            ("c_return", "f", "len"),
            ("call", "gen", None),
            ("return", "gen", None),
            ("call", "gen", None),
            ("return", "gen", None),
            ("return", "f", None),
        ])

    def test_thread_without_profile_function(self):
        # Events are on for all threads while one has a profile function;
        # the others hear nothing.
        events = []
        done = threading.Event()

        def other():
            def g():
                pass
            g()
            done.set()

        sys.setprofile(lambda frame, event, arg: events.append(
            threading.get_ident()))
        try:
            t = threading.Thread(target=other)
            t.start()
            done.wait()
        finally:
            sys.setprofile(None)
        t.join()
        self.assertEqual(set(events), {threading.get_ident()})

    def test_all_events_show_the_profile_tool(self):
        # As in 3.12: tool 6 has the events while a profile function is set.
        sys.setprofile(lambda *args: None)
        try:
            events = M._all_events()
        finally:
            sys.setprofile(None)
        self.assertEqual(events["PY_START"], 1 << 6)
        self.assertEqual(events["CALL"], 1 << 6)
        self.assertEqual(M._all_events(), {})

    def test_profile_function_raising(self):
        # As 3.11: the profile function is removed, its exception raised
        # where the event was.
        def profiler(frame, event, arg):
            if event == "call" and frame.f_code.co_name == "target":
                raise KeyError("from profiler")

        def target():
            return 1

        sys.setprofile(profiler)
        try:
            with self.assertRaises(KeyError):
                target()
            self.assertIsNone(sys.getprofile())
        finally:
            sys.setprofile(None)

    def test_profiled_thread_exit_turns_events_off(self):
        def thread():
            sys.setprofile(lambda *args: None)

        t = threading.Thread(target=thread)
        t.start()
        t.join()
        self.assertEqual(M._all_events(), {})


if __name__ == "__main__":
    unittest.main()
