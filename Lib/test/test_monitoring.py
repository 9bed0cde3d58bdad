"""Tests for sys.monitoring (PEP 669) as Sightglass implements it."""

import asyncio
import contextlib
import dis
import gc
import io
import marshal
import sys
import textwrap
import threading
import time
import traceback
import tracemalloc
import types
import unittest
from test import support
from test.support import script_helper

M = sys.monitoring
E = M.events
TOOL = M.PROFILER_ID
OTHER = M.DEBUGGER_ID

EVENT_NAMES = [
    "PY_START", "PY_RESUME", "PY_RETURN", "PY_YIELD", "CALL", "LINE",
    "INSTRUCTION", "JUMP", "BRANCH", "STOP_ITERATION", "RAISE",
    "EXCEPTION_HANDLED", "PY_UNWIND", "PY_THROW", "RERAISE", "C_RETURN",
    "C_RAISE", "BRANCH_LEFT", "BRANCH_RIGHT", "MARKER",
]


def offset_of(code, opname, nth=0):
    """The offset of the nth instruction called opname in code."""
    offsets = [i.offset for i in dis.get_instructions(code)
               if i.opname == opname]
    return offsets[nth]


def describe(arg):
    if isinstance(arg, types.CodeType):
        return arg.co_name
    if isinstance(arg, BaseException):
        return (type(arg).__name__,) + arg.args
    if isinstance(arg, types.FunctionType):
        return arg.__name__
    if isinstance(arg, (types.BuiltinFunctionType, type)):
        return arg.__name__
    return arg


class MonitoringTestBase:

    def setUp(self):
        for tool in range(6):
            M.free_tool_id(tool)
        M.use_tool_id(TOOL, "test")
        self.events = []

    def tearDown(self):
        for tool in range(6):
            M.free_tool_id(tool)
        M.restart_events()

    def recorder(self, name, tool=TOOL, result=None):
        def callback(*args):
            self.events.append((name,) + tuple(map(describe, args)))
            return result
        return callback

    def record(self, names, tool=TOOL, local_code=None, result=None):
        events = 0
        for name in names:
            M.register_callback(tool, getattr(E, name),
                                self.recorder(name, tool, result))
            events |= getattr(E, name)
        if events & (E.C_RETURN | E.C_RAISE):
            # They come only with CALL, as in upstream.
            events |= E.CALL | E.C_RETURN | E.C_RAISE
        if local_code is None:
            M.set_events(tool, events)
        else:
            M.set_local_events(tool, local_code, events)

    def run_with_callback(self, event, callback, func, *args):
        """func(*args) while `callback` hears of `event` in all code."""
        M.register_callback(TOOL, event, callback)
        M.set_events(TOOL, event)
        try:
            return func(*args)
        finally:
            M.set_events(TOOL, 0)

    def run_recorded(self, func, names, *args):
        self.record(names)
        try:
            func(*args)
        finally:
            M.set_events(TOOL, 0)
        return self.events

    def events_in(self, *code_names):
        return [e for e in self.events if e[1] in code_names]


class TestAPI(MonitoringTestBase, unittest.TestCase):

    def test_module(self):
        self.assertEqual(M.__name__, "sys.monitoring")
        for name in ["use_tool_id", "free_tool_id", "clear_tool_id",
                     "get_tool", "get_events", "set_events",
                     "get_local_events", "set_local_events",
                     "register_callback", "restart_events"]:
            self.assertTrue(callable(getattr(M, name)), name)
        self.assertEqual((M.DEBUGGER_ID, M.COVERAGE_ID, M.PROFILER_ID,
                          M.OPTIMIZER_ID), (0, 1, 2, 5))
        self.assertEqual(repr(M.DISABLE), "<sys.monitoring.DISABLE>")
        self.assertEqual(repr(M.MISSING), "<sys.monitoring.MISSING>")
        self.assertIsNot(M.DISABLE, M.MISSING)

    def test_all_events(self):
        # 3.12's private helper: global events only, by name, as tool masks.
        self.assertEqual(M._all_events(), {})
        M.use_tool_id(OTHER, "other")
        M.set_events(TOOL, E.PY_START | E.CALL | E.C_RETURN | E.C_RAISE)
        M.set_events(OTHER, E.PY_START | E.LINE)
        M.set_local_events(OTHER, straight.__code__, E.BRANCH)
        self.assertEqual(M._all_events(), {
            "PY_START": 1 << TOOL | 1 << OTHER,
            "CALL": 1 << TOOL,
            "LINE": 1 << OTHER,
        })
        M.set_events(TOOL, 0)
        M.free_tool_id(OTHER)
        self.assertEqual(M._all_events(), {})

    def test_event_numbers(self):
        # 3.12's numbers for 3.12's events, the newer ones after them.
        for bit, name in enumerate(EVENT_NAMES):
            self.assertEqual(getattr(E, name), 1 << bit, name)
        self.assertEqual(E.NO_EVENTS, 0)

    def test_event_enum(self):
        self.assertTrue(issubclass(M.Event, __import__("enum").IntFlag))
        self.assertIs(M.Event, M.Event)
        for name in EVENT_NAMES:
            self.assertEqual(M.Event[name], getattr(E, name))
        self.assertEqual(M.Event.__module__, "sys.monitoring")
        with self.assertRaises(AttributeError):
            M.no_such_attribute

    def test_event_enum_is_lazy(self):
        code = ("import sys; sys.monitoring.events; "
                "print('enum' in sys.modules); sys.monitoring.Event; "
                "print('enum' in sys.modules)")
        res = script_helper.assert_python_ok("-I", "-S", "-c", code)
        self.assertEqual(res.out.split(), [b"False", b"True"])

    def test_tools(self):
        self.assertEqual(M.get_tool(TOOL), "test")
        self.assertIsNone(M.get_tool(OTHER))
        self.assertIsNone(M.use_tool_id(OTHER, "other"))
        self.assertEqual(M.get_tool(OTHER), "other")
        with self.assertRaisesRegex(ValueError, "tool 0 is already in use"):
            M.use_tool_id(OTHER, "again")
        self.assertIsNone(M.free_tool_id(OTHER))
        self.assertIsNone(M.get_tool(OTHER))
        M.free_tool_id(OTHER)   # freeing a free id is harmless

    def test_bad_tool_ids(self):
        for func, args in [(M.use_tool_id, ("x",)), (M.free_tool_id, ()),
                           (M.get_tool, ()), (M.get_events, ()),
                           (M.set_events, (0,)), (M.clear_tool_id, ()),
                           (M.register_callback, (E.CALL, None))]:
            for tool in (-1, 6, 7, 1000):
                with self.assertRaisesRegex(
                        ValueError,
                        rf"invalid tool {tool} \(must be between 0 and 5\)"):
                    func(tool, *args)
        with self.assertRaises(TypeError):
            M.use_tool_id("0", "x")
        # The type's name, not a literal %T: 3.11's PyErr_Format has none.
        with self.assertRaisesRegex(ValueError,
                                    "^tool name must be a str, not int$"):
            M.use_tool_id(OTHER, 123)

    def test_tool_not_in_use(self):
        msg = "tool 0 is not in use"
        with self.assertRaisesRegex(ValueError, msg):
            M.set_events(OTHER, E.PY_START)
        with self.assertRaisesRegex(ValueError, msg):
            M.set_local_events(OTHER, self.setUp.__code__, E.PY_START)
        with self.assertRaisesRegex(ValueError, msg):
            M.register_callback(OTHER, E.PY_START, print)
        with self.assertRaisesRegex(ValueError, msg):
            M.clear_tool_id(OTHER)
        # Queries answer for a free id, as upstream's do.
        self.assertEqual(M.get_events(OTHER), 0)
        self.assertEqual(M.get_local_events(OTHER, self.setUp.__code__), 0)

    def test_bad_event_sets(self):
        for bad in (-1, 1 << 20, 1 << 30):
            with self.assertRaisesRegex(ValueError, "invalid event set"):
                M.set_events(TOOL, bad)
        with self.assertRaises(TypeError):
            M.set_events(TOOL, "x")
        with self.assertRaises(OverflowError):
            M.set_events(TOOL, 1 << 70)
        code = self.setUp.__code__
        for name in ["RAISE", "EXCEPTION_HANDLED", "PY_UNWIND", "PY_THROW",
                     "RERAISE"]:
            with self.assertRaisesRegex(ValueError,
                                        "invalid local event set"):
                M.set_local_events(TOOL, code, getattr(E, name))
        self.assertEqual(M.get_local_events(TOOL, code), 0)
        for args in [("notcode", E.PY_START), (None, 0)]:
            with self.assertRaisesRegex(TypeError, "code must be a code"):
                M.set_local_events(TOOL, *args)
        with self.assertRaisesRegex(
                TypeError,
                "^code must be a code object, "
                "not builtin_function_or_method$"):
            M.get_local_events(TOOL, len)
        self.assertEqual(M.get_events(TOOL), 0)

    def test_c_events_come_with_call(self):
        msg = "cannot set C_RETURN or C_RAISE events independently"
        for bad in (E.C_RETURN, E.C_RAISE, E.CALL | E.C_RETURN,
                    E.PY_START | E.C_RAISE):
            with self.assertRaisesRegex(ValueError, msg):
                M.set_events(TOOL, bad)
        # As in upstream, CALL implies them and get_events shows CALL.
        M.set_events(TOOL, E.CALL | E.C_RETURN | E.C_RAISE)
        self.assertEqual(M.get_events(TOOL), E.CALL)
        M.set_events(TOOL, 0)

    def test_register_callback(self):
        def f(*args):
            pass
        self.assertIsNone(M.register_callback(TOOL, E.PY_START, f))
        self.assertIs(M.register_callback(TOOL, E.PY_START, print), f)
        self.assertIs(M.register_callback(TOOL, E.PY_START, None), print)
        self.assertIsNone(M.register_callback(TOOL, E.PY_START, None))
        one_at_a_time = "The callback can only be set for one event"
        for bad in (0, -1, E.PY_START | E.PY_RETURN):
            with self.assertRaisesRegex(ValueError, one_at_a_time):
                M.register_callback(TOOL, bad, f)
        with self.assertRaisesRegex(ValueError, "invalid event 1048576"):
            M.register_callback(TOOL, 1 << 20, f)
        with self.assertRaisesRegex(
                TypeError, "^callback must be callable or None, not int$"):
            M.register_callback(TOOL, E.PY_START, 42)

    def test_positional_only(self):
        with self.assertRaises(TypeError):
            M.use_tool_id(tool_id=OTHER, name="x")
        with self.assertRaises(TypeError):
            M.set_events(TOOL, event_set=0)
        with self.assertRaises(TypeError):
            M.restart_events(1)

    def test_set_and_get_events(self):
        M.set_events(TOOL, E.PY_START | E.RAISE)
        self.assertEqual(M.get_events(TOOL), E.PY_START | E.RAISE)
        M.set_events(TOOL, E.NO_EVENTS)
        self.assertEqual(M.get_events(TOOL), 0)
        code = self.setUp.__code__
        M.set_local_events(TOOL, code, E.PY_RETURN | E.STOP_ITERATION)
        self.assertEqual(M.get_local_events(TOOL, code),
                         E.PY_RETURN | E.STOP_ITERATION)
        M.set_local_events(TOOL, code, 0)
        self.assertEqual(M.get_local_events(TOOL, code), 0)

    def test_free_and_clear_drop_everything(self):
        def f():
            pass
        for drop in (M.free_tool_id, M.clear_tool_id):
            with self.subTest(drop=drop.__name__):
                M.free_tool_id(TOOL)
                M.use_tool_id(TOOL, "test")
                self.record(["PY_START"])
                self.record(["PY_RETURN"], local_code=f.__code__)
                drop(TOOL)
                self.assertEqual(M.get_events(TOOL), 0)
                self.assertEqual(M.get_local_events(TOOL, f.__code__), 0)
                f()
                self.assertEqual(self.events_in("f"), [])
                M.free_tool_id(TOOL)
                M.use_tool_id(TOOL, "next")
                self.assertEqual(M.get_events(TOOL), 0)
                self.assertEqual(M.get_local_events(TOOL, f.__code__), 0)
                self.assertIsNone(
                    M.register_callback(TOOL, E.PY_START, None))
                f()
                self.assertEqual(self.events_in("f"), [])
        self.assertEqual(M.get_tool(TOOL), "next")
        M.clear_tool_id(TOOL)
        self.assertEqual(M.get_tool(TOOL), "next")

    def test_audit(self):
        code = """if 1:
            import sys
            M = sys.monitoring
            def hook(event, args):
                if event.startswith("sys.monitoring"):
                    print(event, args)
            sys.addaudithook(hook)
            M.use_tool_id(3, "t")
            M.register_callback(3, M.events.PY_START, len)
            M.set_events(3, M.events.PY_UNWIND)
            M.set_local_events(3, hook.__code__, M.events.PY_RETURN)
            M.clear_tool_id(3)
            M.free_tool_id(3)
        """
        res = script_helper.assert_python_ok("-c", code)
        lines = res.out.decode().splitlines()
        self.assertRegex(lines.pop(3), r"^sys.monitoring.set_local_events "
                                       r"\(3, <code object hook .*>, 4\)$")
        self.assertEqual(lines, [
            "sys.monitoring.use_tool_id (3, 't')",
            "sys.monitoring.register_callback (<built-in function len>,)",
            "sys.monitoring.set_events (3, 4096)",
            "sys.monitoring.clear_tool_id (3,)",
            "sys.monitoring.free_tool_id (3,)",
        ])

    def test_audit_hook_can_refuse(self):
        code = """if 1:
            import sys
            def hook(event, args):
                if (event == "sys.monitoring.register_callback"
                        and args[0] is print):
                    raise PermissionError("no")
            sys.addaudithook(hook)
            sys.monitoring.use_tool_id(3, "t")
            try:
                sys.monitoring.register_callback(3, 1, print)
            except PermissionError:
                print("refused")
            # What was refused never got in.
            print(sys.monitoring.register_callback(3, 1, None))
        """
        res = script_helper.assert_python_ok("-c", code)
        self.assertEqual(res.out.split(), [b"refused", b"None"])


def plain(x):
    return x


class Callable:
    def __call__(self, x):
        return x

    def method(self, x):
        return x


class TestCallEvents(MonitoringTestBase, unittest.TestCase):

    def test_function(self):
        def caller():
            plain(1)
        self.run_recorded(caller, ["PY_START", "PY_RETURN", "CALL",
                                   "C_RETURN"])
        call = offset_of(caller.__code__, "CALL")
        self.assertEqual(self.events_in("caller", "plain"), [
            ("PY_START", "caller", 0),
            ("CALL", "caller", call, "plain", 1),
            ("PY_START", "plain", 0),
            ("PY_RETURN", "plain", offset_of(plain.__code__, "RETURN_VALUE"),
             1),
            ("PY_RETURN", "caller",
             offset_of(caller.__code__, "RETURN_VALUE"), None),
        ])

    def test_methods_builtins_classes(self):
        obj = Callable()

        def caller():
            obj.method(2)
            bound = obj.method
            bound(3)
            len([])
            Callable()
            obj(4)
            [].append(5)
        self.run_recorded(caller, ["CALL", "C_RETURN", "PY_START"])
        calls = [e[0:1] + e[3:] for e in self.events_in("caller")
                 if e[0] != "PY_START"]
        self.assertNotIn("C_RAISE", [e[0] for e in self.events])
        self.assertEqual(calls, [
            ("CALL", "method", obj),        # the function and self
            ("CALL", obj.method, 3),        # a bound method as called
            ("CALL", "len", []),
            ("C_RETURN", "len", []),
            ("CALL", "Callable", M.MISSING),
            ("C_RETURN", "Callable", M.MISSING),
            ("CALL", obj, 4),
            ("C_RETURN", obj, 4),
            ("CALL", list.append, [5]),
            ("C_RETURN", list.append, [5]),
        ])
        started = [e[1] for e in self.events_in("caller", "method",
                                                "__call__")
                   if e[0] == "PY_START"]
        self.assertEqual(started, ["caller", "method", "method", "__call__"])

    def test_call_offsets(self):
        def caller():
            len("a")
            plain(2)
        self.run_recorded(caller, ["CALL", "C_RETURN"])
        self.assertEqual([e[:3] for e in self.events_in("caller")], [
            ("CALL", "caller", offset_of(caller.__code__, "CALL", 0)),
            ("C_RETURN", "caller", offset_of(caller.__code__, "CALL", 0)),
            ("CALL", "caller", offset_of(caller.__code__, "CALL", 1)),
        ])

    def test_c_raise(self):
        def caller():
            try:
                int("x")
            except ValueError:
                pass
        self.run_recorded(caller, ["CALL", "C_RETURN", "C_RAISE", "RAISE"])
        call = offset_of(caller.__code__, "CALL")
        self.assertEqual(self.events_in("caller")[:3], [
            ("CALL", "caller", call, "int", "x"),
            ("C_RAISE", "caller", call, "int", "x"),
            ("RAISE", "caller", call,
             ("ValueError", "invalid literal for int() with base 10: 'x'")),
        ])

    def test_c_results_need_a_callback(self):
        # CALL alone: the results come to whoever has a callback for them.
        M.register_callback(TOOL, E.CALL, self.recorder("CALL"))
        M.register_callback(TOOL, E.C_RETURN, self.recorder("C_RETURN"))
        M.set_events(TOOL, E.CALL)

        def caller():
            len([])
        caller()
        M.set_events(TOOL, 0)
        self.assertEqual([e[0] for e in self.events_in("caller")],
                         ["CALL", "C_RETURN"])

    def test_builtin_with_keywords(self):
        # A built-in called with keywords at a watched site gets them.
        def caller():
            out = io.StringIO()
            print("a", "b", sep="-", end="!", file=out)
            return sorted([2, 3, 1], key=lambda x: -x, reverse=True), out
        result = []
        self.run_recorded(lambda: result.append(caller()),
                          ["CALL", "C_RETURN"])
        ordered, out = result[0]
        self.assertEqual(ordered, [1, 2, 3])
        self.assertEqual(out.getvalue(), "a-b!")
        self.assertEqual([e[0:1] + e[3:] for e in self.events_in("caller")
                          if e[3] in ("print", "sorted")], [
            ("CALL", "print", "a"), ("C_RETURN", "print", "a"),
            ("CALL", "sorted", [2, 3, 1]), ("C_RETURN", "sorted", [2, 3, 1]),
        ])

    def test_builtin_not_called_when_call_callback_raises(self):
        # CALL's callback raising stops the call; C_RETURN's comes after it.
        items = []
        def caller():
            items.append(1)
        def fail(*args):
            raise ZeroDivisionError("in callback")
        for name, made in (("CALL", []), ("C_RETURN", [1])):
            with self.subTest(event=name):
                items.clear()
                self.record(["CALL", "C_RETURN"], local_code=caller.__code__)
                M.register_callback(TOOL, getattr(E, name), fail)
                try:
                    with self.assertRaisesRegex(ZeroDivisionError,
                                                "in callback"):
                        caller()
                finally:
                    M.set_local_events(TOOL, caller.__code__, 0)
                self.assertEqual(items, made)

    def test_python_calls_bind_arguments(self):
        # At a watched site every Python call binds its parameters as it
        # would unwatched: exactly filled, defaulted, keyword-only, starred,
        # positional-only, captured by a closure.
        def exact(a, b):
            return a, b
        def defaults(a, b=2):
            return a, b
        def kwonly(a, *, k=3):
            return a, k
        def starred(a, *rest, **kw):
            return a, rest, kw
        def posonly(a, /, b):
            return a, b
        def captured(a):
            return (lambda: a)()
        def caller():
            return [exact(1, 2), defaults(1), defaults(1, 5), kwonly(1),
                    kwonly(1, k=4), starred(1), starred(1, 2, x=3),
                    posonly(1, b=2), posonly(1, 2), captured(7)]
        expected = caller()
        got = []
        self.run_recorded(lambda: got.append(caller()), ["CALL", "C_RETURN"])
        self.assertEqual(got, [expected])
        self.assertEqual(
            [e[3] for e in self.events_in("caller") if e[0] == "CALL"],
            ["exact", "defaults", "defaults", "kwonly", "kwonly", "starred",
             "starred", "posonly", "posonly", "captured"])
        with self.assertRaisesRegex(TypeError, "missing 1 required"):
            self.run_recorded(exact, ["CALL"], 1)

    def test_settrace_opcodes_at_watched_builtin_call(self):
        # A trace function sees every opcode of a watched built-in's call.
        def callee(x):
            return len(x)
        expected = opcode_trace(callee, "ab")
        got = []
        self.run_recorded(lambda: got.append(opcode_trace(callee, "ab")),
                          ["CALL", "C_RETURN"])
        self.assertIn(("opcode", offset_of(callee, "CALL")), expected)
        self.assertEqual(got, [expected])
        self.assertEqual([e[0] for e in self.events_in("callee")],
                         ["CALL", "C_RETURN"])

    def test_call_function_ex(self):
        def caller(args, kwargs):
            plain(*args)
            max(*args, 6, **kwargs)
            plain(**{"x": 7})
        self.run_recorded(caller, ["CALL", "C_RETURN"], (5,), {})
        self.assertEqual([e[0:1] + e[3:] for e in self.events_in("caller")], [
            ("CALL", "plain", 5),
            ("CALL", "max", 5),
            ("C_RETURN", "max", 5),
            ("CALL", "plain", M.MISSING),
        ])

    def test_kinds_of_code(self):
        source = textwrap.dedent("""\
            class K:
                x = 1
            f = lambda: 2
            f()
            [i for i in range(2)]
            """)
        code = compile(source, "<kinds>", "exec")
        self.run_recorded(exec, ["PY_START", "PY_RETURN"], code, {})
        self.assertEqual([e[:2] for e in self.events_in(
            "<module>", "K", "<lambda>", "<listcomp>")], [
            ("PY_START", "<module>"),
            ("PY_START", "K"), ("PY_RETURN", "K"),
            ("PY_START", "<lambda>"), ("PY_RETURN", "<lambda>"),
            ("PY_START", "<listcomp>"), ("PY_RETURN", "<listcomp>"),
            ("PY_RETURN", "<module>"),
        ])

    def test_events_start_in_running_code(self):
        # The code of executing frames is instrumented at once.
        def install():
            self.record(["PY_RETURN"])
            return "back"
        install()
        M.set_events(TOOL, 0)
        self.assertEqual(self.events_in("install"),
                         [("PY_RETURN", "install",
                           offset_of(install.__code__, "RETURN_VALUE"),
                           "back")])

    def test_events_stop_in_running_code(self):
        def uninstall():
            M.set_events(TOOL, 0)
            return 1
        self.record(["PY_RETURN"])
        uninstall()
        self.assertEqual(self.events_in("uninstall"), [])


class TestGenerators(MonitoringTestBase, unittest.TestCase):

    names = ["PY_START", "PY_RESUME", "PY_YIELD", "PY_RETURN", "PY_THROW",
             "PY_UNWIND", "STOP_ITERATION", "RAISE", "RERAISE",
             "EXCEPTION_HANDLED"]

    def test_for_loop(self):
        def gen():
            yield 1
            yield 2
            return "done"

        def consumer():
            for x in gen():
                pass
        self.run_recorded(consumer, self.names)
        g = gen.__code__
        self.assertEqual(self.events_in("gen", "consumer"), [
            ("PY_START", "consumer", offset_of(consumer.__code__, "RESUME")),
            ("PY_START", "gen", offset_of(g, "RESUME", 0)),
            ("PY_YIELD", "gen", offset_of(g, "YIELD_VALUE", 0), 1),
            ("PY_RESUME", "gen", offset_of(g, "RESUME", 1)),
            ("PY_YIELD", "gen", offset_of(g, "YIELD_VALUE", 1), 2),
            ("PY_RESUME", "gen", offset_of(g, "RESUME", 2)),
            ("PY_RETURN", "gen", offset_of(g, "RETURN_VALUE"), "done"),
            ("STOP_ITERATION", "consumer",
             offset_of(consumer.__code__, "FOR_ITER"),
             ("StopIteration", "done")),
            ("PY_RETURN", "consumer",
             offset_of(consumer.__code__, "RETURN_VALUE"), None),
        ])

    def test_stop_iteration_without_value(self):
        def gen():
            yield 1

        def consumer():
            for x in gen():
                pass
        self.run_recorded(consumer, ["STOP_ITERATION"])
        self.assertEqual(self.events, [
            ("STOP_ITERATION", "consumer",
             offset_of(consumer.__code__, "FOR_ITER"), ("StopIteration",))])

    def test_yield_from(self):
        def sub():
            yield "a"
            return "subret"

        def outer():
            result = yield from sub()
            yield result
        self.run_recorded(lambda: list(outer()), self.names)
        self.assertIn(("STOP_ITERATION", "outer",
                       offset_of(outer.__code__, "SEND"),
                       ("StopIteration", "subret")), self.events)
        yields = [e for e in self.events if e[0] == "PY_YIELD"]
        self.assertEqual([e[1] + ":" + str(e[3]) for e in yields],
                         ["sub:a", "outer:a", "outer:subret"])

    def test_throw_and_close(self):
        def gen():
            try:
                yield 1
            except ValueError:
                yield "caught"

        def driver():
            g = gen()
            next(g)
            g.throw(ValueError)
            g.close()
        self.run_recorded(driver, self.names)
        events = [e[:2] for e in self.events_in("gen")]
        self.assertEqual(events, [
            ("PY_START", "gen"), ("PY_YIELD", "gen"),
            ("PY_THROW", "gen"), ("RAISE", "gen"),
            ("EXCEPTION_HANDLED", "gen"), ("PY_YIELD", "gen"),
            # close(): GeneratorExit through the except's cleanup
            ("PY_THROW", "gen"), ("RAISE", "gen"),
            ("EXCEPTION_HANDLED", "gen"), ("RERAISE", "gen"),
            ("PY_UNWIND", "gen"),
        ])
        throw = [e for e in self.events if e[0] == "PY_THROW"][0]
        self.assertEqual(throw[3], ("ValueError",))

    def test_changes_reach_suspended_generators(self):
        def gen():
            yield 1
            yield 2

        g = gen()
        next(g)
        self.record(["PY_RESUME", "PY_YIELD"])
        next(g)
        M.set_events(TOOL, 0)
        self.assertEqual([e[0] for e in self.events_in("gen")],
                         ["PY_RESUME", "PY_YIELD"])

    def test_changes_reach_generators_resumed_by_throw(self):
        def gen():
            try:
                yield 1
            except KeyError:
                return "handled"

        g = gen()
        next(g)
        self.record(["PY_RETURN"])
        with self.assertRaises(StopIteration):
            g.throw(KeyError)
        M.set_events(TOOL, 0)
        self.assertEqual([(e[0], e[3]) for e in self.events_in("gen")],
                         [("PY_RETURN", "handled")])

    def test_coroutines(self):
        class Suspend:
            def __await__(self):
                yield "suspend"
                return "resumed"

        async def inner():
            return 5

        async def coro():
            x = await inner()
            y = await Suspend()
            return x, y

        def driver():
            c = coro()
            self.assertEqual(c.send(None), "suspend")
            with self.assertRaises(StopIteration):
                c.send(None)
        self.run_recorded(driver, self.names)
        names = [(e[0], e[1]) for e in self.events_in("coro", "inner")]
        self.assertEqual(names, [
            ("PY_START", "coro"), ("PY_START", "inner"),
            ("PY_RETURN", "inner"), ("STOP_ITERATION", "coro"),
            ("PY_YIELD", "coro"), ("PY_RESUME", "coro"),
            ("STOP_ITERATION", "coro"), ("PY_RETURN", "coro"),
        ])

    def test_async_generators_under_asyncio(self):
        async def agen():
            yield 1
            yield 2

        async def main():
            return [x async for x in agen()]

        self.record(["PY_START", "PY_YIELD", "PY_RESUME", "PY_RETURN"])
        try:
            self.assertEqual(asyncio.run(main()), [1, 2])
        finally:
            M.set_events(TOOL, 0)
            asyncio.set_event_loop_policy(None)
        self.assertEqual([e[0] for e in self.events_in("agen")], [
            "PY_START", "PY_YIELD", "PY_RESUME", "PY_YIELD", "PY_RESUME",
            "PY_RETURN"])


class TestExceptionEvents(MonitoringTestBase, unittest.TestCase):

    names = ["RAISE", "RERAISE", "EXCEPTION_HANDLED", "PY_UNWIND",
             "PY_RETURN"]

    def events_of_failing(self, func):
        """The events func's own frame raises on its way out with a
        KeyError."""
        self.run_recorded(lambda: self.assertRaises(KeyError, func),
                          self.names)
        return [e[0] for e in self.events_in(func.__name__)]

    def test_caught_in_caller(self):
        def raiser():
            raise ValueError("v")

        def caller():
            try:
                raiser()
            except ValueError:
                pass
        self.run_recorded(caller, self.names)
        v = ("ValueError", "v")
        self.assertEqual(self.events_in("raiser", "caller"), [
            ("RAISE", "raiser", offset_of(raiser.__code__, "RAISE_VARARGS"),
             v),
            ("PY_UNWIND", "raiser",
             offset_of(raiser.__code__, "RAISE_VARARGS"), v),
            # As in 3.12: where the call resumes, its last cache entry.
            ("RAISE", "caller", offset_of(caller.__code__, "CALL")
             + 2 * dis._inline_cache_entries[dis.opmap["CALL"]], v),
            ("EXCEPTION_HANDLED", "caller",
             offset_of(caller.__code__, "PUSH_EXC_INFO"), v),
            ("PY_RETURN", "caller",
             offset_of(caller.__code__, "RETURN_VALUE", -1), None),
        ])

    def test_bare_raise_is_reraise(self):
        def reraiser():
            try:
                raise KeyError("k")
            except KeyError:
                raise

        self.assertEqual(self.events_of_failing(reraiser), [
            "RAISE", "EXCEPTION_HANDLED", "RERAISE", "EXCEPTION_HANDLED",
            "RERAISE", "PY_UNWIND"])

    def test_finally(self):
        def fin():
            try:
                raise KeyError
            finally:
                pass
        self.assertEqual(self.events_of_failing(fin), [
            "RAISE", "EXCEPTION_HANDLED", "RERAISE", "EXCEPTION_HANDLED",
            "RERAISE", "PY_UNWIND"])

    def test_with_statement(self):
        class Manager:
            def __enter__(self):
                return self

            def __exit__(self, *exc):
                return False

        def withf():
            with Manager():
                raise KeyError("k")
        self.assertEqual(self.events_of_failing(withf), [
            "RAISE", "EXCEPTION_HANDLED", "RERAISE", "EXCEPTION_HANDLED",
            "RERAISE", "PY_UNWIND"])

    def test_traceback_as_without_monitoring(self):
        # An exception that C raises as a class and a value, and whose
        # class cannot be instantiated: monitoring must not change what
        # the handler sees.
        import _testcapi

        class BadException(Exception):
            def __init__(self_):
                raise RuntimeError("can't instantiate BadException")

        def caller():
            try:
                _testcapi.raise_exception(BadException, 0)
            except RuntimeError:
                tb = sys.exc_info()[2]
                return tb.tb_frame.f_code.co_name, \
                    tb.tb_frame.f_back.f_code.co_name
        expected = caller()
        self.assertEqual(expected, ("__init__", "caller"))
        self.record(["CALL", "C_RAISE", "RAISE", "EXCEPTION_HANDLED"])
        self.assertEqual(caller(), expected)
        M.set_events(TOOL, 0)
        self.assertIn("C_RAISE", [e[0] for e in self.events_in("caller")])

    def test_exceptions_cross_c_frames(self):
        def key(x):
            raise KeyError(x)

        def caller():
            try:
                sorted([2, 1], key=key)
            except KeyError:
                pass
        self.run_recorded(caller, self.names + ["C_RAISE", "CALL"])
        self.assertEqual([e[:2] for e in self.events_in("key", "caller")
                          if e[0] != "CALL"], [
            ("RAISE", "key"), ("PY_UNWIND", "key"),
            ("C_RAISE", "caller"), ("RAISE", "caller"),
            ("EXCEPTION_HANDLED", "caller"), ("PY_RETURN", "caller"),
        ])


class TestLocalEvents(MonitoringTestBase, unittest.TestCase):

    def test_local_only(self):
        def watched():
            return 1

        def unwatched():
            return 2
        self.record(["PY_START", "PY_RETURN"], local_code=watched.__code__)
        watched()
        unwatched()
        self.assertEqual([e[:2] for e in self.events], [
            ("PY_START", "watched"), ("PY_RETURN", "watched")])

    def test_local_adds_to_global(self):
        def f():
            return 1
        self.record(["PY_START"])
        self.record(["PY_START", "PY_RETURN"], local_code=f.__code__)
        f()
        M.set_events(TOOL, 0)
        # Local and global PY_START: told once.
        self.assertEqual([e[:2] for e in self.events_in("f")], [
            ("PY_START", "f"), ("PY_RETURN", "f")])
        self.events.clear()
        f()
        self.assertEqual([e[:2] for e in self.events_in("f")], [
            ("PY_START", "f"), ("PY_RETURN", "f")])
        M.set_local_events(TOOL, f.__code__, 0)
        self.events.clear()
        f()
        self.assertEqual(self.events, [])

    def test_local_calls_and_stop_iteration(self):
        def gen():
            yield 1

        def f():
            for x in gen():
                len("x")
        self.record(["CALL", "C_RETURN", "STOP_ITERATION"],
                    local_code=f.__code__)
        f()
        self.assertEqual([e[0] for e in self.events],
                         ["CALL", "CALL", "C_RETURN", "STOP_ITERATION"])


class TestDisable(MonitoringTestBase, unittest.TestCase):

    def test_disable_one_location(self):
        def f():
            return 1

        def g():
            return 2
        self.record(["PY_START"], result=M.DISABLE)
        for i in range(3):
            f()
            g()
        self.assertEqual([e[1] for e in self.events_in("f", "g")],
                         ["f", "g"])
        # Other tools are not affected.
        M.use_tool_id(OTHER, "other")
        M.register_callback(OTHER, E.PY_START, self.recorder("OTHER"))
        M.set_events(OTHER, E.PY_START)
        f()
        M.set_events(OTHER, 0)
        self.assertEqual(self.events_in("f")[-1][0], "OTHER")

    def test_disable_lasts_until_restart(self):
        def f():
            return 1
        self.record(["PY_START"], result=M.DISABLE)
        f()
        f()
        # Turning the event off and on again does not re-enable it ...
        M.set_events(TOOL, 0)
        M.set_events(TOOL, E.PY_START)
        f()
        self.assertEqual(len(self.events_in("f")), 1)
        # ... restart_events does.
        M.restart_events()
        f()
        self.assertEqual(len(self.events_in("f")), 2)

    def test_disable_call_disables_results(self):
        def caller():
            len([])
        self.record(["CALL", "C_RETURN"], result=M.DISABLE)
        caller()
        caller()
        self.assertEqual([e[0] for e in self.events_in("caller")], ["CALL"])

    def test_disable_return_and_yield(self):
        def gen():
            yield 1
            yield 2
        self.record(["PY_YIELD", "PY_RETURN"], result=M.DISABLE)
        list(gen())
        list(gen())
        self.assertEqual([e[0] for e in self.events_in("gen")],
                         ["PY_YIELD", "PY_YIELD", "PY_RETURN"])

    def test_disable_stop_iteration(self):
        def gen():
            yield 1

        def f():
            for x in gen():
                pass
        self.record(["STOP_ITERATION"], result=M.DISABLE)
        f()
        f()
        self.assertEqual(len(self.events_in("f")), 1)

    def test_cannot_disable_global_only_events(self):
        def f():
            try:
                len("")
                raise KeyError
            except KeyError:
                raise

        def disable_in_f(code, *args):
            return M.DISABLE if code is f.__code__ else None

        for name in ["RAISE", "EXCEPTION_HANDLED", "PY_UNWIND", "RERAISE",
                     "C_RETURN"]:
            with self.subTest(name=name):
                M.register_callback(TOOL, getattr(E, name), disable_in_f)
                M.set_events(TOOL, getattr(E, name) | E.CALL | E.C_RAISE
                             | E.C_RETURN)
                msg = f"Cannot disable {name} events. Callback removed."
                with self.assertRaisesRegex(ValueError, msg):
                    f()
                M.set_events(TOOL, 0)
                # The callback is gone.
                self.assertIsNone(
                    M.register_callback(TOOL, getattr(E, name), None))


class TestTools(MonitoringTestBase, unittest.TestCase):

    def test_descending_order(self):
        def f():
            pass
        for tool in (5, 3, 0):
            if tool != TOOL:
                M.use_tool_id(tool, str(tool))
        for tool in (TOOL, 5, 3, 0):
            M.register_callback(tool, E.PY_START, self.recorder(tool))
            M.set_events(tool, E.PY_START)
        f()
        for tool in (TOOL, 5, 3, 0):
            M.set_events(tool, 0)
        # 3.12's order, not the PEP's.
        self.assertEqual([e[0] for e in self.events_in("f")], [5, 3, 2, 0])

    def test_callbacks_silence_every_tool(self):
        # 3.12's rule: what a callback runs is seen by no tool, neither its
        # own nor any other, whichever order they are called in.
        def helper():
            pass

        def f():
            pass
        for other in (OTHER, 4):
            with self.subTest(other=other):
                self.events = []
                M.use_tool_id(other, "other")

                def calls_helper(code, offset):
                    self.events.append(("OTHER", code.co_name))
                    if code.co_name == "f":
                        helper()
                M.register_callback(other, E.PY_START, calls_helper)
                M.set_events(other, E.PY_START)
                self.record(["PY_START", "PY_RETURN", "LINE", "CALL"])
                f()
                M.set_events(other, 0)
                M.set_events(TOOL, 0)
                M.free_tool_id(other)
                self.assertEqual(self.events_in("helper"), [])
                self.assertIn(("OTHER", "f"), self.events)
                self.assertIn(("PY_START", "f", 0), self.events)

    def test_callbacks_unseen_by_settrace_and_setprofile(self):
        def helper():
            return len("x")

        def f():
            pass
        seen = []

        def tracer(frame, event, arg):
            seen.append(("trace", frame.f_code.co_name, event))
            return tracer

        def profiler(frame, event, arg):
            seen.append(("profile", frame.f_code.co_name, event))
        self.run_with_callback(E.PY_START, lambda code, offset: helper(),
                               self.traced_by, tracer, profiler, f)
        names = {name for kind, name, event in seen}
        self.assertIn("f", names)
        self.assertNotIn("helper", names)
        self.assertNotIn("<lambda>", names)

    @staticmethod
    def traced_by(tracer, profiler, func):
        sys.settrace(tracer)
        sys.setprofile(profiler)
        try:
            func()
        finally:
            sys.setprofile(None)
            sys.settrace(None)

    def test_trace_functions_unseen_by_tools(self):
        # A debugger built on settrace runs its REPL in its trace function:
        # a coverage tool or profiler must not record it.
        def in_hook():
            pass

        def f():
            pass

        def tracer(frame, event, arg):
            if frame.f_code is f.__code__:
                in_hook()
            return tracer

        def profiler(frame, event, arg):
            if frame.f_code is f.__code__:
                in_hook()
        self.record(["PY_START", "LINE", "CALL", "PY_RETURN"])
        for hooks in ((tracer, None), (None, profiler)):
            with self.subTest(hooks=hooks):
                self.traced_by(*hooks, f)
        M.set_events(TOOL, 0)
        self.assertEqual(self.events_in("in_hook"), [])
        self.assertEqual(len([e for e in self.events_in("f")
                              if e[0] == "PY_START"]), 2)

    def test_call_tracing_lifts_the_silence(self):
        # As for trace functions: sys.call_tracing() is how a debugger
        # debugs code from inside its own hook.
        def helper():
            pass

        def f():
            pass

        def start(code, offset):
            self.events.append(("START", code.co_name))
            if code is f.__code__:
                sys.call_tracing(helper, ())
        self.run_with_callback(E.PY_START, start, f)
        self.assertEqual(self.events, [("START", "f"), ("START", "helper")])

    def test_silence_is_per_thread(self):
        # While one thread's callback runs, other threads' code is heard.
        def f():
            pass

        def g():
            pass
        in_callback = threading.Event()
        heard_g = threading.Event()

        def start(code, offset):
            self.events.append(code.co_name)
            if code is f.__code__:
                in_callback.set()
                heard_g.wait(support.SHORT_TIMEOUT)
            elif code is g.__code__:
                heard_g.set()

        def other_thread():
            in_callback.wait(support.SHORT_TIMEOUT)
            g()
        t = threading.Thread(target=other_thread)
        M.register_callback(TOOL, E.PY_START, start)
        M.set_local_events(TOOL, f.__code__, E.PY_START)
        M.set_local_events(TOOL, g.__code__, E.PY_START)
        t.start()
        try:
            f()
        finally:
            t.join()
            M.set_local_events(TOOL, f.__code__, 0)
            M.set_local_events(TOOL, g.__code__, 0)
        self.assertTrue(heard_g.is_set())
        self.assertEqual(sorted(self.events), ["f", "g"])

    def test_callback_raising(self):
        def f():
            return len("x")

        def fail(*args):
            raise ZeroDivisionError("in callback")

        for name in ["PY_START", "PY_RETURN", "CALL"]:
            with self.subTest(name=name):
                M.register_callback(TOOL, getattr(E, name), fail)
                M.set_local_events(TOOL, f.__code__, getattr(E, name))
                try:
                    with self.assertRaisesRegex(ZeroDivisionError,
                                                "in callback"):
                        f()
                finally:
                    M.set_local_events(TOOL, f.__code__, 0)
                    M.register_callback(TOOL, getattr(E, name), None)

    def test_raise_callback_exception_replaces(self):
        def f():
            try:
                raise KeyError
            except KeyError:
                return "handled"

        def fail(code, offset, exc):
            if isinstance(exc, KeyError):
                raise ZeroDivisionError
        M.register_callback(TOOL, E.RAISE, fail)
        M.set_events(TOOL, E.RAISE)
        try:
            with self.assertRaises(ZeroDivisionError):
                f()
        finally:
            M.set_events(TOOL, 0)

    def test_handled_callback_exception_is_handled_in_its_place(self):
        calls = []

        def f():
            try:
                raise KeyError
            except KeyError:
                return "key"
            except ZeroDivisionError:
                return "zero"

        def fail(code, offset, exc):
            calls.append(type(exc))
            raise ZeroDivisionError
        M.register_callback(TOOL, E.EXCEPTION_HANDLED, fail)
        M.set_events(TOOL, E.EXCEPTION_HANDLED)
        try:
            # Upstream loops forever here; the handler gets the new one.
            self.assertEqual(f(), "zero")
        finally:
            M.set_events(TOOL, 0)
        self.assertEqual(calls, [KeyError])

    def test_changes_from_callbacks(self):
        def f():
            return 1

        def reregister(code, offset):
            self.events.append(("START", code.co_name))
            M.register_callback(TOOL, E.PY_START, None)
            M.set_events(TOOL, E.PY_RETURN)
            M.restart_events()

        def free(code, offset, retval):
            self.events.append(("RETURN", code.co_name))
            M.free_tool_id(TOOL)
        M.register_callback(TOOL, E.PY_START, reregister)
        M.register_callback(TOOL, E.PY_RETURN, free)
        M.set_events(TOOL, E.PY_START)
        self.assertEqual(f(), 1)
        self.assertEqual(f(), 1)
        self.assertEqual(self.events, [("START", "f"), ("RETURN", "f")])
        self.assertIsNone(M.get_tool(TOOL))
        M.use_tool_id(TOOL, "test")

    def test_two_tools_free_each_other(self):
        # TOOL is called first (descending ids) and frees OTHER, which is
        # then not called.
        def f():
            return 1
        M.use_tool_id(OTHER, "other")
        self.record(["PY_START"], tool=OTHER, local_code=f.__code__)
        M.register_callback(TOOL, E.PY_START,
                            lambda *args: M.free_tool_id(OTHER))
        M.set_local_events(TOOL, f.__code__, E.PY_START)
        f()
        M.set_local_events(TOOL, f.__code__, 0)
        self.assertEqual(self.events, [])
        self.assertIsNone(M.get_tool(OTHER))

    def test_threads(self):
        def work(n):
            for i in range(n):
                plain(i)
        counts = {}
        lock = threading.Lock()

        def count(code, offset):
            with lock:
                key = threading.current_thread().name
                counts[key] = counts.get(key, 0) + (code is plain.__code__)
        M.register_callback(TOOL, E.PY_START, count)
        M.set_local_events(TOOL, plain.__code__, E.PY_START)
        threads = [threading.Thread(target=work, args=(1000,))
                   for i in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        M.set_local_events(TOOL, plain.__code__, 0)
        self.assertEqual(sorted(counts.values()), [1000] * 4)

    def test_changes_while_other_threads_run(self):
        stop = threading.Event()
        errors = []

        def gen():
            yield 1

        def work():
            try:
                while not stop.is_set():
                    plain(1)
                    list(gen())
                    len("x")
                    try:
                        raise KeyError
                    except KeyError:
                        pass
            except BaseException as exc:
                errors.append(exc)

        def maybe_disable(code, offset, *args):
            return M.DISABLE if offset % 4 == 0 else None

        calls = []
        names = ["PY_START", "PY_RESUME", "PY_RETURN", "PY_YIELD", "CALL",
                 "STOP_ITERATION"]

        def register():
            for name in names:
                M.register_callback(TOOL, getattr(E, name), maybe_disable)
            M.register_callback(TOOL, E.RAISE, lambda *args: calls.append(1))
        register()
        threads = [threading.Thread(target=work) for i in range(2)]
        for t in threads:
            t.start()
        try:
            for i in range(200):
                events = 0
                for bit, name in enumerate(names + ["RAISE"]):
                    if (i >> bit) & 1:
                        events |= getattr(E, name)
                M.set_events(TOOL, events)
                M.set_local_events(TOOL, plain.__code__,
                                   E.PY_START if i % 3 else 0)
                if i % 7 == 0:
                    M.restart_events()
                if i % 50 == 49:
                    M.clear_tool_id(TOOL)
                    register()
                time.sleep(0.0005)    # let the workers run in between
        finally:
            stop.set()
            for t in threads:
                t.join()
            M.set_events(TOOL, 0)
        self.assertEqual(errors, [])
        self.assertTrue(calls)

    def test_settrace_and_setprofile_alongside(self):
        def f():
            return len("ab")
        traced = []

        def tracer(frame, event, arg):
            if frame.f_code is f.__code__:
                traced.append(("trace", event))
            return tracer

        def profiler(frame, event, arg):
            if frame.f_code is f.__code__:
                traced.append(("profile", event))
            elif frame.f_code.co_name == "callback":
                traced.append(("profile saw a callback", event))
        self.record(["PY_START", "PY_RETURN", "CALL", "C_RETURN"])
        sys.settrace(tracer)
        sys.setprofile(profiler)
        try:
            f()
        finally:
            sys.setprofile(None)
            sys.settrace(None)
            M.set_events(TOOL, 0)
        self.assertEqual([e[0] for e in self.events_in("f")],
                         ["PY_START", "CALL", "C_RETURN", "PY_RETURN"])
        # Exactly what stock 3.11.2 reports.
        self.assertEqual(traced, [
            ("trace", "call"), ("profile", "call"), ("trace", "line"),
            ("profile", "c_call"), ("profile", "c_return"),
            ("trace", "return"), ("profile", "return")])


class TestBalance(MonitoringTestBase, unittest.TestCase):
    """What a profiler relies on: every start has its end."""

    def test_starts_and_ends_pair(self):
        stack = []
        errors = []

        def push(kind):
            def callback(code, offset, *args):
                stack.append((kind, code))
            return callback

        def pop(kind):
            def callback(code, offset, *args):
                if not stack:
                    errors.append(("empty", kind, code))
                    return
                started, started_code = stack.pop()
                if started != kind or (kind == "py"
                                       and started_code is not code):
                    errors.append((started, kind, code))
            return callback

        def c_call(code, offset, callable, arg0):
            if not isinstance(callable, types.FunctionType):
                stack.append(("c", code))

        for name in ("PY_START", "PY_RESUME", "PY_THROW"):
            M.register_callback(TOOL, getattr(E, name), push("py"))
        for name in ("PY_RETURN", "PY_YIELD", "PY_UNWIND"):
            M.register_callback(TOOL, getattr(E, name), pop("py"))
        for name in ("C_RETURN", "C_RAISE"):
            M.register_callback(TOOL, getattr(E, name), pop("c"))
        M.register_callback(TOOL, E.CALL, c_call)

        def gen():
            try:
                yield 1
                yield 2
            finally:
                pass

        async def coro():
            return sorted([3, 1, 2], key=lambda x: -x)

        def program():
            list(gen())
            g = gen()
            next(g)
            g.close()
            try:
                coro().send(None)
            except StopIteration:
                pass
            try:
                sorted([1, 2], key=lambda x: 1 / 0)
            except ZeroDivisionError:
                pass
            [len(str(i)) for i in range(3)]
            return max(*[1, 2], key=lambda x: x)

        M.set_events(TOOL, E.PY_START | E.PY_RESUME | E.PY_THROW
                     | E.PY_RETURN | E.PY_YIELD | E.PY_UNWIND | E.CALL
                     | E.C_RETURN | E.C_RAISE)
        program()
        M.set_events(TOOL, 0)
        # What is left: this test's own frame and the call of set_events.
        self.assertEqual(errors, [])
        self.assertEqual([kind for kind, code in stack], ["c"])


class TestInterpreters(MonitoringTestBase, unittest.TestCase):

    def test_frozen_code(self):
        # importlib._bootstrap is always deep-frozen: static code objects.
        from importlib import _bootstrap
        self.record(["PY_START"])
        _bootstrap._resolve_name("a", "b.c", 1)
        M.set_events(TOOL, 0)
        self.assertIn(("PY_START", "_resolve_name", 0), self.events)

    def test_subinterpreter_has_its_own_state(self):
        import _testcapi
        code = textwrap.dedent("""\
            import sys
            M = sys.monitoring
            assert M.get_tool(%d) is None
            M.use_tool_id(%d, "sub")
            seen = []
            M.register_callback(%d, M.events.PY_START,
                                lambda *args: seen.append(args[0].co_name))
            M.set_events(%d, M.events.PY_START)
            def f():
                pass
            f()
            assert seen == ["f"], seen
            """) % ((TOOL,) * 4)
        self.record(["PY_START"])
        self.assertEqual(_testcapi.run_in_subinterp(code), 0)
        M.set_events(TOOL, 0)
        self.assertEqual(M.get_tool(TOOL), "test")
        self.assertNotIn("f", [e[1] for e in self.events])


def lines_of(code, events, event="LINE"):
    """The lines of `code` in recorded LINE events, relative to its def."""
    return [e[2] - code.co_firstlineno for e in events
            if e[0] == event and e[1] == code.co_name]


def settrace_events(func, *args, opcodes=False):
    """What a trace function sees of func's frames while func(*args) runs:
    (event, f_lasti, line relative to its def) for each event."""
    code = func.__code__
    seen = []

    def tracer(frame, event, arg):
        if frame.f_code is code:
            frame.f_trace_opcodes = opcodes
            seen.append((event, frame.f_lasti,
                         frame.f_lineno - code.co_firstlineno))
        return tracer
    sys.settrace(tracer)
    try:
        func(*args)
    finally:
        sys.settrace(None)
    return seen


def settrace_lines(func, *args):
    """The lines sys.settrace sees func run, relative to its def."""
    return [line for event, _, line in settrace_events(func, *args)
            if event == "line"]


def opcode_trace(func, *args):
    """The events, with f_lasti, of a trace function that traces the
    opcodes of func while func(*args) runs."""
    return [event[:2] for event in settrace_events(func, *args, opcodes=True)]


def loop(n):
    t = 0
    for i in range(n):
        if i % 2:
            t += i
        else:
            t -= 1
    return t or None


def handler(x):
    try:
        1 / x
    except ZeroDivisionError:
        x = 1
    return x


def chain(a, b):
    x = a
    y = b
    if a < b:
        x = b
    s = ""
    for i in range(3):
        s += "x"
    return x + y + len(s)


def warm(func, *args):
    """Call func often enough that its code is quickened and specialized."""
    for _ in range(100):
        func(*args)


class TestLineEvents(MonitoringTestBase, unittest.TestCase):

    def test_lines_as_settrace_sees_them(self):
        for func, args in [(loop, (4,)), (handler, (0,)), (handler, (2,)),
                           (chain, (1, 2)), (chain, (2, 1))]:
            with self.subTest(func=func.__name__, args=args):
                self.events = []
                self.run_recorded(func, ["LINE"], *args)
                self.assertEqual(lines_of(func.__code__, self.events),
                                 settrace_lines(func, *args))
                M.restart_events()

    def test_line_argument_and_frame(self):
        seen = []

        def line(code, line_number):
            frame = sys._getframe(1)
            if code is loop.__code__:
                seen.append((line_number, frame.f_lineno, frame.f_code))
        M.register_callback(TOOL, E.LINE, line)
        M.set_events(TOOL, E.LINE)
        loop(2)
        M.set_events(TOOL, 0)
        self.assertTrue(seen)
        for line_number, f_lineno, code in seen:
            self.assertEqual(line_number, f_lineno)
            self.assertIs(code, loop.__code__)

    def test_quickened_code(self):
        # Superinstructions (STORE_FAST__LOAD_FAST across lines 1 and 2),
        # COMPARE_OP_INT_JUMP and BINARY_OP_INPLACE_ADD_UNICODE would skip
        # an instrumented instruction after them.
        warm(chain, 1, 2)
        expected = settrace_lines(chain, 1, 2)
        self.run_recorded(chain, ["LINE"], 1, 2)
        self.assertEqual(lines_of(chain.__code__, self.events), expected)
        self.assertEqual(chain(1, 2), 7)

    def test_disable_and_restart(self):
        expected = loop(4)
        self.record(["LINE"], result=M.DISABLE)
        loop(4)
        loop(4)
        once = lines_of(loop.__code__, self.events)
        # Once per instruction that starts a line: line 2 starts at the
        # call of range() and again at FOR_ITER, where the loop jumps.
        self.assertEqual(set(once), set(settrace_lines(loop, 4)))
        self.assertEqual(once.count(2), 2)
        self.events.clear()
        loop(4)
        self.assertEqual(lines_of(loop.__code__, self.events), [])
        M.restart_events()
        loop(4)
        self.assertEqual(lines_of(loop.__code__, self.events), once)
        M.set_events(TOOL, 0)
        self.assertEqual(loop(4), expected)

    def test_local_lines(self):
        self.record(["LINE"], local_code=loop.__code__)
        loop(1)
        handler(1)
        M.set_local_events(TOOL, loop.__code__, 0)
        self.assertEqual({e[1] for e in self.events}, {"loop"})

    def test_generator_and_coroutine(self):
        def gen():
            yield 1
            yield 2

        async def coro():
            await asyncio.sleep(0)
            return 3
        self.record(["LINE"])
        try:
            self.assertEqual(list(gen()), [1, 2])
            self.assertEqual(asyncio.run(coro()), 3)
        finally:
            M.set_events(TOOL, 0)
            asyncio.set_event_loop_policy(None)
        self.assertEqual(lines_of(gen.__code__, self.events), [1, 2])
        self.assertEqual(lines_of(coro.__code__, self.events), [1, 2])

    def test_callback_raises(self):
        def line(code, line_number):
            if code is handler.__code__:
                raise KeyError(line_number - code.co_firstlineno)
        try:
            self.run_with_callback(E.LINE, line, handler, 0)
        except KeyError as exc:
            error = exc
        # Raised at the first line, the try, not handled by it.
        self.assertEqual(error.args, (1,))
        frames = traceback.extract_tb(error.__traceback__)
        self.assertEqual(frames[-2].name, "handler")
        self.assertEqual(frames[-2].lineno,
                         handler.__code__.co_firstlineno + 1)
        self.assertEqual(handler(0), 1)

    def test_settrace_beside(self):
        expected = settrace_lines(loop, 3)
        self.record(["LINE"])
        self.assertEqual(settrace_lines(loop, 3), expected)
        M.set_events(TOOL, 0)
        self.assertEqual(lines_of(loop.__code__, self.events), expected)

    def test_threads(self):
        self.record(["LINE"])
        threads = [threading.Thread(target=loop, args=(3,))
                   for _ in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        M.set_events(TOOL, 0)
        self.assertEqual(lines_of(loop.__code__, self.events),
                         settrace_lines(loop, 3) * 2)


def jumpy(x):
    x = 1
    x = 2
    x = 3
    return x


class TestSetLineno(MonitoringTestBase, unittest.TestCase):

    def test_jump_from_line_callback(self):
        first = jumpy.__code__.co_firstlineno

        def line(code, line_number):
            if code is jumpy.__code__ and line_number == first + 1:
                sys._getframe(1).f_lineno = first + 3
        self.assertEqual(self.run_with_callback(E.LINE, line, jumpy, 0), 3)

    def test_no_instruction_event_where_line_jumped_away(self):
        # LINE comes first; after a jump the instruction does not run, and
        # INSTRUCTION is reported where the frame goes on instead.
        first = jumpy.__code__.co_firstlineno
        code = jumpy.__code__
        instructions = []

        def line(code_, line_number):
            if code_ is code and line_number == first + 1:
                sys._getframe(1).f_lineno = first + 3

        def instruction(code_, offset):
            if code_ is code:
                instructions.append(offset)
        M.register_callback(TOOL, E.LINE, line)
        M.register_callback(TOOL, E.INSTRUCTION, instruction)
        M.set_local_events(TOOL, code, E.LINE | E.INSTRUCTION)
        try:
            self.assertEqual(jumpy(0), 3)
        finally:
            M.set_local_events(TOOL, code, 0)
        lines = {i.offset: i.positions.lineno
                 for i in dis.get_instructions(code)}
        ran_lines = [lines[offset] - first for offset in instructions]
        self.assertEqual(sorted(set(ran_lines)), [3, 4])

    def test_jump_refused(self):
        first = loop.__code__.co_firstlineno
        errors = []

        def line(code, line_number):
            if code is loop.__code__ and line_number == first + 1:
                try:
                    # Into the middle of the for loop.
                    sys._getframe(1).f_lineno = code.co_firstlineno + 3
                except ValueError as exc:
                    errors.append(str(exc))
        self.run_with_callback(E.LINE, line, loop, 1)
        self.assertIn("can't jump into the body of a for loop", errors)
        self.assertEqual(loop(3), -1)

    def test_jump_only_from_line(self):
        errors = []

        def start(code, offset):
            if code is jumpy.__code__:
                try:
                    sys._getframe(1).f_lineno = code.co_firstlineno + 3
                except ValueError as exc:
                    errors.append(str(exc))
        self.assertEqual(
            self.run_with_callback(E.PY_START, start, jumpy, 0), 3)
        self.assertEqual(len(errors), 1)
        self.assertRegex(errors[0], "trace event|LINE callback")


def straight(a):
    b = a + 1
    return b


def many_constants():
    x = 0
    y = 1
    return x, y


class TestInstructionEvents(MonitoringTestBase, unittest.TestCase):

    def offsets(self, code):
        return [e[2] for e in self.events
                if e[0] == "INSTRUCTION" and e[1] == code.co_name]

    def test_every_instruction(self):
        self.run_recorded(straight, ["INSTRUCTION"], 1)
        expected = [i.offset for i in dis.get_instructions(straight)
                    if i.opname != "RESUME"]
        self.assertEqual(self.offsets(straight.__code__), expected)

    def test_quickened_code(self):
        warm(chain, 1, 2)
        self.run_recorded(chain, ["INSTRUCTION"], 1, 2)
        ran = set(self.offsets(chain.__code__))
        # The instructions that specialized forms run without dispatch.
        for name in ["CALL", "STORE_FAST", "POP_JUMP_FORWARD_IF_FALSE"]:
            for i in dis.get_instructions(chain):
                if i.opname == name:
                    self.assertIn(i.offset, ran)
        self.assertEqual(chain(1, 2), 7)

    def test_extended_arg(self):
        # Locals and constants above index 255 need EXTENDED_ARG.
        source = "def f():\n%s    return a299\n" % "".join(
            "    a%d = 'c%d'\n" % (i, i) for i in range(300))
        ns = {}
        exec(source, ns)
        f = ns["f"]
        self.run_recorded(f, ["INSTRUCTION"])
        expected = [i.offset for i in dis.get_instructions(f)
                    if i.opname != "RESUME"]
        self.assertIn("EXTENDED_ARG", [i.opname for i in
                                       dis.get_instructions(f)])
        self.assertEqual(self.offsets(f.__code__), expected)
        self.assertEqual(f(), "c299")

    def test_settrace_opcodes_beside(self):
        # A trace function's line and opcode events are those of 3.11.
        expected = opcode_trace(straight, 1)
        self.record(["INSTRUCTION", "LINE"])
        got = opcode_trace(straight, 1)
        M.set_events(TOOL, 0)
        self.assertIn(("opcode", 2), expected)
        self.assertEqual(got, expected)
        self.assertTrue(self.events_in("straight"))

    def test_order_at_one_instruction(self):
        def f():
            for i in range(1):
                continue
        jump = offset_of(f, "JUMP_BACKWARD")
        M.insert_marker(TOOL, f.__code__, jump)
        self.record(["MARKER", "INSTRUCTION", "LINE", "JUMP"])
        f()
        M.set_events(TOOL, 0)
        line = f.__code__.co_firstlineno + 2
        at_jump = [e[0] for e in self.events
                   if e[2] == (line if e[0] == "LINE" else jump)]
        # 3.12's order (LINE first); MARKER, which no CPython has, leads.
        self.assertEqual(at_jump, ["MARKER", "LINE", "INSTRUCTION", "JUMP"])

    def test_toggle_line_and_instruction(self):
        # Upstream's gh-109156 and gh-122247: LINE and INSTRUCTION on and
        # off together, in one tool and across two.
        M.use_tool_id(OTHER, "other")
        expected_lines = settrace_lines(loop, 3)
        lines = []
        offsets = []
        for tool in (TOOL, OTHER):
            M.register_callback(
                tool, E.LINE,
                lambda code, line: code is loop.__code__ and lines.append(
                    line - code.co_firstlineno))
            M.register_callback(
                tool, E.INSTRUCTION,
                lambda code, offset: code is loop.__code__ and offsets.append(
                    offset))
        M.set_events(TOOL, E.INSTRUCTION)
        loop(3)
        M.set_events(TOOL, 0)
        expected_offsets = offsets[:]
        steps = [(TOOL, E.LINE), (OTHER, E.INSTRUCTION), (TOOL, 0),
                 (TOOL, E.LINE | E.INSTRUCTION), (OTHER, 0),
                 (OTHER, E.LINE), (TOOL, E.INSTRUCTION), (TOOL, 0),
                 (OTHER, 0)]
        for tool, events in steps:
            M.set_events(tool, events)
            lines.clear()
            offsets.clear()
            self.assertEqual(loop(3), -1)
            line_tools = [t for t in (TOOL, OTHER)
                          if M.get_events(t) & E.LINE]
            instruction_tools = [t for t in (TOOL, OTHER)
                                 if M.get_events(t) & E.INSTRUCTION]
            self.assertEqual(lines, [line for line in expected_lines
                                     for _ in line_tools])
            self.assertEqual(offsets, [offset for offset in expected_offsets
                                       for _ in instruction_tools])

    def test_callback_raises(self):
        def instruction(code, offset):
            if code is straight.__code__:
                raise KeyError(offset)
        with self.assertRaises(KeyError) as cm:
            self.run_with_callback(E.INSTRUCTION, instruction, straight, 1)
        self.assertEqual(cm.exception.args, (2,))
        self.assertEqual(straight(1), 2)


class Truth:
    def __init__(self, value):
        self.value = value
        self.asked = 0

    def __bool__(self):
        self.asked += 1
        return self.value


class Untruthful:
    def __bool__(self):
        raise KeyError("bool")


def branches(x, y):
    if x:
        a = 1
    else:
        a = 2
    b = x or y
    c = x and y
    for i in range(2):
        pass
    while y is not None:
        y = None
    return a, b, c


class TestJumpEvents(MonitoringTestBase, unittest.TestCase):

    def branch_events(self, *names):
        return [e for e in self.events if e[0] in names]

    def test_jump_and_branch_arguments(self):
        self.run_recorded(loop, ["JUMP", "BRANCH", "BRANCH_LEFT",
                                 "BRANCH_RIGHT"], 2)
        code = loop.__code__
        for_iter = offset_of(code, "FOR_ITER")
        after_loop = [i.argval for i in dis.get_instructions(code)
                      if i.opname == "FOR_ITER"][0]
        self.assertIn(("BRANCH", "loop", for_iter, for_iter + 2),
                      self.events)
        self.assertIn(("BRANCH_LEFT", "loop", for_iter, for_iter + 2),
                      self.events)
        self.assertIn(("BRANCH_RIGHT", "loop", for_iter, after_loop),
                      self.events)
        jumps = [e for e in self.events if e[0] == "JUMP"]
        self.assertEqual(len(jumps), 2)
        for _, _, source, dest in jumps:
            self.assertEqual(dest, for_iter)
        # Every BRANCH comes with its direction, and each direction with
        # the BRANCH before it.
        plain = [e[1:] for e in self.events if e[0] == "BRANCH"]
        split = [e[1:] for e in self.events if e[0].startswith("BRANCH_")]
        self.assertEqual(plain, split)

    def test_directions_and_values(self):
        targets = {i.offset: i.argval for i in dis.get_instructions(branches)}
        for x, y in [(0, 5), (3, None), (Truth(False), Truth(True))]:
            with self.subTest(x=x, y=y):
                expected = branches(x, y)
                self.events = []
                self.record(["BRANCH_LEFT", "BRANCH_RIGHT"])
                result = branches(x, y)
                M.set_events(TOOL, 0)
                self.assertEqual(result, expected)
                self.assertGreater(len(self.events), 4)
                for name, _, source, dest in self.events:
                    if name == "BRANCH_LEFT":
                        self.assertEqual(dest, source + 2)
                    else:
                        self.assertEqual(dest, targets[source])

    def test_condition_asked_once(self):
        for value in (True, False):
            x = Truth(value)
            y = Truth(not value)
            self.run_recorded(branches, ["BRANCH"], x, y)
            # if x, x or y, x and y: each asks x once; y never asked by a
            # jump that is not taken on it.
            self.assertEqual(x.asked, 3)
            self.assertEqual(y.asked, 0)

    def test_condition_raises(self):
        self.record(["BRANCH"])
        try:
            with self.assertRaisesRegex(KeyError, "bool"):
                branches(Untruthful(), 1)
        finally:
            M.set_events(TOOL, 0)
        self.assertEqual(self.events_in("branches"), [])

    def test_disable_one_direction(self):
        # gh-122548: a coverage tool disables each direction on its own.
        self.record(["BRANCH_LEFT", "BRANCH_RIGHT"], result=M.DISABLE)
        loop(3)
        first = self.events_in("loop")
        self.events.clear()
        loop(3)
        self.assertEqual(self.events_in("loop"), [])
        names = [e[0] for e in first if e[2] == offset_of(loop, "FOR_ITER")]
        self.assertEqual(names, ["BRANCH_LEFT", "BRANCH_RIGHT"])
        M.set_events(TOOL, 0)

    def test_disable_left_keeps_right(self):
        for_iter = offset_of(loop, "FOR_ITER")

        def left(code, source, dest):
            return M.DISABLE
        M.register_callback(TOOL, E.BRANCH_LEFT, left)
        M.register_callback(TOOL, E.BRANCH_RIGHT,
                            self.recorder("BRANCH_RIGHT"))
        M.set_local_events(TOOL, loop.__code__,
                           E.BRANCH_LEFT | E.BRANCH_RIGHT)
        loop(3)
        loop(3)
        M.set_local_events(TOOL, loop.__code__, 0)
        after_loop = [i.argval for i in dis.get_instructions(loop)
                      if i.opname == "FOR_ITER"][0]
        self.assertEqual([e for e in self.events if e[2] == for_iter],
                         [("BRANCH_RIGHT", "loop", for_iter, after_loop)] * 2)

    def test_for_iter_exhausted_by_error(self):
        def failing():
            yield 1
            raise KeyError("iter")

        def consume():
            for item in failing():
                pass
        self.record(["BRANCH_LEFT", "BRANCH_RIGHT"])
        try:
            with self.assertRaisesRegex(KeyError, "iter"):
                consume()
        finally:
            M.set_events(TOOL, 0)
        self.assertEqual([e[0] for e in self.events if e[1] == "consume"],
                         ["BRANCH_LEFT"])

    def test_branch_callback_raises_at_loop_end(self):
        def right(code, source, dest):
            if code is loop.__code__:
                raise KeyError("right")
        with self.assertRaisesRegex(KeyError, "right"):
            self.run_with_callback(E.BRANCH_RIGHT, right, loop, 2)
        self.assertEqual(loop(3), -1)

    def test_long_jump(self):
        # A jump over more than 255 code units takes an EXTENDED_ARG.
        body = "".join("        x = x + %d\n" % i for i in range(200))
        source = "def f(x):\n    if x:\n" + body + "    return x\n"
        ns = {}
        exec(source, ns)
        f = ns["f"]
        self.run_recorded(f, ["BRANCH_RIGHT"], 0)
        jump = [i for i in dis.get_instructions(f)
                if i.opname.startswith("POP_JUMP")][0]
        self.assertEqual(self.events,
                         [("BRANCH_RIGHT", "f", jump.offset, jump.argval)])
        self.assertEqual(f(1), 1 + sum(range(200)))


def matcher(x):
    match x:
        case 1:
            return "one"
        case [a, b]:
            return "pair"
    return "none"


def except_star(exc):
    r = None
    try:
        raise ExceptionGroup("g", [exc])
    except* KeyError:
        r = "key"
    except* ValueError:
        r = "value"
    return r


def numbers(n):
    yield from range(n)


def sum_generator(n):
    total = 0
    for i in numbers(n):
        total += i
    return total


class TestBranchPlaces(MonitoringTestBase, unittest.TestCase):
    """Where 3.14 reports branches that 3.11's bytecode makes in its own
    way: each direction from the line a coverage tool shows the branch on."""

    def arcs(self, func, *inputs):
        """{(name, source line, destination line)}, relative to func's
        first line, over func run on each input."""
        code = func.__code__
        self.record(["BRANCH_LEFT", "BRANCH_RIGHT"], local_code=code)
        try:
            for arg in inputs:
                func(arg)
        finally:
            M.set_local_events(TOOL, code, 0)
        first = code.co_firstlineno
        # Instructions of no line (the machinery of except*) are None.
        lines = {i.offset: i.positions.lineno and i.positions.lineno - first
                 for i in dis.get_instructions(code)}
        return {(name, lines[source], lines[dest])
                for name, _, source, dest in self.events}

    def test_match(self):
        arcs = self.arcs(matcher, 1, [1, 2], 3, [1])
        # Each case's test goes on into its body or on to the next case.
        self.assertEqual({(name, line) for name, line, _ in arcs},
                         {("BRANCH_LEFT", 2), ("BRANCH_RIGHT", 2),
                          ("BRANCH_LEFT", 4), ("BRANCH_RIGHT", 4)})
        self.assertIn(("BRANCH_LEFT", 2, 2), arcs)
        self.assertIn(("BRANCH_RIGHT", 2, 4), arcs)

    def test_except_star(self):
        arcs = self.arcs(except_star, KeyError(), ValueError())
        from_clauses = {(name, line) for name, line, _ in arcs
                        if line in (4, 6)}
        self.assertEqual(from_clauses,
                         {("BRANCH_LEFT", 4), ("BRANCH_RIGHT", 4),
                          ("BRANCH_LEFT", 6), ("BRANCH_RIGHT", 6)})

    def test_for_over_a_generator(self):
        self.assertEqual(self.arcs(sum_generator, 2),
                         {("BRANCH_LEFT", 2, 2), ("BRANCH_RIGHT", 2, 4)})


class Letters:
    """An asynchronous iterator over a string, or one that fails."""

    def __init__(self, letters, fail=None):
        self.letters = list(letters)
        self.fail = fail

    def __aiter__(self):
        return self

    async def __anext__(self):
        await Await()
        if self.letters:
            return self.letters.pop(0)
        raise self.fail or StopAsyncIteration


async def async_loop(it):
    seen = []
    async for letter in it:
        await Await()
        seen.append(letter)
    return seen


async def async_comprehension(it):
    return [letter async for letter in it]


def run_coroutine(coro):
    """coro's result, run without an event loop."""
    while True:
        try:
            coro.send(None)
        except StopIteration as stop:
            return stop.value


class TestAsyncForBranches(MonitoringTestBase, unittest.TestCase):
    """3.14 reports the branch of an async for (gh-128534): BRANCH_LEFT
    where its await gets an item, BRANCH_RIGHT where StopAsyncIteration
    ends it, both from the await's SEND.  Sightglass reports BRANCH too."""

    def lines(self, code):
        return {i.offset: i.positions.lineno
                for i in dis.get_instructions(code)}

    def run_recorded_on(self, code, func, *args, names=("BRANCH",
                        "BRANCH_LEFT", "BRANCH_RIGHT"), result=None):
        self.record(list(names), local_code=code, result=result)
        try:
            return run_coroutine(func(*args))
        finally:
            M.set_local_events(TOOL, code, 0)

    def test_both_directions_from_the_send(self):
        code = async_loop.__code__
        self.assertEqual(self.run_recorded_on(code, async_loop,
                                              Letters("ab")), ["a", "b"])
        lines = self.lines(code)
        send = next(i.offset for i in dis.get_instructions(code)
                    if i.opname == "SEND")
        first = code.co_firstlineno
        got = [(name, source, lines[dest] - first)
               for name, _, source, dest in self.events]
        # The loop goes on to its target (on the async for line) twice,
        # then ends on the line after the loop.
        self.assertEqual(got, [("BRANCH", send, 2), ("BRANCH_LEFT", send, 2),
                               ("BRANCH", send, 2), ("BRANCH_LEFT", send, 2),
                               ("BRANCH", send, 5), ("BRANCH_RIGHT", send, 5)])
        # The await in the body is no branch.
        self.assertEqual(lines[send] - first, 2)

    def test_comprehension(self):
        code = async_comprehension.__code__.co_consts[1]
        self.assertEqual(self.run_recorded_on(
            code, async_comprehension, Letters("xyz"),
            names=["BRANCH_LEFT", "BRANCH_RIGHT"]), ["x", "y", "z"])
        self.assertEqual([e[0] for e in self.events],
                         ["BRANCH_LEFT"] * 3 + ["BRANCH_RIGHT"])

    def test_no_right_branch_when_the_iterator_fails(self):
        code = async_loop.__code__
        with self.assertRaises(KeyError):
            self.run_recorded_on(code, async_loop, Letters("a", KeyError()))
        self.assertEqual([e[0] for e in self.events],
                         ["BRANCH", "BRANCH_LEFT"])

    def test_disable_each_direction(self):
        code = async_loop.__code__
        self.run_recorded_on(code, async_loop, Letters("abc"),
                             names=["BRANCH_LEFT", "BRANCH_RIGHT"],
                             result=M.DISABLE)
        self.assertEqual([e[0] for e in self.events],
                         ["BRANCH_LEFT", "BRANCH_RIGHT"])
        self.events = []
        self.run_recorded_on(code, async_loop, Letters("abc"),
                             names=["BRANCH_LEFT", "BRANCH_RIGHT"])
        self.assertEqual(self.events, [])
        M.restart_events()
        self.run_recorded_on(code, async_loop, Letters("a"),
                             names=["BRANCH_LEFT", "BRANCH_RIGHT"])
        self.assertEqual([e[0] for e in self.events],
                         ["BRANCH_LEFT", "BRANCH_RIGHT"])

    def test_callback_exception_leaves_the_loop(self):
        code = async_loop.__code__

        def fail(*args):
            raise ZeroDivisionError
        for name in ("BRANCH_LEFT", "BRANCH_RIGHT"):
            with self.subTest(event=name):
                M.register_callback(TOOL, getattr(E, name), fail)
                M.set_local_events(TOOL, code, getattr(E, name))
                try:
                    with self.assertRaises(ZeroDivisionError):
                        run_coroutine(async_loop(Letters("ab")))
                finally:
                    M.clear_tool_id(TOOL)


def marked(x):
    x += 1
    if x > 100:
        x = 0
    return x


class TestMarkers(MonitoringTestBase, unittest.TestCase):

    def test_marker_fires_where_placed(self):
        code = marked.__code__
        where = offset_of(code, "RETURN_VALUE")
        M.insert_marker(TOOL, code, where)
        self.record(["MARKER"])
        marked(1)
        marked(2)
        self.assertEqual(self.events, [("MARKER", "marked", where)] * 2)
        M.remove_marker(TOOL, code, where)
        self.events.clear()
        marked(3)
        self.assertEqual(self.events, [])
        M.set_events(TOOL, 0)

    def test_marker_needs_the_event(self):
        code = marked.__code__
        M.insert_marker(TOOL, code, offset_of(code, "RETURN_VALUE"))
        M.register_callback(TOOL, E.MARKER, self.recorder("MARKER"))
        marked(1)
        self.assertEqual(self.events, [])
        M.set_local_events(TOOL, code, E.MARKER)
        marked(1)
        self.assertEqual(len(self.events), 1)
        M.set_local_events(TOOL, code, 0)

    def test_marker_on_a_line_never_run(self):
        code = marked.__code__
        M.insert_marker(TOOL, code, offset_of(code, "LOAD_CONST", 2))
        self.record(["MARKER"])
        for i in range(10):
            marked(i)
        self.assertEqual(self.events, [])
        marked(100)
        self.assertEqual(len(self.events), 1)
        M.set_events(TOOL, 0)

    def test_markers_of_two_tools(self):
        code = marked.__code__
        where = offset_of(code, "RETURN_VALUE")
        M.use_tool_id(OTHER, "other")
        M.insert_marker(TOOL, code, where)
        M.insert_marker(OTHER, code, where)
        self.record(["MARKER"])
        self.record(["MARKER"], tool=OTHER)
        marked(1)
        # Lowest tool id first.
        self.assertEqual(len(self.events), 2)
        M.free_tool_id(OTHER)
        self.events.clear()
        marked(1)
        self.assertEqual(len(self.events), 1)
        M.use_tool_id(OTHER, "other")
        with self.assertRaisesRegex(ValueError, "no marker"):
            M.remove_marker(OTHER, code, where)
        M.set_events(TOOL, 0)

    def test_disable(self):
        code = marked.__code__
        where = offset_of(code, "RETURN_VALUE")
        M.insert_marker(TOOL, code, where)
        self.record(["MARKER"], result=M.DISABLE)
        marked(1)
        marked(1)
        self.assertEqual(len(self.events), 1)
        M.restart_events()
        marked(1)
        self.assertEqual(len(self.events), 2)
        M.set_events(TOOL, 0)

    def test_bad_offsets(self):
        code = marked.__code__
        instructions = list(dis.get_instructions(code))
        self.assertEqual(instructions[3].opname, "BINARY_OP")
        cache = instructions[3].offset + 2
        for offset in [1, -2, len(code.co_code), cache]:
            with self.assertRaisesRegex(ValueError,
                                        "not the start of an instruction"):
                M.insert_marker(TOOL, code, offset)
        with self.assertRaisesRegex(ValueError, "RESUME"):
            M.insert_marker(TOOL, code, 0)
        with self.assertRaisesRegex(TypeError, "code must be a code"):
            M.insert_marker(TOOL, marked, 2)
        with self.assertRaisesRegex(ValueError, "not in use"):
            M.insert_marker(OTHER, code, 2)
        with self.assertRaisesRegex(ValueError, "invalid tool"):
            M.insert_marker(6, code, 2)
        with self.assertRaisesRegex(ValueError, "no marker"):
            M.remove_marker(TOOL, code, 2)

    def test_at_most_255(self):
        source = "def f(x):\n" + "    x += 1\n" * 100 + "    return x\n"
        ns = {}
        exec(source, ns)
        code = ns["f"].__code__
        offsets = [i.offset for i in dis.get_instructions(code)
                   if i.opname != "RESUME"]
        for offset in offsets[:255]:
            M.insert_marker(TOOL, code, offset)
        # Again at a marked place: nothing new.
        M.insert_marker(TOOL, code, offsets[0])
        with self.assertRaisesRegex(ValueError, "at most 255 markers"):
            M.insert_marker(TOOL, code, offsets[255])
        M.remove_marker(TOOL, code, offsets[0])
        M.insert_marker(TOOL, code, offsets[255])
        self.record(["MARKER"])
        self.assertEqual(ns["f"](0), 100)
        self.assertEqual(len(self.events), 255)
        M.set_events(TOOL, 0)


class TestLineCoverage(unittest.TestCase):
    """Lib/linecov.py, a client of LINE and DISABLE, against trace."""

    def setUp(self):
        for tool in range(6):
            M.free_tool_id(tool)

    def test_same_lines_as_trace(self):
        import linecov
        import trace
        for func, args in [(loop, (5,)), (branches, (0, 1)),
                           (handler, (0,)), (chain, (1, 2))]:
            code = func.__code__
            own = range(code.co_firstlineno,
                        max(line for *_, line in code.co_lines() if line) + 1)
            tracer = trace.Trace(count=True, trace=False)
            tracer.runfunc(func, *args)
            traced = {line for (name, line) in tracer.results().counts
                      if name == __file__ and line in own}
            cov = linecov.LineCoverage()
            with cov:
                func(*args)
            covered = {line for line in cov.lines()[__file__] if line in own}
            self.assertTrue(traced)
            self.assertEqual(covered, traced)

    def test_upstream_test_modules(self):
        # Programs: upstream test modules, each run in processes of its own
        # under trace and under linecov; the module under test must show
        # the same lines.
        program = textwrap.dedent("""
            import importlib, io, json, sys, unittest
            tool, test, target = sys.argv[1:]
            def run():
                suite = unittest.defaultTestLoader.loadTestsFromName(test)
                unittest.TextTestRunner(stream=io.StringIO()).run(suite)
            if tool == "trace":
                import trace
                tracer = trace.Trace(count=True, trace=False)
                tracer.runfunc(run)
                lines = [line for (name, line) in tracer.results().counts
                         if name == importlib.import_module(target).__file__]
            else:
                import linecov
                cov = linecov.LineCoverage()
                with cov:
                    run()
                lines = list(cov.lines().get(
                    importlib.import_module(target).__file__, ()))
            print(json.dumps(sorted(lines)))
        """)
        import json
        for test, target in [("test.test_bisect", "bisect"),
                             ("test.test_textwrap", "textwrap"),
                             ("test.test_fnmatch", "fnmatch")]:
            with self.subTest(test=test):
                found = {}
                for tool in ("trace", "linecov"):
                    rc, out, err = script_helper.assert_python_ok(
                        "-c", program, tool, test, target)
                    found[tool] = json.loads(
                        out.decode().strip().splitlines()[-1])
                self.assertGreater(len(found["trace"]), 20)
                self.assertEqual(found["linecov"], found["trace"])

    def test_command_line(self):
        import json
        import os
        import tempfile
        with tempfile.TemporaryDirectory() as tmp:
            script = os.path.join(tmp, "prog.py")
            output = os.path.join(tmp, "lines.json")
            with open(script, "w") as f:
                f.write("import sys\nif len(sys.argv) > 1:\n"
                        "    x = 1\nelse:\n    x = 2\n")
            script_helper.assert_python_ok("-m", "linecov", "-o", output,
                                           script, "arg")
            with open(output) as f:
                lines = json.load(f)
            self.assertEqual(lines[script], [1, 2, 3])

    def test_tool_id_taken(self):
        import linecov
        M.use_tool_id(M.COVERAGE_ID, "someone")
        try:
            with self.assertRaisesRegex(ValueError, "already in use"):
                linecov.LineCoverage().start()
        finally:
            M.free_tool_id(M.COVERAGE_ID)


def gen_expression(n):
    return (x * 2
            for x in range(n)
            if x % 3)


class Await:
    def __await__(self):
        yield


async def async_generator(n):
    for i in range(n):
        await Await()
        yield i


def drive_async_generator(agen):
    """The values agen yields, run without an event loop."""
    values = []
    step = agen.__anext__()
    while True:
        try:
            step.send(None)
        except StopIteration as stop:
            values.append(stop.value)
            step = agen.__anext__()
        except StopAsyncIteration:
            return values


@contextlib.contextmanager
def nothing():
    yield


def with_in_try():
    n = 0
    try:
        with nothing():
            n += 1
        raise KeyError
    except KeyError:
        n += 10
    return n


class TestFuzzFindings(MonitoringTestBase, unittest.TestCase):
    """What a random-operation fuzzer found; some are 3.11's own bugs."""

    def jump(self, how, code, from_line, to_line, run):
        """Run `run` while f_lineno is set from from_line to to_line once
        (lines relative to code's first), by a trace function or a LINE
        callback; return its result and what the jump raised."""
        first = code.co_firstlineno
        errors = []

        def jump_once(frame):
            if errors:
                return
            try:
                frame.f_lineno = first + to_line
            except ValueError as exc:
                errors.append(str(exc))
            else:
                errors.append(None)

        if how == "settrace":
            def tracer(frame, event, arg):
                if (event == "line" and frame.f_code is code
                        and frame.f_lineno == first + from_line):
                    jump_once(frame)
                return tracer
            sys.settrace(tracer)
            try:
                result = run()
            finally:
                sys.settrace(None)
        else:
            def line(code_, line_number):
                if code_ is code and line_number == first + from_line:
                    jump_once(sys._getframe(1))
            result = self.run_with_callback(E.LINE, line, run)
        return result, errors

    def test_no_jump_into_a_generators_setup(self):
        # Running RETURN_GENERATOR again crashed (stock 3.11.2 too).
        for how in ("settrace", "LINE"):
            with self.subTest(how=how):
                code = gen_expression.__code__.co_consts[1]
                result, errors = self.jump(
                    how, code, 2, 0, lambda: list(gen_expression(6)))
                self.assertEqual(result, [2, 4, 8, 10])
                self.assertEqual(len(errors), 1)
                self.assertIsNotNone(errors[0])

                code = async_generator.__code__
                result, errors = self.jump(
                    how, code, 3, 0,
                    lambda: drive_async_generator(async_generator(3)))
                self.assertEqual(result, [0, 1, 2])
                self.assertEqual(errors, [
                    "can't jump into the setup of a generator, coroutine "
                    "or closure"])

    def test_jump_from_except_into_with_restores_exc_info(self):
        # The handler's saved exception state was taken for the with
        # statement's __exit__ (3.11 and 3.12 alike).
        for how in ("settrace", "LINE"):
            with self.subTest(how=how):
                result, errors = self.jump(how, with_in_try.__code__, 7, 3,
                                           with_in_try)
                self.assertEqual(errors, [None])
                self.assertEqual(result, 12)
                self.assertEqual(sys.exc_info(), (None, None, None))
                result, errors = self.jump(how, with_in_try.__code__, 7, 4,
                                           with_in_try)
                self.assertEqual(errors, ["incompatible stacks"])
                self.assertEqual(result, 11)

    def test_callback_raising_where_a_handler_starts_or_ends(self):
        # At PUSH_EXC_INFO, which had not run, the handler's cleanup made
        # the handled exception the thread's for good; at POP_EXCEPT
        # nothing restored the state (3.11's settrace and 3.12 alike).
        def except_handler():
            try:
                raise KeyError
            except KeyError:
                return "handled"

        def with_handler():
            with nothing():
                raise KeyError

        for func, opname in ((except_handler, "PUSH_EXC_INFO"),
                             (with_handler, "PUSH_EXC_INFO"),
                             (except_handler, "POP_EXCEPT")):
            code = func.__code__
            start = offset_of(code, opname)
            # PUSH_EXC_INFO has no line: LINE comes at the next instruction.
            line = next(i.positions.lineno for i in dis.get_instructions(code)
                        if i.offset >= start and i.positions.lineno)
            for name in ("MARKER", "LINE", "INSTRUCTION"):
                with self.subTest(func=func.__name__, at=opname, event=name):
                    def fail(code_, arg):
                        if code_ is code and arg == (
                                line if name == "LINE" else start):
                            raise ZeroDivisionError
                    M.register_callback(TOOL, getattr(E, name), fail)
                    M.set_local_events(TOOL, code, getattr(E, name))
                    if name == "MARKER":
                        M.insert_marker(TOOL, code, start)
                    try:
                        with self.assertRaises(ZeroDivisionError):
                            func()
                    finally:
                        M.clear_tool_id(TOOL)
                    self.assertEqual(sys.exc_info(), (None, None, None))

    def test_callback_exceptions_are_raised_where_the_event_is(self):
        # The documented rule, for every event of an instruction in a try
        # block: its handler catches what the callback raises (3.12 lets
        # a JUMP callback's exception escape the function).
        def loop_in_try(x):
            try:
                for i in range(2):
                    if x:
                        x = 1
            except ZeroDivisionError:
                return "caught"
            return "done"
        code = loop_in_try.__code__
        loop_line = code.co_firstlineno + 2
        loop_start = next(i.offset for i in dis.get_instructions(code)
                          if i.positions.lineno == loop_line)
        for name in ("JUMP", "BRANCH", "BRANCH_LEFT", "BRANCH_RIGHT", "LINE",
                     "INSTRUCTION"):
            with self.subTest(event=name):
                raised = []

                def fail(code_, where, *args):
                    inside = where >= (loop_line if name == "LINE"
                                       else loop_start)
                    if code_ is code and inside and not raised:
                        raised.append(name)
                        raise ZeroDivisionError
                M.register_callback(TOOL, getattr(E, name), fail)
                M.set_local_events(TOOL, code, getattr(E, name))
                try:
                    self.assertEqual(loop_in_try(0), "caught")
                finally:
                    M.clear_tool_id(TOOL)
                self.assertEqual(raised, [name])

    def test_disable_honoured_by_the_delivery_in_flight(self):
        # OTHER is called after TOOL, which turns OTHER's event off or makes
        # another thread disable it: OTHER is not called in this delivery.
        def f():
            pass

        def disables(code, offset):
            self.events.append(("disables", threading.get_ident()))
            return M.DISABLE
        for change in (lambda *args: M.set_local_events(OTHER, f.__code__, 0),
                       lambda *args: M.free_tool_id(OTHER)):
            with self.subTest(change=change):
                self.events = []
                M.use_tool_id(OTHER, "other")
                M.register_callback(OTHER, E.PY_START, self.recorder("OTHER"))
                M.set_local_events(OTHER, f.__code__, E.PY_START)
                M.register_callback(TOOL, E.PY_START, change)
                M.set_local_events(TOOL, f.__code__, E.PY_START)
                f()
                M.set_local_events(TOOL, f.__code__, 0)
                M.free_tool_id(OTHER)
                self.assertEqual(self.events, [])

        # The same site disabled by OTHER in another thread meanwhile.
        self.events = []
        M.use_tool_id(OTHER, "other")
        M.register_callback(OTHER, E.PY_START, disables)
        M.set_local_events(OTHER, f.__code__, E.PY_START)

        def run_f_in_thread(code, offset):
            if threading.current_thread() is main:
                t = threading.Thread(target=f)
                t.start()
                t.join()
        main = threading.current_thread()
        M.register_callback(TOOL, E.PY_START, run_f_in_thread)
        M.set_local_events(TOOL, f.__code__, E.PY_START)
        try:
            f()
        finally:
            M.set_local_events(TOOL, f.__code__, 0)
        # The thread's f ran while this thread's delivery was in TOOL's
        # callback; only TOOL heard it there, not the nested thread run
        # (TOOL's callback is silent only in its own thread).
        self.assertEqual(len(self.events), 1)

    def test_several_tools_cost_what_each_costs_alone(self):
        # Each tool's callbacks were monitored by the others, so that the
        # work multiplied (one operation took 256 s).  Count the calls.
        def work():
            total = 0
            for i in range(20):
                if i % 2:
                    total += len(str(i))
            return total
        code = work.__code__
        names = ["INSTRUCTION", "CALL", "BRANCH", "JUMP", "LINE"]
        tools = [0, 1, 2, 3]

        def run(active):
            counts = {tool: 0 for tool in active}
            for tool in active:
                if tool != TOOL:
                    M.use_tool_id(tool, str(tool))

                def count(code_, *args, tool=tool):
                    if code_ is code:
                        counts[tool] += 1
                    # A callback that runs Python code of its own.
                    sorted(str(arg) for arg in args)
                for name in names:
                    M.register_callback(tool, getattr(E, name), count)
                M.set_events(tool, sum(getattr(E, n) for n in names))
            work()
            for tool in active:
                M.set_events(tool, 0)
                if tool != TOOL:
                    M.free_tool_id(tool)
            return counts
        alone = {tool: run([tool])[tool] for tool in tools}
        together = run(tools)
        self.assertEqual(together, alone)


def long_function(statements, gap=0):
    """A function of `statements` lines, `gap` empty lines apart."""
    body = "".join(f"    x = {i}\n" + "\n" * gap for i in range(statements))
    namespace = {}
    exec(f"def f():\n{body}    return x\n", namespace)
    return namespace["f"]


class TestCodeData(MonitoringTestBase, unittest.TestCase):
    """What monitoring keeps per code object: a coverage tool monitors all
    code, so a byte more per code unit is megabytes in a large program."""

    def kept(self, *actions):
        """The bytes still allocated after each of `actions`, per code unit
        of the function they work on, beyond what was before."""
        func = long_function(2000)
        units = len(func.__code__.co_code) // 2
        func()
        gc_was_enabled = gc.isenabled()
        gc.disable()
        tracemalloc.start()
        try:
            before = tracemalloc.get_traced_memory()[0]
            kept = []
            for action in actions:
                action(func)
                kept.append((tracemalloc.get_traced_memory()[0] - before)
                            / units)
        finally:
            tracemalloc.stop()
            if gc_was_enabled:
                gc.enable()
        return kept

    def test_one_tool_with_line(self):
        def line(code, line_number):
            pass
        M.register_callback(TOOL, E.LINE, line)

        def run(func):
            M.set_local_events(TOOL, func.__code__, E.LINE)
            func()
        # 3.12 keeps two bytes a unit here, 3.11's first fork fifteen.
        [kept] = self.kept(run)
        self.assertLess(kept, 2.3)

    def test_profiler_events(self):
        M.register_callback(TOOL, E.PY_START, lambda code, offset: None)

        def run(func):
            M.set_local_events(TOOL, func.__code__,
                               E.PY_START | E.PY_RETURN)
            func()
        [kept] = self.kept(run)
        self.assertLess(kept, 1.2)

    def test_disable_and_restart(self):
        def line(code, line_number):
            return M.DISABLE
        M.register_callback(TOOL, E.LINE, line)

        def run(func):
            M.set_local_events(TOOL, func.__code__, E.LINE)
            func()

        def restart(func):
            M.register_callback(TOOL, E.LINE, lambda code, line_number: None)
            M.restart_events()
            func()
        disabled, restarted = self.kept(run, restart)
        # One byte a unit marks where the tool disabled LINE, until
        # restart_events() forgets the marks.
        self.assertLess(disabled, 3.3)
        self.assertGreater(disabled, 2.5)
        self.assertLess(restarted, 2.3)

    def test_freed_tool_leaves_no_marks(self):
        M.use_tool_id(OTHER, "other")
        M.register_callback(OTHER, E.LINE, lambda code, line: M.DISABLE)

        def run(func):
            M.set_local_events(OTHER, func.__code__, E.LINE)
            func()

        def free(func):
            M.free_tool_id(OTHER)
            func()
            self.assertEqual(M.get_local_events(OTHER, func.__code__), 0)
        disabled, freed = self.kept(run, free)
        self.assertGreater(disabled, 2.5)
        self.assertLess(freed, 2.3)

    def test_lines_far_apart(self):
        # Lines more than a hundred apart within a few code units.
        for gap in (0, 125, 126, 127, 300, 100000):
            with self.subTest(gap=gap):
                func = long_function(30, gap)
                self.events = []
                self.run_recorded(func, ["LINE"])
                self.assertEqual(lines_of(func.__code__, self.events),
                                 settrace_lines(func))
                self.assertEqual(len(lines_of(func.__code__, self.events)),
                                 31)
                M.restart_events()

    def test_lines_before_the_def(self):
        # A line table may give lines below co_firstlineno.
        func = long_function(3)
        code = func.__code__
        func.__code__ = code.replace(co_firstlineno=code.co_firstlineno + 50)
        self.events = []
        self.run_recorded(func, ["LINE"])
        self.assertEqual(lines_of(func.__code__, self.events),
                         settrace_lines(func))
        self.assertEqual(len(lines_of(func.__code__, self.events)), 4)


class TestInvisible(MonitoringTestBase, unittest.TestCase):

    def test_code_unchanged(self):
        def f(x):
            for i in range(x):
                len([i])
            return x
        for i in range(10):
            f(3)     # quickened
        copy = f.__code__.replace()
        before = (f.__code__.co_code, marshal.loads(marshal.dumps(f.__code__)),
                  hash(f.__code__), dis.Bytecode(f).dis())
        M.insert_marker(TOOL, f.__code__, offset_of(f, "RETURN_VALUE"))
        self.record(["PY_START", "PY_RETURN", "CALL", "C_RETURN",
                     "STOP_ITERATION", "LINE", "INSTRUCTION", "JUMP",
                     "BRANCH", "BRANCH_LEFT", "BRANCH_RIGHT", "MARKER"])
        f(3)
        after = (f.__code__.co_code, marshal.loads(marshal.dumps(f.__code__)),
                 hash(f.__code__), dis.Bytecode(f).dis())
        M.set_events(TOOL, 0)
        self.assertTrue(self.events)
        self.assertEqual(before, after)
        self.assertEqual(f.__code__, copy)
        self.assertNotIn("INSTRUMENTED",
                         dis.Bytecode(f, adaptive=False).dis())


if __name__ == "__main__":
    unittest.main()
