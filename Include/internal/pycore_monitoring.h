#ifndef Py_INTERNAL_MONITORING_H
#define Py_INTERNAL_MONITORING_H
#ifdef __cplusplus
extern "C" {
#endif

#ifndef Py_BUILD_CORE
#  error "this header requires Py_BUILD_CORE define"
#endif

/* sys.monitoring (PEP 669), implemented in Python/instrumentation.c.

   Events that happen at a bytecode instruction (PY_START, PY_RETURN,
   CALL, ...) cost nothing where no tool wants them: the instruction is
   replaced by an INSTRUMENTED_ form in the quickened bytecode only where
   some tool has the event active.  Every change of events, callbacks'
   DISABLE state or tools bumps the interpreter's version; a code object
   brings its bytecode up to date when RESUME finds its own version behind,
   and the code of every executing frame is brought up to date at once.
   Events of the exception paths (RAISE, PY_UNWIND, ...) are checked there,
   where a test of one byte is lost in the cost of the exception. */

/* Event numbers: bit positions in an event set.  The first seventeen are
   CPython 3.12's, so that sets written as numbers for 3.12 keep their
   meaning; 3.14's split branch events and the PEP draft's MARKER follow. */
#define _PY_MONITORING_EVENT_PY_START 0
#define _PY_MONITORING_EVENT_PY_RESUME 1
#define _PY_MONITORING_EVENT_PY_RETURN 2
#define _PY_MONITORING_EVENT_PY_YIELD 3
#define _PY_MONITORING_EVENT_CALL 4
#define _PY_MONITORING_EVENT_LINE 5
#define _PY_MONITORING_EVENT_INSTRUCTION 6
#define _PY_MONITORING_EVENT_JUMP 7
#define _PY_MONITORING_EVENT_BRANCH 8
#define _PY_MONITORING_EVENT_STOP_ITERATION 9
#define _PY_MONITORING_EVENT_RAISE 10
#define _PY_MONITORING_EVENT_EXCEPTION_HANDLED 11
#define _PY_MONITORING_EVENT_PY_UNWIND 12
#define _PY_MONITORING_EVENT_PY_THROW 13
#define _PY_MONITORING_EVENT_RERAISE 14
#define _PY_MONITORING_EVENT_C_RETURN 15
#define _PY_MONITORING_EVENT_C_RAISE 16
#define _PY_MONITORING_EVENT_BRANCH_LEFT 17
#define _PY_MONITORING_EVENT_BRANCH_RIGHT 18
#define _PY_MONITORING_EVENT_MARKER 19
#define _PY_MONITORING_EVENTS 20

/* Events that may be set for one code object (set_local_events). */
#define _PY_MONITORING_LOCAL_EVENTS \
    (((1 << (_PY_MONITORING_EVENT_STOP_ITERATION + 1)) - 1) \
     | 1 << _PY_MONITORING_EVENT_BRANCH_LEFT \
     | 1 << _PY_MONITORING_EVENT_BRANCH_RIGHT \
     | 1 << _PY_MONITORING_EVENT_MARKER)

/* Local events numbered without the gap between STOP_ITERATION and
   BRANCH_LEFT: the index of per-code tables. */
#define _PY_MONITORING_LOCAL_EVENT_COUNT 13
#define _PY_MONITORING_LOCAL_INDEX(event) \
    ((event) <= _PY_MONITORING_EVENT_STOP_ITERATION \
     ? (event) : (event) - (_PY_MONITORING_EVENT_BRANCH_LEFT \
                            - _PY_MONITORING_EVENT_STOP_ITERATION - 1))

/* Tools 0-5 belong to users; the ids above are reserved, as upstream
   reserves them for sys.setprofile and sys.settrace. */
#define _PY_MONITORING_TOOL_IDS 8
#define _PY_MONITORING_USER_TOOL_IDS 6
/* The tool of sys.setprofile() (Python/setprofile.c). */
#define _PY_MONITORING_PROFILE_ID 6

/* A callback written in C, for tools of the core and its modules (the
   profilers): called where a Python callback would be, under the same
   rules, with `where` (the line for LINE, the offset in bytes for the
   other events) and the event's own arguments, and no object made for
   it.  `arg` is the one given at registration.  The current frame
   (tstate->cframe->current_frame) is the event's.  Returns 0, 1 to
   disable the event where it happened (as DISABLE), or -1 with an
   exception set.

   Where an exception propagates (PY_THROW, RAISE, RERAISE, PY_UNWIND,
   C_RAISE, and STOP_ITERATION or a jump told with one set), it is still
   set while the callback runs, and the argument that would be the
   exception is NULL: a callback that runs code saves and restores it,
   and one that fails replaces it. */
typedef int (*_PyMonitoring_NativeCallback)(void *arg, PyThreadState *tstate,
                                            PyCodeObject *code, long where,
                                            PyObject *arg1, PyObject *arg2);

struct _Py_monitoring_state {
    /* Bumped by every change that may change what code must deliver. */
    uint32_t version;
    /* Code brought up to date from a version below this one forgets which
       tools returned DISABLE where (restart_events). */
    uint32_t restart_version;
    /* Per event, the tools that have it set for all code. */
    uint8_t global[_PY_MONITORING_EVENTS];
    /* Counts the times a tool was freed or cleared; per tool, the count
       just after its last time.  Code data last brought up to date at an
       earlier count holds local events, DISABLE marks and markers of that
       tool that are void. */
    uint32_t clears;
    uint32_t cleared_at[_PY_MONITORING_TOOL_IDS];
    /* Every event some code has had set locally: where an event is not
       instrumented, its path checks for this before it looks closer. */
    uint32_t local_union;
    PyObject *tool_names[_PY_MONITORING_TOOL_IDS];
    PyObject *callbacks[_PY_MONITORING_TOOL_IDS][_PY_MONITORING_EVENTS];
    /* The threads with a profile function (sys.setprofile). */
    int profiled_threads;
    /* For sys.getprofile() in a thread without a profile function: the
       profiler, a tool written in C, that records the thread (in 3.11,
       cProfile's profiler was the thread's profile object). */
    PyObject *(*profiler_of)(void *arg, PyThreadState *tstate);
    void *profiler_of_arg;
    /* Tools whose callbacks of CALL, C_RETURN and C_RAISE, written in C,
       want to hear of calls of built-in functions and method descriptors
       only: a profiler times them, and a Python function's PY_START tells
       the rest.  Other calls, most of them, then cost it nothing. */
    uint8_t builtin_calls_only;
    /* Where callbacks[tool][event] is NULL, a C callback may be set. */
    struct {
        _PyMonitoring_NativeCallback func;
        void *arg;
    } native[_PY_MONITORING_TOOL_IDS][_PY_MONITORING_EVENTS];
};

/* What monitoring marks per code unit, each a set of tools: per place an
   instruction can be told about, the tools that returned DISABLE there
   (the event of the instruction itself, such as PY_START, CALL or JUMP;
   the three branch events; the events of any instruction), and the tools
   with a marker there. */
enum {
    _PY_MONITORING_MARK_SITE,
    _PY_MONITORING_MARK_BRANCH,
    _PY_MONITORING_MARK_BRANCH_LEFT,
    _PY_MONITORING_MARK_BRANCH_RIGHT,
    _PY_MONITORING_MARK_LINE,
    _PY_MONITORING_MARK_INSTRUCTION,
    _PY_MONITORING_MARK_MARKER,
    /* Not a DISABLE: the markers inserted here. */
    _PY_MONITORING_MARK_INSERTED,
    _PY_MONITORING_MARKS
};

/* What a code object knows of monitoring; allocated the first time it has
   local events or an instrumented instruction.  A coverage tool monitors
   all code, so what is per code unit is kept small: a byte, one more
   while LINE is active, and one per kind of mark made when first needed
   (3.12 keeps two with LINE, and two more per unit for several tools). */
typedef struct _PyCoMonitoringData {
    /* Per local event (_PY_MONITORING_LOCAL_INDEX), the tools that set it
       for this code. */
    uint8_t local[_PY_MONITORING_LOCAL_EVENT_COUNT];
    /* Per local event, the tools active for this code when it was last
       brought up to date: the global ones and the local ones. */
    uint8_t active[_PY_MONITORING_LOCAL_EVENT_COUNT];
    /* Markers in the code, at most _PY_MONITORING_MAX_MARKERS. */
    uint8_t markers;
    /* The interpreter's count of clears when the local events and marks
       here were last rid of those of cleared tools. */
    uint32_t clears;
    /* Per kind of mark, an array of a set of tools per code unit; made
       the first time there is such a mark here. */
    uint8_t **marks;
    /* The line of each code unit and where LINE is instrumented; made the
       first time LINE is active here (see instrumentation.c). */
    uint8_t *lines;
    /* Per code unit, the base opcode of the instruction it starts; CACHE
       on inline cache entries. */
    uint8_t base[1];
} _PyCoMonitoringData;

#define _PY_MONITORING_MAX_MARKERS 255

/* Tools written in C: the profilers, and sys.setprofile (tool 6).

   A user tool id (0-5) is claimed under a name, as use_tool_id() claims
   it; fails with ValueError if it is in use.  Release clears it, as
   free_tool_id() does. */
PyAPI_FUNC(int) _PyMonitoring_ClaimTool(PyInterpreterState *interp,
                                        int tool_id, const char *name);
PyAPI_FUNC(int) _PyMonitoring_IsToolClaimedAs(PyInterpreterState *interp,
                                              int tool_id, const char *name);
PyAPI_FUNC(int) _PyMonitoring_ReleaseTool(PyInterpreterState *interp,
                                          int tool_id);
/* Whether the callbacks of CALL, C_RETURN and C_RAISE of `tool_id` hear
   of calls of built-in functions and method descriptors only. */
PyAPI_FUNC(void) _PyMonitoring_SetBuiltinCallsOnly(
    PyInterpreterState *interp, int tool_id, int builtin_calls_only);
/* Sets or (func NULL) removes what tells the profiler of a thread. */
PyAPI_FUNC(void) _PyMonitoring_SetProfilerOf(
    PyInterpreterState *interp,
    PyObject *(*func)(void *arg, PyThreadState *tstate), void *arg);
/* The profiler of `tstate`, a borrowed reference, or NULL. */
extern PyObject *_PyMonitoring_ProfilerOf(PyThreadState *tstate);
/* Replaces the callback of `event` (an event number) for `tool_id`;
   func NULL removes it. */
PyAPI_FUNC(void) _PyMonitoring_SetNativeCallback(
    PyInterpreterState *interp, int tool_id, int event,
    _PyMonitoring_NativeCallback func, void *arg);
/* Events as sets of bits, as set_events() and set_local_events() take
   them; C_RETURN and C_RAISE come with CALL. */
PyAPI_FUNC(int) _PyMonitoring_SetToolEvents(PyInterpreterState *interp,
                                            int tool_id, uint32_t events);
PyAPI_FUNC(int) _PyMonitoring_SetToolLocalEvents(PyInterpreterState *interp,
                                                 int tool_id,
                                                 PyCodeObject *code,
                                                 uint32_t events);
/* Drops the events, global and local, and the callbacks of `tool_id`. */
PyAPI_FUNC(int) _PyMonitoring_ClearTool(PyInterpreterState *interp,
                                        int tool_id);

/* The profile function of `tstate` was set or removed; `had_one` tells
   whether it had one before. */
extern int _PyMonitoring_ProfileFunctionChanged(PyThreadState *tstate,
                                                int had_one);
/* A thread state with a profile function is cleared. */
extern void _PyMonitoring_ProfiledThreadGone(PyThreadState *tstate);

/* Set when an interpreter first changes its monitoring state: until then
   no code can be behind it, and the eval loop tests this flag alone. */
extern int _PyMonitoring_EverUsed;

/* sys.monitoring.DISABLE and MISSING (the arg0 of a call without
   arguments), of a type that only prints their names. */
extern PyTypeObject _PyMonitoring_Sentinel_Type;
typedef struct {
    PyObject_HEAD
    const char *name;
} _PyMonitoringSentinel;
PyAPI_DATA(_PyMonitoringSentinel) _PyMonitoring_Missing;
#define _PyMonitoring_MISSING ((PyObject *)&_PyMonitoring_Missing)

/* The sys.monitoring module object, for sys. */
extern PyObject *_PyMonitoring_InitModule(void);
extern void _PyMonitoring_Clear(PyInterpreterState *interp);
extern void _PyMonitoring_FreeCodeData(PyCodeObject *code);
#ifdef Py_TRACK_MEMORY
/* What the allocator reserved for a code object's monitoring data. */
PyAPI_FUNC(size_t) _PyMonitoring_CodeDataBytes(PyCodeObject *code);
#endif

#define _PyMonitoring_CodeIsBehind(tstate, code) \
    (_PyMonitoring_EverUsed \
     && (code)->_co_monitoring_version \
        != (tstate)->interp->monitoring.version)

/* Bring code up to date with the interpreter's monitoring state. */
extern int _PyMonitoring_Instrument(PyCodeObject *code,
                                    PyInterpreterState *interp);

/* Deliver the event of the instrumented instruction at `instr`. */
extern int _PyMonitoring_FireResume(PyThreadState *tstate,
                                    struct _PyInterpreterFrame *frame,
                                    _Py_CODEUNIT *instr);
extern int _PyMonitoring_FireReturn(PyThreadState *tstate,
                                    struct _PyInterpreterFrame *frame,
                                    _Py_CODEUNIT *instr, PyObject *retval);
/* Whether `callable` is what 3.11 told profile functions of as a C call:
   a built-in function or method, or a method descriptor.  The most
   frequent callables are told from the rest by their type alone. */
static inline int
_PyMonitoring_IsBuiltinCallable(PyObject *callable)
{
    PyTypeObject *type = Py_TYPE(callable);
    if (type == &PyFunction_Type) {
        return 0;
    }
    if (type == &PyCFunction_Type || type == &PyCMethod_Type
        || type == &PyMethodDescr_Type)
    {
        return 1;
    }
    return type != &PyType_Type && type != &PyMethod_Type
           && PyCFunction_Check(callable);
}

/* Whether some tool may want to hear of a call of `callable`: tested
   inline before CALL, since a profiler wants the calls of built-in
   functions only (builtin_calls_only), and most calls are of others. */
#define _PyMonitoring_CallMayBeWanted(tstate, callable) \
    (((tstate)->interp->monitoring.global[_PY_MONITORING_EVENT_CALL] \
      & ~(tstate)->interp->monitoring.builtin_calls_only) \
     || ((tstate)->interp->monitoring.local_union \
         & (1 << _PY_MONITORING_EVENT_CALL)) \
     || _PyMonitoring_IsBuiltinCallable(callable))

/* CALL, at `instr`: the CALL_FUNCTION_EX, or for a PRECALL the unit
   after its cache (the CALL, or the EXTENDED_ARGs before it). */
extern int _PyMonitoring_FireCall(PyThreadState *tstate,
                                  struct _PyInterpreterFrame *frame,
                                  _Py_CODEUNIT *instr, PyObject *callable,
                                  PyObject *arg0);
/* C_RETURN, or C_RAISE with the exception set, after a call of a callable
   that is not a Python function; returns `res`, or NULL when a callback
   raised. */
extern PyObject *_PyMonitoring_FireCallResult(
    PyThreadState *tstate, struct _PyInterpreterFrame *frame,
    _Py_CODEUNIT *instr, PyObject *callable, PyObject *arg0, PyObject *res);

/* The call of a built-in at a PRECALL whose CALL, `call`, is watched, in
   place of the two instructions: tells CALL, makes the call into *res and
   tells its result.  Returns 1 then (*res NULL with an exception set when
   the call or a callback raised), -1 when CALL's callback raised, and 0
   when that callback changed what watches the CALL: CALL is to run. */
extern int _PyMonitoring_CallBuiltin(
    PyThreadState *tstate, struct _PyInterpreterFrame *frame,
    _Py_CODEUNIT *call, PyObject *callable, PyObject *const *args,
    size_t nargsf, PyObject *kwnames, PyObject **res);

/* Events of the exception paths (PY_THROW, RAISE, RERAISE, PY_UNWIND),
   the exception set.  Return -1 when a callback raised, its exception
   replacing the one being propagated. */
extern int _PyMonitoring_FireException(PyThreadState *tstate, int event,
                                       struct _PyInterpreterFrame *frame,
                                       _Py_CODEUNIT *instr);
/* The handler that `instr` starts got the exception in *handled; a
   callback's exception takes its place there. */
extern void _PyMonitoring_FireHandled(PyThreadState *tstate,
                                      struct _PyInterpreterFrame *frame,
                                      _Py_CODEUNIT *instr,
                                      PyObject **handled);
/* A generator's frame is entered by throw(): bring its code up to date and
   deliver PY_THROW.  A failure replaces the thrown exception. */
extern void _PyMonitoring_EnterThrow(PyThreadState *tstate,
                                     struct _PyInterpreterFrame *frame);
/* A for loop's iterator `iter` is exhausted, its StopIteration set or not:
   STOP_ITERATION for a generator, RAISE for a StopIteration raised by
   another iterator. */
extern int _PyMonitoring_FireIteratorEnd(PyThreadState *tstate,
                                         struct _PyInterpreterFrame *frame,
                                         _Py_CODEUNIT *instr, PyObject *iter);
/* A generator or coroutine returned `value` to a yield from or an await. */
extern int _PyMonitoring_FireStopIteration(PyThreadState *tstate,
                                           struct _PyInterpreterFrame *frame,
                                           _Py_CODEUNIT *instr,
                                           PyObject *value);

/* Whether a tool has `event` set for all code. */
#define _PyMonitoring_IsActive(tstate, event) \
    (_PyMonitoring_EverUsed \
     && (tstate)->interp->monitoring.global[(event)] != 0)

/* An exception-path event where the eval loop is: tested inline, so that
   the path pays a load and a test while no tool has it.  A callback's
   exception simply takes over the propagation. */
#define _PyMonitoring_NoteException(tstate, event, frame, instr) \
    do { \
        if (_PyMonitoring_IsActive((tstate), (event))) { \
            (void)_PyMonitoring_FireException((tstate), (event), (frame), \
                                              (instr)); \
        } \
    } while (0)

/* Whether STOP_ITERATION may be wanted anywhere: globally, or locally by
   some code (then the code's sites tell). */
#define _PyMonitoring_StopIterationWanted(interp) \
    (_PyMonitoring_EverUsed \
     && ((interp)->monitoring.global[_PY_MONITORING_EVENT_STOP_ITERATION] \
         || ((interp)->monitoring.local_union \
             >> _PY_MONITORING_EVENT_STOP_ITERATION) & 1))
#define _PyMonitoring_IteratorEndWanted(tstate) \
    (_PyMonitoring_StopIterationWanted((tstate)->interp) \
     || _PyMonitoring_IsActive((tstate), _PY_MONITORING_EVENT_RAISE))

/* Where a trace function runs the unspecialized form of an instruction,
   an instrumented one stays itself, to deliver its event. */
#define _PyMonitoring_IsInstrumentedOpcode(op) \
    ((op) == INSTRUMENTED_RESUME || (op) == INSTRUMENTED_RETURN_VALUE \
     || (op) == INSTRUMENTED_YIELD_VALUE || (op) == INSTRUMENTED_PRECALL \
     || (op) == INSTRUMENTED_CALL || (op) == INSTRUMENTED_CALL_FUNCTION_EX \
     || (op) == INSTRUMENTED_INSTRUCTION || (op) == INSTRUMENTED_JUMP)
#define _PyMonitoring_TracingOpcode(op) \
    (_PyMonitoring_IsInstrumentedOpcode(op) ? (op) : _PyOpcode_Deopt[(op)])

/* The base opcode of unit `i` of `code`, whose opcode is `op`: what
   co_code shows there. */
#define _PyMonitoring_Deopt(code, i, op) \
    ((op) == INSTRUMENTED_INSTRUCTION || (op) == INSTRUMENTED_JUMP \
     ? (code)->_co_monitoring->base[(i)] : _PyOpcode_Deopt[(op)])

/* Before an instruction on INSTRUMENTED_INSTRUCTION: delivers MARKER,
   LINE and INSTRUCTION there, in 3.12's order.  Returns the opcode to run
   now, or -1 when a callback raised.  frame->prev_instr is the instruction
   run before, and is left at `instr`, unless a LINE callback set
   f_lineno: then it is the instruction to go on with. */
extern int _PyMonitoring_FireInstruction(PyThreadState *tstate,
                                         struct _PyInterpreterFrame *frame,
                                         _Py_CODEUNIT *instr);
/* The base opcode of the INSTRUMENTED_JUMP at `instr`. */
extern int _PyMonitoring_JumpOpcode(struct _PyInterpreterFrame *frame,
                                    _Py_CODEUNIT *instr);
/* The jump at `instr` goes to `dest`: JUMP, or BRANCH and BRANCH_LEFT or
   BRANCH_RIGHT.  An exception that is set stays set. */
extern int _PyMonitoring_FireJump(PyThreadState *tstate,
                                  struct _PyInterpreterFrame *frame,
                                  _Py_CODEUNIT *instr, _Py_CODEUNIT *dest);
/* The INSTRUMENTED_JUMP at `instr` (not FOR_ITER) decides on *cond, the
   top of the stack, and tells where it goes; returns whether it jumps, or
   -1.  For a POP_JUMP_*_IF_TRUE/FALSE, a condition that is no bool is
   replaced by its truth, so that the jump does not ask it again. */
extern int _PyMonitoring_DecideJump(PyThreadState *tstate,
                                    struct _PyInterpreterFrame *frame,
                                    _Py_CODEUNIT *instr, int oparg,
                                    PyObject **cond);
/* Whether a branch event may be wanted anywhere.  An async for's branch
   is not instrumented: its SEND and END_ASYNC_FOR check this first. */
#define _PY_MONITORING_BRANCH_EVENTS \
    (1 << _PY_MONITORING_EVENT_BRANCH \
     | 1 << _PY_MONITORING_EVENT_BRANCH_LEFT \
     | 1 << _PY_MONITORING_EVENT_BRANCH_RIGHT)
#define _PyMonitoring_BranchWanted(interp) \
    (_PyMonitoring_EverUsed \
     && (((interp)->monitoring.local_union & _PY_MONITORING_BRANCH_EVENTS) \
         || (interp)->monitoring.global[_PY_MONITORING_EVENT_BRANCH] \
         || (interp)->monitoring.global[_PY_MONITORING_EVENT_BRANCH_LEFT] \
         || (interp)->monitoring.global[_PY_MONITORING_EVENT_BRANCH_RIGHT]))
/* The SEND at `instr`, which jumps by `oparg` when it completes, got an
   item: if it is an async for's, its loop goes on (BRANCH, BRANCH_LEFT). */
extern int _PyMonitoring_FireAsyncForNext(PyThreadState *tstate,
                                          struct _PyInterpreterFrame *frame,
                                          _Py_CODEUNIT *instr, int oparg);
/* The async for of the END_ASYNC_FOR at `instr` ends (BRANCH,
   BRANCH_RIGHT, told at the loop's SEND). */
extern int _PyMonitoring_FireAsyncForEnd(PyThreadState *tstate,
                                         struct _PyInterpreterFrame *frame,
                                         _Py_CODEUNIT *instr);
/* Whether f_lineno may be set now: from a LINE callback for `frame`. */
#define _PyMonitoring_InLineCallback(tstate, frame) \
    ((tstate)->monitoring_line_frame == (frame))

#ifdef __cplusplus
}
#endif
#endif  /* !Py_INTERNAL_MONITORING_H */
