/* sys.monitoring (PEP 669): tools, events and callbacks, and the
   instrumentation of quickened bytecode that delivers the events.

   The design is described in Include/internal/pycore_monitoring.h. */

#include "Python.h"
#include "pycore_code.h"          // _PyCode_Quicken()
#include "pycore_frame.h"         // _PyInterpreterFrame
#include "pycore_memtrack.h"      // _PyMem_OwnedCalloc()
#include "pycore_monitoring.h"
#include "pycore_namespace.h"     // _PyNamespace_New()
#include "pycore_opcode.h"        // _PyOpcode_Deopt, _PyOpcode_Caches
#include "pycore_pyerrors.h"      // _PyErr_Fetch()
#include "pycore_pystate.h"       // _PyThreadState_GET()

#define EVENT(name) _PY_MONITORING_EVENT_##name
#define IS_LOCAL(event) ((_PY_MONITORING_LOCAL_EVENTS >> (event)) & 1)
#define ALL_EVENTS ((1 << _PY_MONITORING_EVENTS) - 1)
#define C_CALL_EVENTS \
    (1 << EVENT(CALL) | 1 << EVENT(C_RETURN) | 1 << EVENT(C_RAISE))
/* The events of single instructions, lines and branches, not delivered
   yet: setting them is refused rather than silently ignored. */
#define UNDELIVERED_EVENTS \
    (1 << EVENT(LINE) | 1 << EVENT(INSTRUCTION) | 1 << EVENT(JUMP) \
     | 1 << EVENT(BRANCH) | 1 << EVENT(BRANCH_LEFT) \
     | 1 << EVENT(BRANCH_RIGHT) | 1 << EVENT(MARKER))

static const char *const event_names[_PY_MONITORING_EVENTS] = {
    [EVENT(PY_START)] = "PY_START",
    [EVENT(PY_RESUME)] = "PY_RESUME",
    [EVENT(PY_RETURN)] = "PY_RETURN",
    [EVENT(PY_YIELD)] = "PY_YIELD",
    [EVENT(CALL)] = "CALL",
    [EVENT(LINE)] = "LINE",
    [EVENT(INSTRUCTION)] = "INSTRUCTION",
    [EVENT(JUMP)] = "JUMP",
    [EVENT(BRANCH)] = "BRANCH",
    [EVENT(STOP_ITERATION)] = "STOP_ITERATION",
    [EVENT(RAISE)] = "RAISE",
    [EVENT(EXCEPTION_HANDLED)] = "EXCEPTION_HANDLED",
    [EVENT(PY_UNWIND)] = "PY_UNWIND",
    [EVENT(PY_THROW)] = "PY_THROW",
    [EVENT(RERAISE)] = "RERAISE",
    [EVENT(C_RETURN)] = "C_RETURN",
    [EVENT(C_RAISE)] = "C_RAISE",
    [EVENT(BRANCH_LEFT)] = "BRANCH_LEFT",
    [EVENT(BRANCH_RIGHT)] = "BRANCH_RIGHT",
    [EVENT(MARKER)] = "MARKER",
};


/* DISABLE and MISSING: two sentinels that print as their names. */

static PyObject *
sentinel_repr(_PyMonitoringSentinel *self)
{
    return PyUnicode_FromFormat("<sys.monitoring.%s>", self->name);
}

static PyTypeObject sentinel_type = {
    PyVarObject_HEAD_INIT(&PyType_Type, 0)
    .tp_name = "sys.monitoring._Sentinel",
    .tp_basicsize = sizeof(_PyMonitoringSentinel),
    .tp_repr = (reprfunc)sentinel_repr,
    .tp_flags = Py_TPFLAGS_DEFAULT,
};

static _PyMonitoringSentinel disable_sentinel = {
    PyObject_HEAD_INIT(&sentinel_type)
    "DISABLE"
};
_PyMonitoringSentinel _PyMonitoring_Missing = {
    PyObject_HEAD_INIT(&sentinel_type)
    "MISSING"
};
#define DISABLE ((PyObject *)&disable_sentinel)
#define MISSING _PyMonitoring_MISSING


/* Instrumentation of the bytecode */

/* The event delivered where the instruction with base opcode `base` is
   (for a call: at its CALL or CALL_FUNCTION_EX), or -1. */
static int
site_event(int base, int oparg)
{
    switch (base) {
        case RESUME:
            return oparg == 0 ? EVENT(PY_START) : EVENT(PY_RESUME);
        case RETURN_VALUE:
            return EVENT(PY_RETURN);
        case YIELD_VALUE:
            return EVENT(PY_YIELD);
        case CALL:
        case CALL_FUNCTION_EX:
            return EVENT(CALL);
        case FOR_ITER:
        case SEND:
            return EVENT(STOP_ITERATION);
        default:
            return -1;
    }
}

/* An adaptive instruction taken back from its instrumented form starts to
   learn again. */
static void
set_adaptive(_Py_CODEUNIT *instr, int adaptive)
{
    _Py_SET_OPCODE(*instr, adaptive);
    instr[1] = adaptive_counter_start();
}

/* The CALL that belongs to the PRECALL at `precall`. */
static int
call_of_precall(PyCodeObject *code, int precall)
{
    _Py_CODEUNIT *instrs = _PyCode_CODE(code);
    int i = precall + 1 + INLINE_CACHE_ENTRIES_PRECALL;
    while (_PyOpcode_Deopt[_Py_OPCODE(instrs[i])] == EXTENDED_ARG) {
        i++;
    }
    assert(_PyOpcode_Deopt[_Py_OPCODE(instrs[i])] == CALL);
    return i;
}

/* The PRECALL that belongs to the CALL at `call`: the last one before it,
   found from the start since inline caches can't be read backwards. */
static int
precall_of_call(PyCodeObject *code, int call)
{
    _Py_CODEUNIT *instrs = _PyCode_CODE(code);
    int precall = -1;
    for (int i = 0; i < call; i++) {
        int base = _PyOpcode_Deopt[_Py_OPCODE(instrs[i])];
        if (base == PRECALL) {
            precall = i;
        }
        i += _PyOpcode_Caches[base];
    }
    assert(precall >= 0);
    return precall;
}

/* Put the site at `i` (of instruction `base`) into its instrumented form
   or take it out.  Sites that are not instrumented keep whatever
   specialized form they have. */
static void
set_site(PyCodeObject *code, int i, int base, int precall, int on)
{
    _Py_CODEUNIT *instrs = _PyCode_CODE(code);
    if (_PyMonitoring_IsInstrumentedOpcode(_Py_OPCODE(instrs[i])) == on) {
        return;
    }
    switch (base) {
        case FOR_ITER:
        case SEND:
            /* STOP_ITERATION is looked for where the loop or the yield from
               ends, never instrumented. */
            break;
        case RESUME:
            _Py_SET_OPCODE(instrs[i], on ? INSTRUMENTED_RESUME : RESUME_QUICK);
            break;
        case RETURN_VALUE:
            _Py_SET_OPCODE(instrs[i],
                           on ? INSTRUMENTED_RETURN_VALUE : RETURN_VALUE);
            break;
        case YIELD_VALUE:
            _Py_SET_OPCODE(instrs[i],
                           on ? INSTRUMENTED_YIELD_VALUE : YIELD_VALUE);
            break;
        case CALL_FUNCTION_EX:
            _Py_SET_OPCODE(instrs[i], on ? INSTRUMENTED_CALL_FUNCTION_EX
                                         : CALL_FUNCTION_EX);
            break;
        case CALL:
            /* Specialized PRECALLs make calls themselves, so both halves of
               a call are instrumented: PRECALL delivers CALL, and CALL
               delivers C_RETURN and C_RAISE. */
            if (on) {
                _Py_SET_OPCODE(instrs[precall], INSTRUMENTED_PRECALL);
                _Py_SET_OPCODE(instrs[i], INSTRUMENTED_CALL);
            }
            else {
                set_adaptive(&instrs[precall], PRECALL_ADAPTIVE);
                set_adaptive(&instrs[i], CALL_ADAPTIVE);
            }
            break;
        default:
            Py_UNREACHABLE();
    }
}

/* The local events `tool` has in the code of `data`: none once the tool
   has been freed or cleared since it set them. */
static uint32_t
local_events(PyInterpreterState *interp, _PyCoMonitoringData *data, int tool)
{
    if (data == NULL
        || data->local_epoch[tool] != interp->monitoring.tool_epoch[tool])
    {
        return 0;
    }
    return data->local_events[tool];
}

static uint8_t
local_tools(PyInterpreterState *interp, _PyCoMonitoringData *data, int event)
{
    uint8_t tools = 0;
    for (int tool = 0; tool < _PY_MONITORING_TOOL_IDS; tool++) {
        if ((local_events(interp, data, tool) >> event) & 1) {
            tools |= 1 << tool;
        }
    }
    return tools;
}

static _PyCoMonitoringData *
code_data(PyCodeObject *code)
{
    if (code->_co_monitoring == NULL) {
        size_t size = offsetof(_PyCoMonitoringData, site_disabled)
                      + (size_t)Py_SIZE(code);
        code->_co_monitoring = _PyMem_OwnedCalloc(&PyCode_Type, 1, size);
        if (code->_co_monitoring == NULL) {
            PyErr_NoMemory();
        }
    }
    return code->_co_monitoring;
}

void
_PyMonitoring_FreeCodeData(PyCodeObject *code)
{
    if (code->_co_monitoring != NULL) {
        _PyMem_OwnedFree(&PyCode_Type, code->_co_monitoring);
        code->_co_monitoring = NULL;
    }
    code->_co_monitoring_version = 0;
}

int
_PyMonitoring_Instrument(PyCodeObject *code, PyInterpreterState *interp)
{
    struct _Py_monitoring_state *state = &interp->monitoring;
    if (code->_co_monitoring_version == state->version) {
        return 0;
    }
    uint8_t active[_PY_MONITORING_EVENTS] = {0};
    int any = 0;
    for (int event = 0; event < _PY_MONITORING_EVENTS; event++) {
        if (IS_LOCAL(event)) {
            active[event] = state->global[event]
                            | local_tools(interp, code->_co_monitoring, event);
            any |= active[event];
        }
    }
    if (!any && code->_co_monitoring == NULL) {
        code->_co_monitoring_version = state->version;
        return 0;
    }
    _PyCoMonitoringData *data = code_data(code);
    if (data == NULL) {
        return -1;
    }
    /* Instrumented forms replace quickened ones: quicken first, so that
       warming up never overwrites them. */
    if (code->co_warmup != 0) {
        code->co_warmup = 0;
        _PyCode_Quicken(code);
    }
    /* DISABLE marks last until restart_events(), or until their tool is
       freed or cleared. */
    uint8_t stale = 0;
    for (int tool = 0; tool < _PY_MONITORING_TOOL_IDS; tool++) {
        if (data->disabled_epoch[tool] != state->tool_epoch[tool]) {
            data->disabled_epoch[tool] = state->tool_epoch[tool];
            stale |= 1 << tool;
        }
    }
    if (code->_co_monitoring_version < state->restart_version) {
        stale = 0xff;
    }
    _Py_CODEUNIT *instrs = _PyCode_CODE(code);
    int precall = -1;
    for (int i = 0; i < Py_SIZE(code); i++) {
        int base = _PyOpcode_Deopt[_Py_OPCODE(instrs[i])];
        if (base == PRECALL) {
            precall = i;
        }
        int event = site_event(base, _Py_OPARG(instrs[i]));
        if (event >= 0) {
            data->site_disabled[i] &= ~stale;
            set_site(code, i, base, precall,
                     (active[event] & ~data->site_disabled[i]) != 0);
        }
        i += _PyOpcode_Caches[base];
    }
    memcpy(data->active, active, sizeof(active));
    code->_co_monitoring_version = state->version;
    return 0;
}

int _PyMonitoring_EverUsed = 0;

/* After a change: the code of every executing frame is brought up to date
   now, the rest of the code when it next runs. */
static int
instrument_executing_code(PyInterpreterState *interp)
{
    _PyMonitoring_EverUsed = 1;
    interp->monitoring.version++;
    for (PyThreadState *ts = PyInterpreterState_ThreadHead(interp);
         ts != NULL; ts = PyThreadState_Next(ts))
    {
        for (_PyInterpreterFrame *frame = ts->cframe->current_frame;
             frame != NULL; frame = frame->previous)
        {
            if (_PyMonitoring_Instrument(frame->f_code, interp) < 0) {
                return -1;
            }
        }
    }
    return 0;
}

static void
disable_site(PyCodeObject *code, int site, int event, int tool)
{
    _PyCoMonitoringData *data = code->_co_monitoring;
    assert(data != NULL);
    data->site_disabled[site] |= 1 << tool;
    if ((data->active[event] & ~data->site_disabled[site]) == 0) {
        _Py_CODEUNIT *instrs = _PyCode_CODE(code);
        int base = _PyOpcode_Deopt[_Py_OPCODE(instrs[site])];
        int precall = base == CALL ? precall_of_call(code, site) : -1;
        set_site(code, site, base, precall, 0);
    }
}


/* Delivery */

/* The tools to tell of `event` at `site`. */
static uint8_t
site_tools(PyCodeObject *code, int site, int event)
{
    _PyCoMonitoringData *data = code->_co_monitoring;
    if (data == NULL) {
        return 0;
    }
    return data->active[event] & ~data->site_disabled[site];
}

/* Calls the `event` callbacks of `tools`, lowest tool id first, with the
   code, the offset of `site` and the event's own arguments.  A tool's
   callback and what it calls raise no events for that tool, and none for
   sys.settrace() and sys.setprofile() functions, which in 3.11 never see
   the code of a hook. */
static int
deliver(PyThreadState *tstate, PyCodeObject *code, int site, int event,
        uint8_t tools, PyObject *arg1, PyObject *arg2)
{
    tools &= ~tstate->monitoring_tools_in_callback;
    if (tools == 0) {
        return 0;
    }
    PyObject *offset = PyLong_FromLong(
        site < 0 ? 0 : site * (long)sizeof(_Py_CODEUNIT));
    if (offset == NULL) {
        return -1;
    }
    PyObject *args[5] = {NULL, (PyObject *)code, offset, arg1, arg2};
    size_t nargs = 2 + (arg1 != NULL) + (arg2 != NULL);
    struct _Py_monitoring_state *state = &tstate->interp->monitoring;
    int err = 0;
    for (int tool = 0; tool < _PY_MONITORING_TOOL_IDS; tool++) {
        if (!((tools >> tool) & 1)) {
            continue;
        }
        /* Looked up anew each time: an earlier callback may have changed
           or removed it. */
        PyObject *callback = state->callbacks[tool][event];
        if (callback == NULL) {
            continue;
        }
        Py_INCREF(callback);
        uint8_t outer = tstate->monitoring_tools_in_callback;
        tstate->monitoring_tools_in_callback = outer | (1 << tool);
        PyThreadState_EnterTracing(tstate);
        PyObject *res = PyObject_Vectorcall(
            callback, args + 1, nargs | PY_VECTORCALL_ARGUMENTS_OFFSET, NULL);
        PyThreadState_LeaveTracing(tstate);
        tstate->monitoring_tools_in_callback = outer;
        Py_DECREF(callback);
        if (res == NULL) {
            err = -1;
            break;
        }
        if (res == DISABLE) {
            if (!IS_LOCAL(event)) {
                /* As upstream does: the callback goes, so that an event
                   that cannot be disabled does not raise again and again. */
                Py_DECREF(res);
                Py_CLEAR(state->callbacks[tool][event]);
                PyErr_Format(PyExc_ValueError,
                             "Cannot disable %s events. Callback removed.",
                             event_names[event]);
                err = -1;
                break;
            }
            disable_site(code, site, event, tool);
        }
        Py_DECREF(res);
    }
    Py_DECREF(offset);
    return err;
}

static int
instr_index(_PyInterpreterFrame *frame, _Py_CODEUNIT *instr)
{
    return (int)(instr - _PyCode_CODE(frame->f_code));
}

int
_PyMonitoring_FireResume(PyThreadState *tstate, _PyInterpreterFrame *frame,
                         _Py_CODEUNIT *instr)
{
    int site = instr_index(frame, instr);
    int event = _Py_OPARG(*instr) == 0 ? EVENT(PY_START) : EVENT(PY_RESUME);
    return deliver(tstate, frame->f_code, site, event,
                   site_tools(frame->f_code, site, event), NULL, NULL);
}

int
_PyMonitoring_FireReturn(PyThreadState *tstate, _PyInterpreterFrame *frame,
                         _Py_CODEUNIT *instr, PyObject *retval)
{
    int site = instr_index(frame, instr);
    int event = _PyOpcode_Deopt[_Py_OPCODE(*instr)] == YIELD_VALUE
                ? EVENT(PY_YIELD) : EVENT(PY_RETURN);
    return deliver(tstate, frame->f_code, site, event,
                   site_tools(frame->f_code, site, event), retval, NULL);
}

int
_PyMonitoring_FireCall(PyThreadState *tstate, _PyInterpreterFrame *frame,
                       _Py_CODEUNIT *instr, PyObject *callable, PyObject *arg0)
{
    int site = instr_index(frame, instr);
    if (_PyOpcode_Deopt[_Py_OPCODE(*instr)] == PRECALL) {
        site = call_of_precall(frame->f_code, site);
    }
    return deliver(tstate, frame->f_code, site, EVENT(CALL),
                   site_tools(frame->f_code, site, EVENT(CALL)),
                   callable, arg0);
}

/* Delivers `event` while an exception propagates: the exception is
   fetched meanwhile, and is the event's argument where `arg1` is NULL.  A
   callback's exception replaces it. */
static int
deliver_during_exception(PyThreadState *tstate, PyCodeObject *code, int site,
                         int event, uint8_t tools, PyObject *arg1,
                         PyObject *arg2)
{
    if ((tools & ~tstate->monitoring_tools_in_callback) == 0) {
        return 0;
    }
    PyObject *type, *value, *tb;
    _PyErr_Fetch(tstate, &type, &value, &tb);
    /* Callbacks get an exception object, which a C function may not have
       made yet.  Where making it fails, the interpreter will fail the same
       way later; until then the exception stays as it was, so that its
       traceback comes out as without monitoring. */
    PyObject *ntype = Py_XNewRef(type), *exc = Py_XNewRef(value);
    PyObject *ntb = Py_XNewRef(tb);
    _PyErr_NormalizeException(tstate, &ntype, &exc, &ntb);
    if (ntype == type) {
        if (ntb != NULL) {
            PyException_SetTraceback(exc, ntb);
        }
        Py_XSETREF(value, Py_NewRef(exc));
    }
    Py_XDECREF(ntype);
    Py_XDECREF(ntb);
    int err = exc == NULL ? 0 : deliver(tstate, code, site, event, tools,
                                        arg1 != NULL ? arg1 : exc, arg2);
    Py_XDECREF(exc);
    if (err == 0) {
        _PyErr_Restore(tstate, type, value, tb);
    }
    else {
        Py_XDECREF(type);
        Py_XDECREF(value);
        Py_XDECREF(tb);
    }
    return err;
}

PyObject *
_PyMonitoring_FireCallResult(PyThreadState *tstate, _PyInterpreterFrame *frame,
                             _Py_CODEUNIT *instr, PyObject *callable,
                             PyObject *arg0, PyObject *res)
{
    PyCodeObject *code = frame->f_code;
    int site = instr_index(frame, instr);
    int event = res != NULL ? EVENT(C_RETURN) : EVENT(C_RAISE);
    /* Upstream's rule: the tools that have CALL here hear of the result,
       if they have a callback for it. */
    uint8_t tools = site_tools(code, site, EVENT(CALL));
    if (res != NULL) {
        if (deliver(tstate, code, site, event, tools, callable, arg0) < 0) {
            Py_CLEAR(res);
        }
        return res;
    }
    (void)deliver_during_exception(tstate, code, site, event, tools,
                                   callable, arg0);
    return NULL;
}

int
_PyMonitoring_FireException(PyThreadState *tstate, int event,
                            _PyInterpreterFrame *frame, _Py_CODEUNIT *instr)
{
    assert(!IS_LOCAL(event));
    uint8_t tools = tstate->interp->monitoring.global[event];
    return deliver_during_exception(tstate, frame->f_code,
                                    instr_index(frame, instr), event, tools,
                                    NULL, NULL);
}

void
_PyMonitoring_FireHandled(PyThreadState *tstate, _PyInterpreterFrame *frame,
                          _Py_CODEUNIT *instr, PyObject **handled)
{
    uint8_t tools = tstate->interp->monitoring.global[
        EVENT(EXCEPTION_HANDLED)];
    if (deliver(tstate, frame->f_code, instr_index(frame, instr),
                EVENT(EXCEPTION_HANDLED), tools, *handled, NULL) == 0)
    {
        return;
    }
    PyObject *type, *exc, *tb;
    _PyErr_Fetch(tstate, &type, &exc, &tb);
    _PyErr_NormalizeException(tstate, &type, &exc, &tb);
    PyException_SetTraceback(exc, tb != NULL ? tb : Py_None);
    Py_XDECREF(type);
    Py_XDECREF(tb);
    Py_SETREF(*handled, exc);
}

void
_PyMonitoring_EnterThrow(PyThreadState *tstate, _PyInterpreterFrame *frame)
{
    PyObject *type, *exc, *tb;
    _PyErr_Fetch(tstate, &type, &exc, &tb);
    if (_PyMonitoring_Instrument(frame->f_code, tstate->interp) < 0) {
        Py_XDECREF(type);
        Py_XDECREF(exc);
        Py_XDECREF(tb);
        return;
    }
    _PyErr_Restore(tstate, type, exc, tb);
    (void)_PyMonitoring_FireException(tstate, EVENT(PY_THROW), frame,
                                      frame->prev_instr + 1);
}

int
_PyMonitoring_FireIteratorEnd(PyThreadState *tstate,
                              _PyInterpreterFrame *frame,
                              _Py_CODEUNIT *instr, PyObject *iter)
{
    if (PyGen_Check(iter)) {
        if (!_PyMonitoring_StopIterationWanted(tstate->interp)) {
            return 0;
        }
        return _PyMonitoring_FireStopIteration(
            tstate, frame, instr, _PyErr_Occurred(tstate) ? NULL : Py_None);
    }
    if (_PyErr_Occurred(tstate)) {
        return _PyMonitoring_FireException(tstate, EVENT(RAISE), frame,
                                           instr);
    }
    return 0;
}

int
_PyMonitoring_FireStopIteration(PyThreadState *tstate,
                                _PyInterpreterFrame *frame,
                                _Py_CODEUNIT *instr, PyObject *value)
{
    PyCodeObject *code = frame->f_code;
    if (_PyMonitoring_Instrument(code, tstate->interp) < 0) {
        return -1;
    }
    int site = instr_index(frame, instr);
    uint8_t tools = site_tools(code, site, EVENT(STOP_ITERATION));
    if ((tools & ~tstate->monitoring_tools_in_callback) == 0) {
        return 0;
    }
    if (value == NULL) {
        /* The generator's StopIteration is set. */
        return deliver_during_exception(tstate, code, site,
                                        EVENT(STOP_ITERATION), tools, NULL,
                                        NULL);
    }
    PyObject *exc = Py_IsNone(value)
                    ? PyObject_CallNoArgs(PyExc_StopIteration)
                    : PyObject_CallOneArg(PyExc_StopIteration, value);
    if (exc == NULL) {
        return -1;
    }
    int err = deliver(tstate, code, site, EVENT(STOP_ITERATION), tools, exc,
                      NULL);
    Py_DECREF(exc);
    return err;
}


/* The sys.monitoring module */

/*[clinic input]
module monitoring
[clinic start generated code]*/
/*[clinic end generated code: output=da39a3ee5e6b4b0d input=37257f5987a360cf]*/

#include "clinic/instrumentation.c.h"

static int
check_tool(PyInterpreterState *interp, int tool_id, int in_use)
{
    if (tool_id < 0 || tool_id >= _PY_MONITORING_USER_TOOL_IDS) {
        PyErr_Format(PyExc_ValueError,
                     "invalid tool %d (must be between 0 and %d)",
                     tool_id, _PY_MONITORING_USER_TOOL_IDS - 1);
        return -1;
    }
    if (in_use && interp->monitoring.tool_names[tool_id] == NULL) {
        PyErr_Format(PyExc_ValueError, "tool %d is not in use", tool_id);
        return -1;
    }
    return 0;
}

/* The event set to store for `event_set`, or -1.  As in upstream,
   C_RETURN and C_RAISE come only with CALL, and are then implied by it:
   whoever has CALL at a call hears of its result. */
static int
check_event_set(int event_set)
{
    if (event_set < 0 || event_set > ALL_EVENTS) {
        PyErr_Format(PyExc_ValueError, "invalid event set 0x%x",
                     (unsigned int)event_set);
        return -1;
    }
    int results = 1 << EVENT(C_RETURN) | 1 << EVENT(C_RAISE);
    if (event_set & results) {
        if ((event_set & C_CALL_EVENTS) != C_CALL_EVENTS) {
            PyErr_SetString(
                PyExc_ValueError,
                "cannot set C_RETURN or C_RAISE events independently");
            return -1;
        }
        event_set &= ~results;
    }
    if (event_set & UNDELIVERED_EVENTS) {
        PyErr_SetString(PyExc_NotImplementedError,
                        "LINE, INSTRUCTION, JUMP, BRANCH, BRANCH_LEFT, "
                        "BRANCH_RIGHT and MARKER events are not delivered "
                        "yet");
        return -1;
    }
    return event_set;
}

static uint32_t
get_global_events(PyInterpreterState *interp, int tool_id)
{
    uint32_t events = 0;
    for (int event = 0; event < _PY_MONITORING_EVENTS; event++) {
        if ((interp->monitoring.global[event] >> tool_id) & 1) {
            events |= 1u << event;
        }
    }
    return events;
}

static int
set_global_events(PyInterpreterState *interp, int tool_id, uint32_t events)
{
    if (get_global_events(interp, tool_id) == events) {
        return 0;
    }
    for (int event = 0; event < _PY_MONITORING_EVENTS; event++) {
        uint8_t *tools = &interp->monitoring.global[event];
        if ((events >> event) & 1) {
            *tools |= 1 << tool_id;
        }
        else {
            *tools &= ~(1 << tool_id);
        }
    }
    return instrument_executing_code(interp);
}

/* Drops what a tool has: its events, global and local, and callbacks. */
static int
clear_tool(PyInterpreterState *interp, int tool_id)
{
    struct _Py_monitoring_state *state = &interp->monitoring;
    for (int event = 0; event < _PY_MONITORING_EVENTS; event++) {
        Py_CLEAR(state->callbacks[tool_id][event]);
        state->global[event] &= ~(1 << tool_id);
    }
    state->tool_epoch[tool_id]++;
    return instrument_executing_code(interp);
}

/*[clinic input]
monitoring.use_tool_id

    tool_id: int
    name: object
    /

Claim tool_id for the tool called name.
[clinic start generated code]*/

static PyObject *
monitoring_use_tool_id_impl(PyObject *module, int tool_id, PyObject *name)
/*[clinic end generated code: output=30d76dc92b7cd653 input=5fab2eda2453b573]*/
{
    PyInterpreterState *interp = _PyInterpreterState_GET();
    if (check_tool(interp, tool_id, 0) < 0) {
        return NULL;
    }
    if (!PyUnicode_Check(name)) {
        PyErr_Format(PyExc_ValueError, "tool name must be a str, not %T",
                     name);
        return NULL;
    }
    if (PySys_Audit("sys.monitoring.use_tool_id", "iO", tool_id, name) < 0) {
        return NULL;
    }
    if (interp->monitoring.tool_names[tool_id] != NULL) {
        PyErr_Format(PyExc_ValueError, "tool %d is already in use", tool_id);
        return NULL;
    }
    interp->monitoring.tool_names[tool_id] = Py_NewRef(name);
    Py_RETURN_NONE;
}

/*[clinic input]
monitoring.clear_tool_id

    tool_id: int
    /

Drop the events and callbacks of tool_id, keeping it in use.
[clinic start generated code]*/

static PyObject *
monitoring_clear_tool_id_impl(PyObject *module, int tool_id)
/*[clinic end generated code: output=04defc23470b1be7 input=62cbf43e06090315]*/
{
    PyInterpreterState *interp = _PyInterpreterState_GET();
    if (check_tool(interp, tool_id, 1) < 0) {
        return NULL;
    }
    if (PySys_Audit("sys.monitoring.clear_tool_id", "i", tool_id) < 0) {
        return NULL;
    }
    if (clear_tool(interp, tool_id) < 0) {
        return NULL;
    }
    Py_RETURN_NONE;
}

/*[clinic input]
monitoring.free_tool_id

    tool_id: int
    /

Release tool_id, dropping its events and callbacks.
[clinic start generated code]*/

static PyObject *
monitoring_free_tool_id_impl(PyObject *module, int tool_id)
/*[clinic end generated code: output=86c2d2a1219a8591 input=95bc146f6271e1b4]*/
{
    PyInterpreterState *interp = _PyInterpreterState_GET();
    if (check_tool(interp, tool_id, 0) < 0) {
        return NULL;
    }
    if (PySys_Audit("sys.monitoring.free_tool_id", "i", tool_id) < 0) {
        return NULL;
    }
    if (interp->monitoring.tool_names[tool_id] == NULL) {
        Py_RETURN_NONE;
    }
    int err = clear_tool(interp, tool_id);
    Py_CLEAR(interp->monitoring.tool_names[tool_id]);
    if (err < 0) {
        return NULL;
    }
    Py_RETURN_NONE;
}

/*[clinic input]
monitoring.get_tool

    tool_id: int
    /

Return the name of the tool using tool_id, or None.
[clinic start generated code]*/

static PyObject *
monitoring_get_tool_impl(PyObject *module, int tool_id)
/*[clinic end generated code: output=1c05a98b404a9a16 input=78cb9dd1d83d1e57]*/
{
    PyInterpreterState *interp = _PyInterpreterState_GET();
    if (check_tool(interp, tool_id, 0) < 0) {
        return NULL;
    }
    PyObject *name = interp->monitoring.tool_names[tool_id];
    return Py_NewRef(name != NULL ? name : Py_None);
}

/*[clinic input]
monitoring.register_callback

    tool_id: int
    event: int
    func: object
    /

Register func for event of tool_id; return the callback it replaces.

func None unregisters.
[clinic start generated code]*/

static PyObject *
monitoring_register_callback_impl(PyObject *module, int tool_id, int event,
                                  PyObject *func)
/*[clinic end generated code: output=e64daa363004030c input=778b78e4200c1e80]*/
{
    PyInterpreterState *interp = _PyInterpreterState_GET();
    if (check_tool(interp, tool_id, 1) < 0) {
        return NULL;
    }
    if (event > ALL_EVENTS) {
        PyErr_Format(PyExc_ValueError, "invalid event %d", event);
        return NULL;
    }
    if (event <= 0 || (event & (event - 1))) {
        PyErr_SetString(PyExc_ValueError,
                        "The callback can only be set for one event at a "
                        "time");
        return NULL;
    }
    if (func != Py_None && !PyCallable_Check(func)) {
        PyErr_Format(PyExc_TypeError,
                     "callback must be callable or None, not %T", func);
        return NULL;
    }
    if (PySys_Audit("sys.monitoring.register_callback", "O", func) < 0) {
        return NULL;
    }
    int event_id = 0;
    while ((1 << event_id) != event) {
        event_id++;
    }
    PyObject **slot = &interp->monitoring.callbacks[tool_id][event_id];
    PyObject *previous = *slot;
    *slot = func == Py_None ? NULL : Py_NewRef(func);
    return previous != NULL ? previous : Py_NewRef(Py_None);
}

/*[clinic input]
monitoring.get_events -> int

    tool_id: int
    /

Return the events tool_id has set for all code.
[clinic start generated code]*/

static int
monitoring_get_events_impl(PyObject *module, int tool_id)
/*[clinic end generated code: output=4450cc13f826c8c0 input=1b7df748256ada9d]*/
{
    PyInterpreterState *interp = _PyInterpreterState_GET();
    if (check_tool(interp, tool_id, 0) < 0) {
        return -1;
    }
    return (int)get_global_events(interp, tool_id);
}

/*[clinic input]
monitoring.set_events

    tool_id: int
    event_set: int
    /

Set the events tool_id monitors in all code.
[clinic start generated code]*/

static PyObject *
monitoring_set_events_impl(PyObject *module, int tool_id, int event_set)
/*[clinic end generated code: output=1916c1e49cfb5bdb input=d312d681f0bf5f91]*/
{
    PyInterpreterState *interp = _PyInterpreterState_GET();
    if (check_tool(interp, tool_id, 1) < 0) {
        return NULL;
    }
    event_set = check_event_set(event_set);
    if (event_set < 0) {
        return NULL;
    }
    if (PySys_Audit("sys.monitoring.set_events", "ii",
                    tool_id, event_set) < 0)
    {
        return NULL;
    }
    if (set_global_events(interp, tool_id, (uint32_t)event_set) < 0) {
        return NULL;
    }
    Py_RETURN_NONE;
}

static PyCodeObject *
check_code(PyObject *code)
{
    if (!PyCode_Check(code)) {
        PyErr_Format(PyExc_TypeError, "code must be a code object, not %T",
                     code);
        return NULL;
    }
    return (PyCodeObject *)code;
}

/*[clinic input]
monitoring.get_local_events -> int

    tool_id: int
    code: object
    /

Return the events tool_id has set for code alone.
[clinic start generated code]*/

static int
monitoring_get_local_events_impl(PyObject *module, int tool_id,
                                 PyObject *code)
/*[clinic end generated code: output=d3e92c1c9c1de8f9 input=65850ce0aa1acee5]*/
{
    PyInterpreterState *interp = _PyInterpreterState_GET();
    PyCodeObject *co = check_code(code);
    if (co == NULL || check_tool(interp, tool_id, 0) < 0) {
        return -1;
    }
    return (int)local_events(interp, co->_co_monitoring, tool_id);
}

/*[clinic input]
monitoring.set_local_events

    tool_id: int
    code: object
    event_set: int
    /

Set the events tool_id monitors in code, besides its global ones.
[clinic start generated code]*/

static PyObject *
monitoring_set_local_events_impl(PyObject *module, int tool_id,
                                 PyObject *code, int event_set)
/*[clinic end generated code: output=68cc755a65dfea99 input=e7551f1c34029653]*/
{
    PyInterpreterState *interp = _PyInterpreterState_GET();
    PyCodeObject *co = check_code(code);
    if (co == NULL || check_tool(interp, tool_id, 1) < 0) {
        return NULL;
    }
    event_set = check_event_set(event_set);
    if (event_set < 0) {
        return NULL;
    }
    if (event_set & ~_PY_MONITORING_LOCAL_EVENTS) {
        PyErr_Format(PyExc_ValueError, "invalid local event set 0x%x",
                     (unsigned int)event_set);
        return NULL;
    }
    if (PySys_Audit("sys.monitoring.set_local_events", "iOi",
                    tool_id, code, event_set) < 0)
    {
        return NULL;
    }
    _PyCoMonitoringData *data = code_data(co);
    if (data == NULL) {
        return NULL;
    }
    uint32_t old = local_events(interp, data, tool_id);
    data->local_events[tool_id] = (uint32_t)event_set;
    data->local_epoch[tool_id] = interp->monitoring.tool_epoch[tool_id];
    interp->monitoring.local_union |= (uint32_t)event_set;
    if (old != (uint32_t)event_set
        && instrument_executing_code(interp) < 0)
    {
        return NULL;
    }
    Py_RETURN_NONE;
}

/*[clinic input]
monitoring.restart_events

Re-enable every event that a callback disabled by returning DISABLE.
[clinic start generated code]*/

static PyObject *
monitoring_restart_events_impl(PyObject *module)
/*[clinic end generated code: output=e025dd5ba33314c4 input=7b76fa7b632c0e2f]*/
{
    PyInterpreterState *interp = _PyInterpreterState_GET();
    interp->monitoring.restart_version = interp->monitoring.version + 1;
    if (instrument_executing_code(interp) < 0) {
        return NULL;
    }
    Py_RETURN_NONE;
}

/* sys.monitoring.Event: made on first use, since enum is costly to import
   at start-up. */
static PyObject *
monitoring_getattr(PyObject *module, PyObject *name)
{
    if (!PyUnicode_Check(name)
        || !_PyUnicode_EqualToASCIIString(name, "Event"))
    {
        PyErr_Format(PyExc_AttributeError,
                     "module 'sys.monitoring' has no attribute %R", name);
        return NULL;
    }
    PyObject *members = PyList_New(0);
    if (members == NULL) {
        return NULL;
    }
    for (int event = 0; event < _PY_MONITORING_EVENTS; event++) {
        PyObject *item = Py_BuildValue("(si)", event_names[event], 1 << event);
        if (item == NULL || PyList_Append(members, item) < 0) {
            Py_XDECREF(item);
            Py_DECREF(members);
            return NULL;
        }
        Py_DECREF(item);
    }
    PyObject *event_enum = NULL;
    PyObject *int_flag = _PyImport_GetModuleAttrString("enum", "IntFlag");
    PyObject *args = Py_BuildValue("(sN)", "Event", members);
    PyObject *kwargs = Py_BuildValue("{ss}", "module", "sys.monitoring");
    if (int_flag != NULL && args != NULL && kwargs != NULL) {
        event_enum = PyObject_Call(int_flag, args, kwargs);
    }
    Py_XDECREF(int_flag);
    Py_XDECREF(args);
    Py_XDECREF(kwargs);
    if (event_enum == NULL) {
        return NULL;
    }
    if (PyObject_SetAttr(module, name, event_enum) < 0) {
        Py_DECREF(event_enum);
        return NULL;
    }
    return event_enum;
}

static PyMethodDef monitoring_methods[] = {
    MONITORING_USE_TOOL_ID_METHODDEF
    MONITORING_CLEAR_TOOL_ID_METHODDEF
    MONITORING_FREE_TOOL_ID_METHODDEF
    MONITORING_GET_TOOL_METHODDEF
    MONITORING_REGISTER_CALLBACK_METHODDEF
    MONITORING_GET_EVENTS_METHODDEF
    MONITORING_SET_EVENTS_METHODDEF
    MONITORING_GET_LOCAL_EVENTS_METHODDEF
    MONITORING_SET_LOCAL_EVENTS_METHODDEF
    MONITORING_RESTART_EVENTS_METHODDEF
    {"__getattr__", (PyCFunction)monitoring_getattr, METH_O, NULL},
    {NULL, NULL}
};

static struct PyModuleDef monitoring_module = {
    PyModuleDef_HEAD_INIT,
    .m_name = "sys.monitoring",
    .m_doc = "Monitoring of Python code by tools (PEP 669).",
    .m_size = -1,
    .m_methods = monitoring_methods,
};

static int
set_flag(PyObject *events, const char *name, long value)
{
    PyObject *flag = PyLong_FromLong(value);
    if (flag == NULL) {
        return -1;
    }
    int err = PyObject_SetAttrString(events, name, flag);
    Py_DECREF(flag);
    return err;
}

static int
add_events_namespace(PyObject *module)
{
    PyObject *events = _PyNamespace_New(NULL);
    if (events == NULL) {
        return -1;
    }
    for (int event = 0; event < _PY_MONITORING_EVENTS; event++) {
        if (set_flag(events, event_names[event], 1L << event) < 0) {
            Py_DECREF(events);
            return -1;
        }
    }
    if (set_flag(events, "NO_EVENTS", 0) < 0) {
        Py_DECREF(events);
        return -1;
    }
    int err = PyModule_AddObjectRef(module, "events", events);
    Py_DECREF(events);
    return err;
}

PyObject *
_PyMonitoring_InitModule(void)
{
    if (PyType_Ready(&sentinel_type) < 0) {
        return NULL;
    }
    PyObject *module = PyModule_Create(&monitoring_module);
    if (module == NULL) {
        return NULL;
    }
    if (PyModule_AddIntConstant(module, "DEBUGGER_ID", 0) < 0
        || PyModule_AddIntConstant(module, "COVERAGE_ID", 1) < 0
        || PyModule_AddIntConstant(module, "PROFILER_ID", 2) < 0
        || PyModule_AddIntConstant(module, "OPTIMIZER_ID", 5) < 0
        || PyModule_AddObjectRef(module, "DISABLE", DISABLE) < 0
        || PyModule_AddObjectRef(module, "MISSING", MISSING) < 0
        || add_events_namespace(module) < 0)
    {
        Py_DECREF(module);
        return NULL;
    }
    return module;
}

void
_PyMonitoring_Clear(PyInterpreterState *interp)
{
    struct _Py_monitoring_state *state = &interp->monitoring;
    for (int tool = 0; tool < _PY_MONITORING_TOOL_IDS; tool++) {
        for (int event = 0; event < _PY_MONITORING_EVENTS; event++) {
            Py_CLEAR(state->callbacks[tool][event]);
        }
        Py_CLEAR(state->tool_names[tool]);
    }
    memset(state->global, 0, sizeof(state->global));
    state->version++;
}
