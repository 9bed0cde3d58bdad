/* sys.monitoring (PEP 669): tools, events and callbacks, and the
   instrumentation of quickened bytecode that delivers the events.

   The design is described in Include/internal/pycore_monitoring.h. */

#include "Python.h"
#include "pycore_bitutils.h"      // _Py_popcount32()
#include "pycore_call.h"          // _PyObject_VectorcallTstate()
#include "pycore_ceval.h"         // _PyEval_Vector()
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
#define LOCAL(event) _PY_MONITORING_LOCAL_INDEX(event)
#define ALL_EVENTS ((1 << _PY_MONITORING_EVENTS) - 1)
#define C_CALL_EVENTS \
    (1 << EVENT(CALL) | 1 << EVENT(C_RETURN) | 1 << EVENT(C_RAISE))

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

/* A static type of the core: object.c readies it with the others, and
   deallocates it before object, its base. */
PyTypeObject _PyMonitoring_Sentinel_Type = {
    PyVarObject_HEAD_INIT(&PyType_Type, 0)
    .tp_name = "sys.monitoring._Sentinel",
    .tp_basicsize = sizeof(_PyMonitoringSentinel),
    .tp_repr = (reprfunc)sentinel_repr,
    .tp_flags = Py_TPFLAGS_DEFAULT,
};

static _PyMonitoringSentinel disable_sentinel = {
    PyObject_HEAD_INIT(&_PyMonitoring_Sentinel_Type)
    "DISABLE"
};
_PyMonitoringSentinel _PyMonitoring_Missing = {
    PyObject_HEAD_INIT(&_PyMonitoring_Sentinel_Type)
    "MISSING"
};
#define DISABLE ((PyObject *)&disable_sentinel)
#define MISSING _PyMonitoring_MISSING


/* Instrumentation of the bytecode */

#define MARK(name) _PY_MONITORING_MARK_##name

/* Where a DISABLE of each event is marked. */
static const uint8_t event_mark[_PY_MONITORING_EVENTS] = {
    [EVENT(BRANCH)] = MARK(BRANCH),
    [EVENT(BRANCH_LEFT)] = MARK(BRANCH_LEFT),
    [EVENT(BRANCH_RIGHT)] = MARK(BRANCH_RIGHT),
    [EVENT(LINE)] = MARK(LINE),
    [EVENT(INSTRUCTION)] = MARK(INSTRUCTION),
    [EVENT(MARKER)] = MARK(MARKER),
    /* The others: MARK(SITE), the event of the instruction itself. */
};

/* Where the instruction `base` at unit `i`, with full `oparg`, goes when
   it jumps; -1 if it never does. */
static int
jump_target(int base, int i, int oparg)
{
    switch (base) {
        case JUMP_FORWARD:
        case POP_JUMP_FORWARD_IF_FALSE:
        case POP_JUMP_FORWARD_IF_TRUE:
        case POP_JUMP_FORWARD_IF_NONE:
        case POP_JUMP_FORWARD_IF_NOT_NONE:
        case JUMP_IF_FALSE_OR_POP:
        case JUMP_IF_TRUE_OR_POP:
        case FOR_ITER:
        case SEND:
            return i + 1 + oparg;
        case JUMP_BACKWARD:
        case JUMP_BACKWARD_NO_INTERRUPT:
        case POP_JUMP_BACKWARD_IF_FALSE:
        case POP_JUMP_BACKWARD_IF_TRUE:
        case POP_JUMP_BACKWARD_IF_NONE:
        case POP_JUMP_BACKWARD_IF_NOT_NONE:
            return i + 1 - oparg;
        default:
            return -1;
    }
}

static int
unit_base(PyCodeObject *code, int i)
{
    return _PyMonitoring_Deopt(code, i, _Py_OPCODE(_PyCode_CODE(code)[i]));
}

/* Whether the instruction at `i` may take INSTRUMENTED_INSTRUCTION: it
   comes after the code's first RESUME and is no RESUME. */
static int
hookable(PyCodeObject *code, _PyCoMonitoringData *data, int i)
{
    return i > code->_co_firsttraceable && data->base[i] != RESUME
           && data->base[i] != CACHE;
}

/* The instruction after the one at `i`, EXTENDED_ARGs skipped. */
static int
next_instruction(PyCodeObject *code, int i)
{
    i += 1 + _PyOpcode_Caches[unit_base(code, i)];
    while (i < Py_SIZE(code) && unit_base(code, i) == EXTENDED_ARG) {
        i++;
    }
    return i;
}

/* The instruction before the one at `i`, or -1. */
static int
previous_instruction(_PyCoMonitoringData *data, int i)
{
    do {
        i--;
    } while (i >= 0 && data->base[i] == CACHE);
    return i;
}

/* The PRECALL of the CALL at `call`: the instruction before it,
   EXTENDED_ARGs skipped; -1 in bytecode not made by the compiler. */
static int
precall_of_call(PyCodeObject *code, _PyCoMonitoringData *data, int call)
{
    int i = previous_instruction(data, call);
    while (i >= 0 && unit_base(code, i) == EXTENDED_ARG) {
        i = previous_instruction(data, i);
    }
    return i >= 0 && unit_base(code, i) == PRECALL ? i : -1;
}

/* The tools with a mark of `kind` at unit `i`. */
static inline uint8_t
unit_marks(_PyCoMonitoringData *data, int kind, int i)
{
    if (data->marks == NULL || data->marks[kind] == NULL) {
        return 0;
    }
    return data->marks[kind][i];
}

/* The marks of `kind` of the code of `data`, made if need be. */
static uint8_t *
marks_of(PyCodeObject *code, _PyCoMonitoringData *data, int kind)
{
    if (data->marks == NULL) {
        data->marks = _PyMem_OwnedCalloc(&PyCode_Type, _PY_MONITORING_MARKS,
                                         sizeof(uint8_t *));
        if (data->marks == NULL) {
            PyErr_NoMemory();
            return NULL;
        }
    }
    if (data->marks[kind] == NULL) {
        data->marks[kind] = _PyMem_OwnedCalloc(&PyCode_Type, Py_SIZE(code), 1);
        if (data->marks[kind] == NULL) {
            PyErr_NoMemory();
            return NULL;
        }
    }
    return data->marks[kind];
}

/* The tools to tell of `event` at unit `i`. */
static uint8_t
unit_tools(_PyCoMonitoringData *data, int i, int event)
{
    assert(IS_LOCAL(event));
    uint8_t tools = data->active[LOCAL(event)];
    return tools ? tools & ~unit_marks(data, event_mark[event], i) : 0;
}

/* The tools to tell of MARKER at unit `i`: those with a marker there. */
static uint8_t
marker_tools(_PyCoMonitoringData *data, int i)
{
    uint8_t tools = unit_tools(data, i, EVENT(MARKER));
    return tools ? tools & unit_marks(data, MARK(INSERTED), i) : 0;
}

/* Lines.  One byte per code unit: LINE_START where LINE is instrumented,
   and the unit's line as an offset from the least line of its block of
   LINES_BLOCK units.  The blocks' lines are kept just before the bytes,
   the first block's last, so that the bytes alone find them. */
#define LINES_BLOCK 64
#define LINE_START 0x80
#define LINE_OFFSET 0x7f
/* No line; also RESUME, after which a line is always new. */
#define LINE_NONE 0x7e
/* Too far from the block's line: found in the line table. */
#define LINE_FAR 0x7f

static int
line_blocks(PyCodeObject *code)
{
    return (int)((Py_SIZE(code) + LINES_BLOCK - 1) / LINES_BLOCK);
}

static int *
block_line(_PyCoMonitoringData *data, int block)
{
    return (int *)data->lines - 1 - block;
}

static int
line_start(_PyCoMonitoringData *data, int i)
{
    return data->lines != NULL && (data->lines[i] & LINE_START);
}

/* The line of unit `i`, or -1; `lines` must have been made. */
static int
unit_line(PyCodeObject *code, _PyCoMonitoringData *data, int i)
{
    int offset = data->lines[i] & LINE_OFFSET;
    if (offset == LINE_NONE) {
        return -1;
    }
    if (offset == LINE_FAR) {
        return PyCode_Addr2Line(code, i * (int)sizeof(_Py_CODEUNIT));
    }
    return *block_line(data, (int)((unsigned int)i / LINES_BLOCK)) + offset;
}

/* The INSTRUMENTED_ form of each instruction with events of its own.
   Not SEND, nor FOR_ITER's end: STOP_ITERATION is looked for where an
   iteration ends, never instrumented. */
static const uint8_t event_form[256] = {
    [RESUME] = INSTRUMENTED_RESUME,
    [RETURN_VALUE] = INSTRUMENTED_RETURN_VALUE,
    [YIELD_VALUE] = INSTRUMENTED_YIELD_VALUE,
    [CALL_FUNCTION_EX] = INSTRUMENTED_CALL_FUNCTION_EX,
    [CALL] = INSTRUMENTED_CALL,
    [PRECALL] = INSTRUMENTED_PRECALL,
    [JUMP_FORWARD] = INSTRUMENTED_JUMP,
    [JUMP_BACKWARD] = INSTRUMENTED_JUMP,
    [POP_JUMP_FORWARD_IF_FALSE] = INSTRUMENTED_JUMP,
    [POP_JUMP_FORWARD_IF_TRUE] = INSTRUMENTED_JUMP,
    [POP_JUMP_FORWARD_IF_NONE] = INSTRUMENTED_JUMP,
    [POP_JUMP_FORWARD_IF_NOT_NONE] = INSTRUMENTED_JUMP,
    [POP_JUMP_BACKWARD_IF_FALSE] = INSTRUMENTED_JUMP,
    [POP_JUMP_BACKWARD_IF_TRUE] = INSTRUMENTED_JUMP,
    [POP_JUMP_BACKWARD_IF_NONE] = INSTRUMENTED_JUMP,
    [POP_JUMP_BACKWARD_IF_NOT_NONE] = INSTRUMENTED_JUMP,
    [JUMP_IF_FALSE_OR_POP] = INSTRUMENTED_JUMP,
    [JUMP_IF_TRUE_OR_POP] = INSTRUMENTED_JUMP,
    [FOR_ITER] = INSTRUMENTED_JUMP,
};

/* The event each instruction of event_form[] tells of: PY_RESUME instead
   of PY_START for a RESUME with an oparg; a PRECALL tells the CALL of the
   CALL after it (see instrumented_form()).  A conditional jump tells
   BRANCH, and BRANCH_LEFT where it goes on or BRANCH_RIGHT where it jumps;
   as in 3.12, the jump back of a yield from loop is not told. */
static const uint8_t own_event[256] = {
    [RESUME] = EVENT(PY_START),
    [RETURN_VALUE] = EVENT(PY_RETURN),
    [YIELD_VALUE] = EVENT(PY_YIELD),
    [CALL_FUNCTION_EX] = EVENT(CALL),
    [CALL] = EVENT(CALL),
    [PRECALL] = EVENT(CALL),
    [JUMP_FORWARD] = EVENT(JUMP),
    [JUMP_BACKWARD] = EVENT(JUMP),
    [POP_JUMP_FORWARD_IF_FALSE] = EVENT(BRANCH),
    [POP_JUMP_FORWARD_IF_TRUE] = EVENT(BRANCH),
    [POP_JUMP_FORWARD_IF_NONE] = EVENT(BRANCH),
    [POP_JUMP_FORWARD_IF_NOT_NONE] = EVENT(BRANCH),
    [POP_JUMP_BACKWARD_IF_FALSE] = EVENT(BRANCH),
    [POP_JUMP_BACKWARD_IF_TRUE] = EVENT(BRANCH),
    [POP_JUMP_BACKWARD_IF_NONE] = EVENT(BRANCH),
    [POP_JUMP_BACKWARD_IF_NOT_NONE] = EVENT(BRANCH),
    [JUMP_IF_FALSE_OR_POP] = EVENT(BRANCH),
    [JUMP_IF_TRUE_OR_POP] = EVENT(BRANCH),
    [FOR_ITER] = EVENT(BRANCH),
};

/* JUMP or BRANCH for the jump `base`, -1 for other instructions. */
static int
jump_event(int base)
{
    return event_form[base] == INSTRUMENTED_JUMP ? own_event[base] : -1;
}

/* The INSTRUMENTED_ form the instruction `base` at `i` needs for its own
   events, or 0. */
static int
instrumented_form(PyCodeObject *code, _PyCoMonitoringData *data, int i,
                  int base)
{
    int form = event_form[base];
    if (form == 0) {
        return 0;
    }
    int event = own_event[base];
    int site = i;
    if (base == RESUME && _Py_OPARG(_PyCode_CODE(code)[i]) != 0) {
        event = EVENT(PY_RESUME);
    }
    else if (base == PRECALL) {
        /* Specialized PRECALLs make calls themselves, so both halves of a
           call are instrumented: PRECALL delivers CALL, and CALL delivers
           C_RETURN and C_RAISE. */
        site = next_instruction(code, i);
    }
    uint8_t tools = unit_tools(data, site, event);
    if (event == EVENT(BRANCH)) {
        tools |= unit_tools(data, i, EVENT(BRANCH_LEFT))
                 | unit_tools(data, i, EVENT(BRANCH_RIGHT));
    }
    return tools ? form : 0;
}

/* Whether the instruction at `i` needs INSTRUMENTED_INSTRUCTION. */
static int
needs_hook(PyCodeObject *code, _PyCoMonitoringData *data, int i)
{
    if (!hookable(code, data, i)) {
        return 0;
    }
    return marker_tools(data, i)
           || unit_tools(data, i, EVENT(INSTRUCTION))
           || (line_start(data, i) && unit_tools(data, i, EVENT(LINE)));
}

/* The opcode under the INSTRUMENTED_INSTRUCTION at `i`, run after the
   events before it: the INSTRUMENTED_ form for the instruction's own
   events, or the base instruction (never an adaptive or specialized form:
   those rewrite their own unit, which would erase the hook). */
static inline int
hooked_opcode(PyCodeObject *code, _PyCoMonitoringData *data, int i)
{
    int base = data->base[i];
    int form = event_form[base] ? instrumented_form(code, data, i, base) : 0;
    return form ? form : base;
}

/* An adaptive instruction taken back from its instrumented form starts to
   learn again. */
static void
set_adaptive(_Py_CODEUNIT *instr, int adaptive)
{
    _Py_SET_OPCODE(*instr, adaptive);
    instr[1] = adaptive_counter_start();
}

/* Puts the quickened, uninstrumented form of `base` at `instr`. */
static void
set_plain(_Py_CODEUNIT *instr, int base)
{
    switch (base) {
        case RESUME:
            _Py_SET_OPCODE(*instr, RESUME_QUICK);
            break;
        case JUMP_BACKWARD:
            _Py_SET_OPCODE(*instr, JUMP_BACKWARD_QUICK);
            break;
        case EXTENDED_ARG:
            _Py_SET_OPCODE(*instr, EXTENDED_ARG_QUICK);
            break;
        default:
            if (_PyOpcode_Adaptive[base]) {
                set_adaptive(instr, _PyOpcode_Adaptive[base]);
            }
            else {
                _Py_SET_OPCODE(*instr, base);
            }
    }
}

/* Some specialized forms also run the instruction after them, skipping
   its dispatch: superinstructions, COMPARE_OP_*_JUMP,
   BINARY_OP_INPLACE_ADD_UNICODE and the PRECALLs that make the call.
   While the instruction at `i` is instrumented, the one at `p` before it
   must not be one of them. */
static void
keep_from_skipping(PyCodeObject *code, int p, int i)
{
    if (p < 0 || i >= Py_SIZE(code)) {
        return;
    }
    _Py_CODEUNIT *instrs = _PyCode_CODE(code);
    int op = _Py_OPCODE(instrs[p]);
    if (_PyMonitoring_IsInstrumentedOpcode(op)) {
        return;
    }
    if (!_PyMonitoring_IsInstrumentedOpcode(_Py_OPCODE(instrs[i]))) {
        /* Nothing to skip: a PRECALL held back may specialize again. */
        if (op == PRECALL) {
            set_adaptive(&instrs[p], PRECALL_ADAPTIVE);
        }
        return;
    }
    switch (op) {
        case LOAD_FAST__LOAD_FAST:
        case LOAD_FAST__LOAD_CONST:
        case LOAD_CONST__LOAD_FAST:
        case STORE_FAST__LOAD_FAST:
        case STORE_FAST__STORE_FAST:
            _Py_SET_OPCODE(instrs[p], _PyOpcode_Deopt[op]);
            break;
        /* The specializers of these look at the next instruction, and
           leave it alone while it is instrumented. */
        case COMPARE_OP_FLOAT_JUMP:
        case COMPARE_OP_INT_JUMP:
        case COMPARE_OP_STR_JUMP:
            set_adaptive(&instrs[p], COMPARE_OP_ADAPTIVE);
            break;
        case BINARY_OP_INPLACE_ADD_UNICODE:
            set_adaptive(&instrs[p], BINARY_OP_ADAPTIVE);
            break;
        default:
            if (_PyOpcode_Deopt[op] == PRECALL) {
                _Py_SET_OPCODE(instrs[p], PRECALL);
            }
    }
}

/* Brings the instruction at `i` to what the tools want there:
   INSTRUMENTED_INSTRUCTION for the events before it, over the
   INSTRUMENTED_ form for its own events, over its plain form.  A plain
   form that stays keeps its specialization.  A CALL brings its PRECALL
   along, whose form follows the CALL's events. */
static void
update_instruction(PyCodeObject *code, _PyCoMonitoringData *data, int i)
{
    _Py_CODEUNIT *instrs = _PyCode_CODE(code);
    int op = _Py_OPCODE(instrs[i]);
    int base = data->base[i];
    assert(base == _PyMonitoring_Deopt(code, i, op));
    int form = instrumented_form(code, data, i, base);
    if (needs_hook(code, data, i)) {
        _Py_SET_OPCODE(instrs[i], INSTRUMENTED_INSTRUCTION);
    }
    else if (form) {
        _Py_SET_OPCODE(instrs[i], form);
    }
    else if (_PyMonitoring_IsInstrumentedOpcode(op)) {
        set_plain(&instrs[i], base);
    }
    keep_from_skipping(code, previous_instruction(data, i), i);
    keep_from_skipping(code, i, i + 1 + _PyOpcode_Caches[base]);
    if (base == CALL) {
        int precall = precall_of_call(code, data, i);
        if (precall >= 0) {
            update_instruction(code, data, precall);
        }
    }
}

/* The tools freed or cleared since the local events and marks of `data`
   were last rid of those of such tools: what it holds of them is void. */
static uint8_t
void_tools(PyInterpreterState *interp, _PyCoMonitoringData *data)
{
    struct _Py_monitoring_state *state = &interp->monitoring;
    uint8_t tools = 0;
    if (data->clears != state->clears) {
        for (int tool = 0; tool < _PY_MONITORING_TOOL_IDS; tool++) {
            if (state->cleared_at[tool] > data->clears) {
                tools |= 1 << tool;
            }
        }
    }
    return tools;
}

/* The tools that set `event` locally in the code of `data`. */
static uint8_t
local_tools(PyInterpreterState *interp, _PyCoMonitoringData *data, int event)
{
    if (data == NULL || !IS_LOCAL(event)) {
        return 0;
    }
    return data->local[LOCAL(event)] & ~void_tools(interp, data);
}

static uint32_t
local_events(PyInterpreterState *interp, _PyCoMonitoringData *data, int tool)
{
    uint32_t events = 0;
    for (int event = 0; event < _PY_MONITORING_EVENTS; event++) {
        if ((local_tools(interp, data, event) >> tool) & 1) {
            events |= 1u << event;
        }
    }
    return events;
}

static _PyCoMonitoringData *
code_data(PyCodeObject *code)
{
    if (code->_co_monitoring != NULL) {
        return code->_co_monitoring;
    }
    size_t size = offsetof(_PyCoMonitoringData, base) + (size_t)Py_SIZE(code);
    _PyCoMonitoringData *data = _PyMem_OwnedCalloc(&PyCode_Type, 1, size);
    if (data == NULL) {
        PyErr_NoMemory();
        return NULL;
    }
    data->clears = _PyInterpreterState_GET()->monitoring.clears;
    /* No instruction is instrumented yet: co_code shows the bases. */
    _Py_CODEUNIT *instrs = _PyCode_CODE(code);
    for (int i = 0; i < Py_SIZE(code); i++) {
        int base = _PyOpcode_Deopt[_Py_OPCODE(instrs[i])];
        assert(base != CACHE && !_PyMonitoring_IsInstrumentedOpcode(base));
        data->base[i] = (uint8_t)base;
        i += _PyOpcode_Caches[base];
    }
    code->_co_monitoring = data;
    return data;
}

static void
free_marks(_PyCoMonitoringData *data, int kind)
{
    if (data->marks[kind] != NULL) {
        _PyMem_OwnedFree(&PyCode_Type, data->marks[kind]);
        data->marks[kind] = NULL;
    }
}

/* Calls visit on each block that `code`'s monitoring data owns, the data
   itself last: what freeing the data frees, and what its size counts. */
static void
visit_data_blocks(PyCodeObject *code, _PyCoMonitoringData *data,
                  void (*visit)(void *block, void *arg), void *arg)
{
    if (data->lines != NULL) {
        visit(block_line(data, line_blocks(code) - 1), arg);
    }
    if (data->marks != NULL) {
        for (int kind = 0; kind < _PY_MONITORING_MARKS; kind++) {
            if (data->marks[kind] != NULL) {
                visit(data->marks[kind], arg);
            }
        }
        visit(data->marks, arg);
    }
    visit(data, arg);
}

static void
free_block(void *block, void *Py_UNUSED(arg))
{
    _PyMem_OwnedFree(&PyCode_Type, block);
}

void
_PyMonitoring_FreeCodeData(PyCodeObject *code)
{
    if (code->_co_monitoring != NULL) {
        visit_data_blocks(code, code->_co_monitoring, free_block, NULL);
        code->_co_monitoring = NULL;
    }
    code->_co_monitoring_version = 0;
}

#ifdef Py_TRACK_MEMORY
static void
add_reserved(void *block, void *total)
{
    *(size_t *)total += _PyMem_ReservedSize(block);
}

size_t
_PyMonitoring_CodeDataBytes(PyCodeObject *code)
{
    size_t size = 0;
    if (code->_co_monitoring != NULL) {
        visit_data_blocks(code, code->_co_monitoring, add_reserved, &size);
    }
    return size;
}
#endif

static void
mark_line_start(PyCodeObject *code, _PyCoMonitoringData *data,
                const int *line, int i)
{
    if (i >= 0 && i < Py_SIZE(code) && line[i] >= 0
        && hookable(code, data, i))
    {
        data->lines[i] |= LINE_START;
    }
}

/* One number of the exception table (Objects/exception_handling_notes.txt):
   six bits a byte, most significant first, bit 6 set on all but the last;
   bit 7 marks the start of an entry. */
static const unsigned char *
read_varint(const unsigned char *p, int *value)
{
    int v = *p & 63;
    while (*p & 64) {
        p++;
        v = (v << 6) | (*p & 63);
    }
    *value = v;
    return p + 1;
}

/* A walk over the entries of code's exception table: each gives the range
   of code units [start, end) whose exceptions go to `handler`.  3.11's
   entries do not overlap. */
typedef struct {
    const unsigned char *next;
    const unsigned char *table_end;
    int start, end, handler;
} handler_walk;

static void
handlers_begin(PyCodeObject *code, handler_walk *walk)
{
    walk->next = (const unsigned char *)PyBytes_AS_STRING(
        code->co_exceptiontable);
    walk->table_end = walk->next + PyBytes_GET_SIZE(code->co_exceptiontable);
}

static int
handlers_next(handler_walk *walk)
{
    if (walk->next >= walk->table_end) {
        return 0;
    }
    int length, depth_lasti;
    walk->next = read_varint(walk->next, &walk->start);
    walk->next = read_varint(walk->next, &length);
    walk->next = read_varint(walk->next, &walk->handler);
    walk->next = read_varint(walk->next, &depth_lasti);
    walk->end = walk->start + length;
    return 1;
}

/* Whether the instruction after `base` may run next. */
static int
falls_through(int base)
{
    switch (base) {
        case RETURN_VALUE:
        case RAISE_VARARGS:
        case RERAISE:
        case JUMP_FORWARD:
        case JUMP_BACKWARD:
        case JUMP_BACKWARD_NO_INTERRUPT:
            return 0;
        default:
            return 1;
    }
}

/* The line of each code unit, and where LINE is instrumented: where an
   instruction may run after one of another line, that is after the code's
   first RESUME, after an instruction before it that falls through to it,
   after a jump to it, or as an exception handler.  At run time LINE is
   told there when the line differs from that of the instruction run before
   (3.12's rule).  A place that cannot be reached from another line is left
   alone, so that LINE and DISABLE leave nothing behind there. */
static int
compute_lines(PyCodeObject *code, _PyCoMonitoringData *data)
{
    int n = (int)Py_SIZE(code);
    int blocks = line_blocks(code);
    int *line = PyMem_Malloc(n * sizeof(int));
    int *lines = _PyMem_OwnedMalloc(&PyCode_Type,
                                    blocks * sizeof(int) + (size_t)n);
    if (line == NULL || lines == NULL) {
        PyMem_Free(line);
        if (lines != NULL) {
            _PyMem_OwnedFree(&PyCode_Type, lines);
        }
        PyErr_NoMemory();
        return -1;
    }
    data->lines = (uint8_t *)(lines + blocks);
    PyCodeAddressRange range;
    _PyCode_InitAddressRange(code, &range);
    for (int i = 0; i < n; i++) {
        line[i] = data->base[i] == RESUME ? -1
            : _PyCode_CheckLineNumber(i * (int)sizeof(_Py_CODEUNIT), &range);
    }
    for (int block = 0; block < blocks; block++) {
        int least = INT_MAX;
        int end = Py_MIN(n, (block + 1) * LINES_BLOCK);
        for (int i = block * LINES_BLOCK; i < end; i++) {
            if (line[i] >= 0 && line[i] < least) {
                least = line[i];
            }
        }
        *block_line(data, block) = least;
        for (int i = block * LINES_BLOCK; i < end; i++) {
            data->lines[i] = line[i] < 0 ? LINE_NONE
                             : line[i] - least < LINE_NONE
                             ? (uint8_t)(line[i] - least) : LINE_FAR;
        }
    }
    _Py_CODEUNIT *instrs = _PyCode_CODE(code);
    /* The instruction before, in code order, RESUMEs passed over: a
       generator resumes on the line it yielded at. */
    int previous_line = -1;
    int previous_falls_through = 1;
    int extended = 0;
    for (int i = 0; i < n; i++) {
        int base = data->base[i];
        if (base == CACHE) {
            continue;
        }
        int oparg = extended | _Py_OPARG(instrs[i]);
        extended = base == EXTENDED_ARG ? oparg << 8 : 0;
        if (!hookable(code, data, i)) {
            continue;
        }
        if (previous_falls_through && line[i] != previous_line) {
            mark_line_start(code, data, line, i);
        }
        previous_line = line[i];
        previous_falls_through = falls_through(base);
        int target = jump_target(base, i, oparg);
        if (target >= 0 && target < n && line[target] != line[i]) {
            mark_line_start(code, data, line, target);
        }
    }
    handler_walk walk;
    handlers_begin(code, &walk);
    while (handlers_next(&walk)) {
        mark_line_start(code, data, line, walk.handler);
    }
    PyMem_Free(line);
    return 0;
}

/* DISABLE marks last until restart_events(), or until their tool is
   freed or cleared; markers until their tool is freed or cleared. */
static void
forget_void_marks(PyInterpreterState *interp, PyCodeObject *code,
                  _PyCoMonitoringData *data)
{
    struct _Py_monitoring_state *state = &interp->monitoring;
    uint8_t cleared = void_tools(interp, data);
    data->clears = state->clears;
    for (int i = 0; i < _PY_MONITORING_LOCAL_EVENT_COUNT; i++) {
        data->local[i] &= ~cleared;
    }
    if (data->marks == NULL) {
        return;
    }
    int restart = code->_co_monitoring_version < state->restart_version;
    for (int kind = 0; kind < _PY_MONITORING_MARKS; kind++) {
        uint8_t *marks = data->marks[kind];
        if (marks == NULL) {
            continue;
        }
        if (restart && kind != MARK(INSERTED)) {
            free_marks(data, kind);
            continue;
        }
        if (cleared == 0) {
            continue;
        }
        int any = 0;
        for (int i = 0; i < Py_SIZE(code); i++) {
            if (kind == MARK(INSERTED)) {
                data->markers -= _Py_popcount32(marks[i] & cleared);
            }
            marks[i] &= ~cleared;
            any |= marks[i];
        }
        if (!any) {
            free_marks(data, kind);
        }
    }
}

#ifdef Py_DEBUG
/* Whether `op` is a form a specializer would let run the instruction
   after it without its dispatch (see keep_from_skipping()). */
static int
skips_next(int op)
{
    switch (op) {
        case LOAD_FAST__LOAD_FAST:
        case LOAD_FAST__LOAD_CONST:
        case LOAD_CONST__LOAD_FAST:
        case STORE_FAST__LOAD_FAST:
        case STORE_FAST__STORE_FAST:
        case COMPARE_OP_FLOAT_JUMP:
        case COMPARE_OP_INT_JUMP:
        case COMPARE_OP_STR_JUMP:
        case BINARY_OP_INPLACE_ADD_UNICODE:
            return 1;
        default:
            return _PyOpcode_Deopt[op] == PRECALL && op != PRECALL
                   && op != PRECALL_ADAPTIVE
                   && !_PyMonitoring_IsInstrumentedOpcode(op);
    }
}

/* The debug build's checker, run after every change of instrumentation:
   it derives anew, from the interpreter's tables of tools and events, what
   code up to date must hold, and compares.  What the incremental paths
   (DISABLE at one site, markers, a CALL dragging its PRECALL along) leave
   must be what a rebuild from scratch would make. */
static void
check_instrumentation(PyCodeObject *code, PyInterpreterState *interp)
{
    _PyCoMonitoringData *data = code->_co_monitoring;
    struct _Py_monitoring_state *state = &interp->monitoring;
    if (data == NULL) {
        return;
    }
    int up_to_date = code->_co_monitoring_version == state->version;
    if (up_to_date) {
        assert(data->clears == state->clears);
        int local_events = 0;
        for (int event = 0; event < _PY_MONITORING_EVENTS; event++) {
            if (IS_LOCAL(event)) {
                assert(LOCAL(event) == local_events++);
                assert(data->active[LOCAL(event)]
                       == (state->global[event] | data->local[LOCAL(event)]));
            }
        }
        assert(local_events == _PY_MONITORING_LOCAL_EVENT_COUNT);
        assert(data->lines != NULL || data->active[LOCAL(EVENT(LINE))] == 0);
    }
    _Py_CODEUNIT *instrs = _PyCode_CODE(code);
    PyCodeAddressRange range;
    _PyCode_InitAddressRange(code, &range);
    int markers = 0;
    int next_start = 0;
    int previous = -1;
    for (int i = 0; i < Py_SIZE(code); i++) {
        int op = _Py_OPCODE(instrs[i]);
        int base = data->base[i];
        int line = _PyCode_CheckLineNumber(i * (int)sizeof(_Py_CODEUNIT),
                                           &range);
        if (i != next_start) {
            /* An inline cache entry: nothing of monitoring's. */
            assert(base == CACHE);
            assert(data->lines == NULL
                   || !(data->lines[i] & LINE_START));
            for (int kind = 0; kind < _PY_MONITORING_MARKS; kind++) {
                assert(unit_marks(data, kind, i) == 0);
            }
            continue;
        }
        next_start = i + 1 + _PyOpcode_Caches[base];
        assert(base != CACHE && base == _PyOpcode_Deopt[base]);
        assert(base == unit_base(code, i));
        assert(!line_start(data, i) || hookable(code, data, i));
        assert(data->lines == NULL
               || unit_line(code, data, i) == (base == RESUME ? -1 : line));
        uint8_t unit_markers = unit_marks(data, MARK(INSERTED), i);
        assert(!unit_markers || hookable(code, data, i));
        assert((unit_markers & ~((1 << _PY_MONITORING_USER_TOOL_IDS) - 1))
               == 0);
        markers += _Py_popcount32(unit_markers);
        if (!up_to_date) {
            previous = i;
            continue;
        }
        int form = instrumented_form(code, data, i, base);
        if (needs_hook(code, data, i)) {
            assert(op == INSTRUMENTED_INSTRUCTION);
        }
        else if (form) {
            assert(op == form);
        }
        else {
            assert(!_PyMonitoring_IsInstrumentedOpcode(op));
            assert(_PyOpcode_Deopt[op] == base);
        }
        if (_PyMonitoring_IsInstrumentedOpcode(op) && previous >= 0) {
            assert(!skips_next(_Py_OPCODE(instrs[previous])));
        }
        previous = i;
    }
    assert(markers == data->markers);
    /* Once void marks are forgotten, no array of DISABLE marks is kept
       empty (markers come and go one by one, and theirs may be). */
    for (int kind = 0; up_to_date && data->marks != NULL
                       && kind < _PY_MONITORING_MARKS; kind++)
    {
        uint8_t *marks = data->marks[kind];
        if (marks == NULL || kind == MARK(INSERTED)) {
            continue;
        }
        int any = 0;
        for (int i = 0; i < Py_SIZE(code); i++) {
            any |= marks[i];
        }
        assert(any);
    }
}
#else
#define check_instrumentation(code, interp) ((void)0)
#endif

/* Instrumented forms replace quickened ones: quicken first, so that
   warming up never overwrites them. */
static void
quicken_now(PyCodeObject *code)
{
    if (code->co_warmup != 0) {
        code->co_warmup = 0;
        _PyCode_Quicken(code);
    }
}

/* Brings `code` to what the tables ask of it now. */
static int
instrument(PyCodeObject *code, PyInterpreterState *interp)
{
    struct _Py_monitoring_state *state = &interp->monitoring;
    int any = 0;
    for (int event = 0; event < _PY_MONITORING_EVENTS; event++) {
        any |= IS_LOCAL(event) && state->global[event];
    }
    if (!any && code->_co_monitoring == NULL) {
        code->_co_monitoring_version = state->version;
        return 0;
    }
    _PyCoMonitoringData *data = code_data(code);
    if (data == NULL) {
        return -1;
    }
    forget_void_marks(interp, code, data);
    uint8_t active[_PY_MONITORING_LOCAL_EVENT_COUNT];
    for (int event = 0; event < _PY_MONITORING_EVENTS; event++) {
        if (IS_LOCAL(event)) {
            active[LOCAL(event)] = state->global[event]
                                   | data->local[LOCAL(event)];
        }
    }
    if (active[LOCAL(EVENT(LINE))] && data->lines == NULL
        && compute_lines(code, data) < 0)
    {
        return -1;
    }
    quicken_now(code);
    memcpy(data->active, active, sizeof(active));
    for (int i = 0; i < Py_SIZE(code); i++) {
        update_instruction(code, data, i);
        i += _PyOpcode_Caches[data->base[i]];
    }
    code->_co_monitoring_version = state->version;
    check_instrumentation(code, interp);
    return 0;
}

int
_PyMonitoring_Instrument(PyCodeObject *code, PyInterpreterState *interp)
{
    if (code->_co_monitoring_version == interp->monitoring.version) {
        return 0;
    }
    return instrument(code, interp);
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

static int
disable_site(PyCodeObject *code, int site, int event, int tool)
{
    _PyCoMonitoringData *data = code->_co_monitoring;
    assert(data != NULL && IS_LOCAL(event));
    uint8_t *marks = marks_of(code, data, event_mark[event]);
    if (marks == NULL) {
        return -1;
    }
    marks[site] |= 1 << tool;
    update_instruction(code, data, site);
    check_instrumentation(code, _PyInterpreterState_GET());
    return 0;
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
    return unit_tools(data, site, event);
}

/* The tools that want `event` at `site` as things are now.  Not inlined:
   call_tools() asks only after a callback ran. */
static Py_NO_INLINE uint8_t
tools_now(PyInterpreterState *interp, PyCodeObject *code, int site, int event)
{
    if (event == EVENT(C_RETURN) || event == EVENT(C_RAISE)) {
        return site_tools(code, site, EVENT(CALL));
    }
    if (!IS_LOCAL(event)) {
        return interp->monitoring.global[event];
    }
    if (event == EVENT(MARKER)) {
        return marker_tools(code->_co_monitoring, site);
    }
    return site_tools(code, site, event);
}

/* 3.12's rule: no tool hears of anything while a monitoring callback, a
   trace function or a profile function runs in this thread.  Each of them
   runs between PyThreadState_EnterTracing() and LeaveTracing(), so a
   debugger's REPL inside a LINE callback, or one tool's callback, is never
   recorded by another tool; sys.call_tracing() lifts the rule, as it lifts
   it for trace functions. */
#define SILENCED(tstate) ((tstate)->tracing != 0)

/* A callback returned DISABLE for `event` at `site`: no more of it there
   for `tool`, until restart_events().  Kept out of call_tools(), whose
   every event pays for what it prepares. */
static Py_NO_INLINE int
disable_after_callback(PyThreadState *tstate, PyCodeObject *code, int site,
                       int event, int tool)
{
    if (!IS_LOCAL(event)) {
        /* As upstream does: the callback goes, so that an event that
           cannot be disabled does not raise again and again. */
        Py_CLEAR(tstate->interp->monitoring.callbacks[tool][event]);
        PyErr_Format(PyExc_ValueError,
                     "Cannot disable %s events. Callback removed.",
                     event_names[event]);
        return -1;
    }
    return disable_site(code, site, event, tool);
}

/* Calls the Python callback `callback` with `args`; returns 1 when it
   returned DISABLE, -1 when it raised. */
static inline int
call_python(PyThreadState *tstate, PyObject *callback, PyObject **args,
            size_t nargsf)
{
    Py_INCREF(callback);
    PyObject *res;
    PyFunctionObject *func = (PyFunctionObject *)callback;
    if (Py_IS_TYPE(callback, &PyFunction_Type)
        && func->vectorcall == _PyFunction_Vectorcall)
    {
        /* Most callbacks are Python functions: a frame is pushed for them
           at once, as the eval loop does for its calls. */
        PyObject *locals =
            ((PyCodeObject *)func->func_code)->co_flags & CO_OPTIMIZED
            ? NULL : func->func_globals;
        res = _PyEval_Vector(tstate, func, locals, args,
                             PyVectorcall_NARGS(nargsf), NULL);
    }
    else {
        res = _PyObject_VectorcallTstate(tstate, callback, args, nargsf,
                                         NULL);
    }
    Py_DECREF(callback);
    if (res == NULL) {
        return -1;
    }
    Py_DECREF(res);
    return res == DISABLE;
}

/* Calls the `event` callbacks of `tools`, highest tool id first (as 3.12
   does), with the code, `where` (the line for LINE, the offset of `site`
   for the others) and the event's own arguments.  `tools` must be what
   tools_now() says: no code may have run since.  Inlined into the path
   of LINE, the most frequent event; called by the others. */
static inline Py_ALWAYS_INLINE int
call_tools_inline(PyThreadState *tstate, PyCodeObject *code, int site,
                  int event, uint8_t tools, long where, PyObject *arg1,
                  PyObject *arg2)
{
    assert(tools != 0 && !SILENCED(tstate));
    struct _Py_monitoring_state *state = &tstate->interp->monitoring;
    /* `where` is made an int object for the first Python callback. */
    PyObject *args[5] = {NULL, (PyObject *)code, NULL, arg1, arg2};
    size_t nargsf = (2 + (arg1 != NULL) + (arg2 != NULL))
                    | PY_VECTORCALL_ARGUMENTS_OFFSET;
    int err = 0;
    int called = 0;
    for (unsigned int rest = tools; rest != 0; ) {
        int tool = _Py_bit_length(rest) - 1;
        rest ^= 1u << tool;
        /* Looked up anew each time: an earlier callback, in this thread
           or another, may have changed or removed it, turned the event
           off for this tool, or disabled it here. */
        PyObject *callback = state->callbacks[tool][event];
        _PyMonitoring_NativeCallback native = state->native[tool][event].func;
        if ((callback == NULL && native == NULL)
            || (called
                && !((tools_now(tstate->interp, code, site, event) >> tool)
                     & 1)))
        {
            continue;
        }
        called = 1;
        if (callback != NULL && args[2] == NULL) {
            args[2] = PyLong_FromLong(where);
            if (args[2] == NULL) {
                err = -1;
                break;
            }
        }
        /* PyThreadState_EnterTracing() and LeaveTracing(), inlined: this
           is the path of every event.  Without a trace function (the
           callback may have set one) tracing stays off. */
        tstate->tracing++;
        tstate->cframe->use_tracing = 0;
        int res = callback != NULL
            ? call_python(tstate, callback, args + 1, nargsf)
            : native(state->native[tool][event].arg, tstate, code, where,
                     arg1, arg2);
        tstate->tracing--;
        if (tstate->c_tracefunc != NULL) {
            _PyThreadState_UpdateTracingState(tstate);
        }
        if (res != 0
            && (res < 0
                || disable_after_callback(tstate, code, site, event,
                                          tool) < 0))
        {
            err = -1;
            break;
        }
    }
    Py_XDECREF(args[2]);
    return err;
}

static Py_NO_INLINE int
call_tools(PyThreadState *tstate, PyCodeObject *code, int site, int event,
           uint8_t tools, long where, PyObject *arg1, PyObject *arg2)
{
    return call_tools_inline(tstate, code, site, event, tools, where, arg1,
                             arg2);
}

static inline long
site_offset(int site)
{
    return site < 0 ? 0 : site * (long)sizeof(_Py_CODEUNIT);
}

/* When `tools` is a lone tool with a callback written in C (a profiler),
   calls it at once and returns 1 (or -1 if it raised): no object is made
   of the offset, and it decides alone.  Returns 0 otherwise. */
static inline int
call_lone_native(PyThreadState *tstate, PyCodeObject *code, int site,
                 int event, uint8_t tools, PyObject *arg1, PyObject *arg2)
{
    assert(tools != 0 && !SILENCED(tstate));
    if (tools & (tools - 1)) {
        return 0;
    }
    int tool = _Py_bit_length(tools) - 1;
    struct _Py_monitoring_state *state = &tstate->interp->monitoring;
    _PyMonitoring_NativeCallback native = state->native[tool][event].func;
    if (native == NULL) {
        return 0;
    }
    assert(state->callbacks[tool][event] == NULL);
    tstate->tracing++;
    tstate->cframe->use_tracing = 0;
    int res = native(state->native[tool][event].arg, tstate, code,
                     site_offset(site), arg1, arg2);
    tstate->tracing--;
    if (tstate->c_tracefunc != NULL) {
        _PyThreadState_UpdateTracingState(tstate);
    }
    if (res > 0
        && disable_after_callback(tstate, code, site, event, tool) < 0)
    {
        return -1;
    }
    return res < 0 ? -1 : 1;
}

/* call_tools() for an event other than LINE, if anyone is to hear it. */
static inline int
deliver(PyThreadState *tstate, PyCodeObject *code, int site, int event,
        uint8_t tools, PyObject *arg1, PyObject *arg2)
{
    assert(event != EVENT(LINE));
    if (tools == 0 || SILENCED(tstate)) {
        return 0;
    }
    int called = call_lone_native(tstate, code, site, event, tools, arg1,
                                  arg2);
    if (called) {
        return called < 0 ? -1 : 0;
    }
    return call_tools(tstate, code, site, event, tools, site_offset(site),
                      arg1, arg2);
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
    int event = unit_base(frame->f_code, site) == YIELD_VALUE
                ? EVENT(PY_YIELD) : EVENT(PY_RETURN);
    return deliver(tstate, frame->f_code, site, event,
                   site_tools(frame->f_code, site, event), retval, NULL);
}

/* The tools that want no call of `callable`. */
static inline uint8_t
unwanted_for(PyThreadState *tstate, PyObject *callable)
{
    return _PyMonitoring_IsBuiltinCallable(callable)
           ? 0 : tstate->interp->monitoring.builtin_calls_only;
}

int
_PyMonitoring_FireCall(PyThreadState *tstate, _PyInterpreterFrame *frame,
                       _Py_CODEUNIT *instr, PyObject *callable, PyObject *arg0)
{
    /* A PRECALL tells the CALL after it, at the unit after its cache. */
    int site = instr_index(frame, instr);
    while (unit_base(frame->f_code, site) == EXTENDED_ARG) {
        site++;
    }
    return deliver(tstate, frame->f_code, site, EVENT(CALL),
                   site_tools(frame->f_code, site, EVENT(CALL))
                   & ~unwanted_for(tstate, callable),
                   callable, arg0);
}

/* Delivers `event` while an exception propagates: the exception is
   fetched meanwhile, and is the event's argument where `arg1` is NULL.  A
   callback's exception replaces it.  A lone tool written in C hears of it
   with the exception still set, and `arg1` as given: it needs no object
   made, and takes what it wants of the exception itself. */
static int
deliver_during_exception(PyThreadState *tstate, PyCodeObject *code, int site,
                         int event, uint8_t tools, PyObject *arg1,
                         PyObject *arg2)
{
    if (tools == 0 || SILENCED(tstate)) {
        return 0;
    }
    int called = call_lone_native(tstate, code, site, event, tools, arg1,
                                  arg2);
    if (called) {
        return called < 0 ? -1 : 0;
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
    /* Making the exception may have run code. */
    tools &= tools_now(tstate->interp, code, site, event);
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
    uint8_t tools = site_tools(code, site, EVENT(CALL))
                    & ~unwanted_for(tstate, callable);
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
_PyMonitoring_CallBuiltin(PyThreadState *tstate, _PyInterpreterFrame *frame,
                          _Py_CODEUNIT *call, PyObject *callable,
                          PyObject *const *args, size_t nargsf,
                          PyObject *kwnames, PyObject **res)
{
    assert(_PyMonitoring_IsBuiltinCallable(callable));
    assert(_Py_OPCODE(*call) == INSTRUMENTED_CALL);
    PyCodeObject *code = frame->f_code;
    int site = instr_index(frame, call);
    Py_ssize_t nargs = PyVectorcall_NARGS(nargsf)
                       + (kwnames != NULL ? PyTuple_GET_SIZE(kwnames) : 0);
    PyObject *arg0 = nargs > 0 ? args[0] : MISSING;
    if (deliver(tstate, code, site, EVENT(CALL),
                site_tools(code, site, EVENT(CALL)), callable, arg0) < 0)
    {
        return -1;
    }
    /* The callback may have changed what watches the CALL: then CALL runs
       on its own, as it would without this shortcut. */
    if (_Py_OPCODE(*call) != INSTRUMENTED_CALL
        || tstate->cframe->use_tracing)
    {
        return 0;
    }
    *res = _PyObject_VectorcallTstate(tstate, callable, args, nargsf,
                                      kwnames);
    uint8_t tools = site_tools(code, site, EVENT(CALL));
    if (*res != NULL) {
        if (deliver(tstate, code, site, EVENT(C_RETURN), tools, callable,
                    arg0) < 0)
        {
            Py_CLEAR(*res);
        }
        return 1;
    }
    (void)deliver_during_exception(tstate, code, site, EVENT(C_RAISE), tools,
                                   callable, arg0);
    return 1;
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
    if (tools == 0 || SILENCED(tstate)) {
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
    /* Making the exception may have run code (the gc). */
    tools = site_tools(code, site, EVENT(STOP_ITERATION));
    int err = deliver(tstate, code, site, EVENT(STOP_ITERATION), tools, exc,
                      NULL);
    Py_DECREF(exc);
    return err;
}

/* What PUSH_EXC_INFO does: save the thread's exception state under the
   exception on the stack, which becomes the state. */
static void
push_exc_info(PyThreadState *tstate, _PyInterpreterFrame *frame)
{
    PyObject *exc = _PyFrame_StackPop(frame);
    assert(PyExceptionInstance_Check(exc));
    _PyErr_StackItem *exc_info = tstate->exc_info;
    _PyFrame_StackPush(frame, exc_info->exc_value != NULL
                              ? exc_info->exc_value : Py_NewRef(Py_None));
    exc_info->exc_value = Py_NewRef(exc);
    _PyFrame_StackPush(frame, exc);
}

/* What POP_EXCEPT does: the exception state saved on the stack becomes the
   thread's again. */
static void
pop_exc_info(PyThreadState *tstate, _PyInterpreterFrame *frame)
{
    _PyErr_StackItem *exc_info = tstate->exc_info;
    PyObject *handled = exc_info->exc_value;
    exc_info->exc_value = _PyFrame_StackPop(frame);
    Py_XDECREF(handled);
}

int
_PyMonitoring_FireInstruction(PyThreadState *tstate,
                              _PyInterpreterFrame *frame, _Py_CODEUNIT *instr)
{
    PyCodeObject *code = frame->f_code;
    _PyCoMonitoringData *data = code->_co_monitoring;
    int site = instr_index(frame, instr);
    int previous = instr_index(frame, frame->prev_instr);
    /* Callbacks see the frame at this instruction. */
    frame->prev_instr = instr;
    uint8_t tools = marker_tools(data, site);
    if (tools && deliver(tstate, code, site, EVENT(MARKER), tools,
                         NULL, NULL) < 0)
    {
        goto error;
    }
    tools = line_start(data, site) ? unit_tools(data, site, EVENT(LINE)) : 0;
    if (tools && !SILENCED(tstate)) {
        /* A line start always has a line. */
        int line = unit_line(code, data, site);
        assert(line >= 0);
        if (previous < 0 || previous >= Py_SIZE(code)
            || line != unit_line(code, data, previous))
        {
            _PyInterpreterFrame *outer = tstate->monitoring_line_frame;
            tstate->monitoring_line_frame = frame;
            int err = call_tools_inline(tstate, code, site, EVENT(LINE),
                                        tools, line, NULL, NULL);
            tstate->monitoring_line_frame = outer;
            if (err < 0) {
                goto error;
            }
            if (frame->prev_instr != instr) {
                /* f_lineno was set: this instruction does not run now, so
                   neither is it reported (as in 3.12). */
                return 0;
            }
        }
    }
    tools = unit_tools(data, site, EVENT(INSTRUCTION));
    if (tools && deliver(tstate, code, site, EVENT(INSTRUCTION), tools,
                         NULL, NULL) < 0)
    {
        goto error;
    }
    /* Callbacks may have changed what is here: an uninstrumented form
       runs generic this once, since a trace function may be active. */
    int op = _Py_OPCODE(*instr);
    return op == INSTRUMENTED_INSTRUCTION ? hooked_opcode(code, data, site)
                                          : _PyMonitoring_TracingOpcode(op);

error:
    frame->prev_instr = instr;
    /* Where the exception goes depends on the exception state a handler
       saved on the stack.  At a handler's PUSH_EXC_INFO it goes to the
       handler's cleanup, which restores the state the instruction saves:
       save it, as if it had run.  At the POP_EXCEPT that ends a handler
       it goes past the saved state, which nothing would restore: restore
       it.  Otherwise the handled exception stays the thread's for good. */
    switch (data->base[site]) {
        case PUSH_EXC_INFO:
            push_exc_info(tstate, frame);
            break;
        case POP_EXCEPT:
            pop_exc_info(tstate, frame);
            break;
    }
    return -1;
}

int
_PyMonitoring_JumpOpcode(_PyInterpreterFrame *frame, _Py_CODEUNIT *instr)
{
    return frame->f_code->_co_monitoring->base[instr_index(frame, instr)];
}

static int
deliver_jump(PyThreadState *tstate, PyCodeObject *code, int site, int event,
             PyObject *dest)
{
    uint8_t tools = site_tools(code, site, event);
    if (_PyErr_Occurred(tstate)) {
        return deliver_during_exception(tstate, code, site, event, tools,
                                        dest, NULL);
    }
    return deliver(tstate, code, site, event, tools, dest, NULL);
}

/* JUMP, or BRANCH and then BRANCH_LEFT (the branch goes on) or
   BRANCH_RIGHT, from `site` to `to`. */
static int
fire_jump(PyThreadState *tstate, PyCodeObject *code, int site, int to,
          int event)
{
    PyObject *offset = PyLong_FromLong(to * (long)sizeof(_Py_CODEUNIT));
    if (offset == NULL) {
        return -1;
    }
    int err = deliver_jump(tstate, code, site,
                           event == EVENT(JUMP) ? event : EVENT(BRANCH),
                           offset);
    if (err == 0 && event != EVENT(JUMP)) {
        err = deliver_jump(tstate, code, site, event, offset);
    }
    Py_DECREF(offset);
    return err;
}

int
_PyMonitoring_FireJump(PyThreadState *tstate, _PyInterpreterFrame *frame,
                       _Py_CODEUNIT *instr, _Py_CODEUNIT *dest)
{
    PyCodeObject *code = frame->f_code;
    int site = instr_index(frame, instr);
    int to = instr_index(frame, dest);
    int event = jump_event(unit_base(code, site));
    if (event == EVENT(BRANCH)) {
        event = to == site + 1 ? EVENT(BRANCH_LEFT) : EVENT(BRANCH_RIGHT);
    }
    return fire_jump(tstate, code, site, to, event);
}

/* An async for asks for its next item with GET_ANEXT and awaits it with a
   SEND, in a range of code whose exception handler is the loop's
   END_ASYNC_FOR.  As in 3.14, the loop's branch is told at that SEND: it
   goes on (BRANCH_LEFT) where the SEND gets an item, and ends
   (BRANCH_RIGHT, to after END_ASYNC_FOR) where StopAsyncIteration comes. */

int
_PyMonitoring_FireAsyncForNext(PyThreadState *tstate,
                               _PyInterpreterFrame *frame,
                               _Py_CODEUNIT *instr, int oparg)
{
    PyCodeObject *code = frame->f_code;
    int site = instr_index(frame, instr);
    handler_walk walk;
    handlers_begin(code, &walk);
    while (handlers_next(&walk)) {
        if (walk.start <= site && site < walk.end) {
            if (unit_base(code, walk.handler) != END_ASYNC_FOR) {
                break;
            }
            return fire_jump(tstate, code, site, site + 1 + oparg,
                             EVENT(BRANCH_LEFT));
        }
    }
    /* Another await or yield from. */
    return 0;
}

int
_PyMonitoring_FireAsyncForEnd(PyThreadState *tstate,
                              _PyInterpreterFrame *frame,
                              _Py_CODEUNIT *instr)
{
    PyCodeObject *code = frame->f_code;
    int handler = instr_index(frame, instr);
    /* The SEND: the first in the range this END_ASYNC_FOR handles. */
    handler_walk walk;
    handlers_begin(code, &walk);
    while (handlers_next(&walk)) {
        if (walk.handler != handler) {
            continue;
        }
        for (int i = walk.start; i < walk.end; i = next_instruction(code, i)) {
            if (unit_base(code, i) == SEND) {
                return fire_jump(tstate, code, i, handler + 1,
                                 EVENT(BRANCH_RIGHT));
            }
        }
    }
    return 0;
}

int
_PyMonitoring_DecideJump(PyThreadState *tstate, _PyInterpreterFrame *frame,
                         _Py_CODEUNIT *instr, int oparg, PyObject **cond)
{
    int site = instr_index(frame, instr);
    int base = unit_base(frame->f_code, site);
    int taken;
    switch (base) {
        case JUMP_FORWARD:
        case JUMP_BACKWARD:
            taken = 1;
            break;
        case POP_JUMP_FORWARD_IF_NONE:
        case POP_JUMP_BACKWARD_IF_NONE:
            taken = Py_IsNone(*cond);
            break;
        case POP_JUMP_FORWARD_IF_NOT_NONE:
        case POP_JUMP_BACKWARD_IF_NOT_NONE:
            taken = !Py_IsNone(*cond);
            break;
        default: {
            int truth = PyObject_IsTrue(*cond);
            if (truth < 0) {
                return -1;
            }
            int if_true = base == POP_JUMP_FORWARD_IF_TRUE
                          || base == POP_JUMP_BACKWARD_IF_TRUE
                          || base == JUMP_IF_TRUE_OR_POP;
            taken = truth == if_true;
            /* The jump's own instruction, which pops the condition, must
               not ask it again. */
            if (base != JUMP_IF_TRUE_OR_POP && base != JUMP_IF_FALSE_OR_POP
                && !PyBool_Check(*cond))
            {
                Py_SETREF(*cond, Py_NewRef(truth ? Py_True : Py_False));
            }
        }
    }
    int dest = taken ? jump_target(base, site, oparg) : site + 1;
    if (_PyMonitoring_FireJump(tstate, frame, instr,
                               _PyCode_CODE(frame->f_code) + dest) < 0)
    {
        return -1;
    }
    return taken;
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

/* Only `code` changes: it is brought up to date at once if it was (as all
   executing code is), otherwise when it next runs. */
static int
set_local_events(PyInterpreterState *interp, int tool_id, PyCodeObject *code,
                 uint32_t events)
{
    assert((events & ~_PY_MONITORING_LOCAL_EVENTS) == 0);
    _PyCoMonitoringData *data = code_data(code);
    if (data == NULL) {
        return -1;
    }
    forget_void_marks(interp, code, data);
    uint32_t old = local_events(interp, data, tool_id);
    for (int event = 0; event < _PY_MONITORING_EVENTS; event++) {
        if ((events >> event) & 1) {
            data->local[LOCAL(event)] |= 1 << tool_id;
        }
        else if (IS_LOCAL(event)) {
            data->local[LOCAL(event)] &= ~(1 << tool_id);
        }
    }
    interp->monitoring.local_union |= events;
    _PyMonitoring_EverUsed = 1;
    if (old != events
        && code->_co_monitoring_version == interp->monitoring.version)
    {
        return instrument(code, interp);
    }
    return 0;
}

/* Drops what a tool has: its events, global and local, and callbacks. */
static int
clear_tool(PyInterpreterState *interp, int tool_id)
{
    struct _Py_monitoring_state *state = &interp->monitoring;
    for (int event = 0; event < _PY_MONITORING_EVENTS; event++) {
        Py_CLEAR(state->callbacks[tool_id][event]);
        state->native[tool_id][event].func = NULL;
        state->global[event] &= ~(1 << tool_id);
    }
    state->builtin_calls_only &= ~(1 << tool_id);
    state->cleared_at[tool_id] = ++state->clears;
    return instrument_executing_code(interp);
}


/* For tools written in C (pycore_monitoring.h) */

int
_PyMonitoring_ClaimTool(PyInterpreterState *interp, int tool_id,
                        const char *name)
{
    assert(0 <= tool_id && tool_id < _PY_MONITORING_USER_TOOL_IDS);
    PyObject **slot = &interp->monitoring.tool_names[tool_id];
    if (*slot != NULL) {
        PyErr_Format(PyExc_ValueError, "tool %d is already in use", tool_id);
        return -1;
    }
    *slot = PyUnicode_FromString(name);
    return *slot == NULL ? -1 : 0;
}

int
_PyMonitoring_IsToolClaimedAs(PyInterpreterState *interp, int tool_id,
                              const char *name)
{
    PyObject *owner = interp->monitoring.tool_names[tool_id];
    return owner != NULL && PyUnicode_Check(owner)
           && _PyUnicode_EqualToASCIIString(owner, name);
}

int
_PyMonitoring_ReleaseTool(PyInterpreterState *interp, int tool_id)
{
    int err = clear_tool(interp, tool_id);
    Py_CLEAR(interp->monitoring.tool_names[tool_id]);
    return err;
}

void
_PyMonitoring_SetNativeCallback(PyInterpreterState *interp, int tool_id,
                                int event, _PyMonitoring_NativeCallback func,
                                void *arg)
{
    assert(0 <= tool_id && tool_id < _PY_MONITORING_TOOL_IDS);
    assert(0 <= event && event < _PY_MONITORING_EVENTS);
    struct _Py_monitoring_state *state = &interp->monitoring;
    Py_CLEAR(state->callbacks[tool_id][event]);
    state->native[tool_id][event].func = func;
    state->native[tool_id][event].arg = arg;
}

void
_PyMonitoring_SetBuiltinCallsOnly(PyInterpreterState *interp, int tool_id,
                            int builtin_calls_only)
{
    assert(0 <= tool_id && tool_id < _PY_MONITORING_TOOL_IDS);
    if (builtin_calls_only) {
        interp->monitoring.builtin_calls_only |= 1 << tool_id;
    }
    else {
        interp->monitoring.builtin_calls_only &= ~(1 << tool_id);
    }
}

void
_PyMonitoring_SetProfilerOf(PyInterpreterState *interp,
                            PyObject *(*func)(void *, PyThreadState *),
                            void *arg)
{
    interp->monitoring.profiler_of = func;
    interp->monitoring.profiler_of_arg = arg;
}

PyObject *
_PyMonitoring_ProfilerOf(PyThreadState *tstate)
{
    struct _Py_monitoring_state *state = &tstate->interp->monitoring;
    return state->profiler_of == NULL
           ? NULL : state->profiler_of(state->profiler_of_arg, tstate);
}

int
_PyMonitoring_SetToolEvents(PyInterpreterState *interp, int tool_id,
                            uint32_t events)
{
    assert(0 <= tool_id && tool_id < _PY_MONITORING_TOOL_IDS);
    assert((events & ~ALL_EVENTS) == 0);
    return set_global_events(interp, tool_id,
                             events & ~(C_CALL_EVENTS & ~(1 << EVENT(CALL))));
}

int
_PyMonitoring_SetToolLocalEvents(PyInterpreterState *interp, int tool_id,
                                 PyCodeObject *code, uint32_t events)
{
    assert(0 <= tool_id && tool_id < _PY_MONITORING_TOOL_IDS);
    events &= ~(C_CALL_EVENTS & ~(1 << EVENT(CALL)));
    assert((events & ~_PY_MONITORING_LOCAL_EVENTS) == 0);
    return set_local_events(interp, tool_id, code, events);
}

int
_PyMonitoring_ClearTool(PyInterpreterState *interp, int tool_id)
{
    assert(0 <= tool_id && tool_id < _PY_MONITORING_TOOL_IDS);
    return clear_tool(interp, tool_id);
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
        PyErr_Format(PyExc_ValueError, "tool name must be a str, not %.200s",
                     Py_TYPE(name)->tp_name);
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
                     "callback must be callable or None, not %.200s",
                     Py_TYPE(func)->tp_name);
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
    /* A C callback there is replaced too; it has no object to return. */
    interp->monitoring.native[tool_id][event_id].func = NULL;
    if (event_id == EVENT(CALL)) {
        interp->monitoring.builtin_calls_only &= ~(1 << tool_id);
    }
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
        PyErr_Format(PyExc_TypeError,
                     "code must be a code object, not %.200s",
                     Py_TYPE(code)->tp_name);
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
    if (set_local_events(interp, tool_id, co, (uint32_t)event_set) < 0) {
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

/* Inserts or removes the marker of `tool_id` at `offset` in `code`.  A
   marker changes nothing but its instruction: code that is up to date is
   brought up to date there, other code will be when it runs. */
static PyObject *
change_marker(int tool_id, PyObject *code, int offset, int insert)
{
    PyInterpreterState *interp = _PyInterpreterState_GET();
    PyCodeObject *co = check_code(code);
    if (co == NULL || check_tool(interp, tool_id, 1) < 0) {
        return NULL;
    }
    _PyCoMonitoringData *data = code_data(co);
    if (data == NULL) {
        return NULL;
    }
    forget_void_marks(interp, co, data);
    int site = offset / (int)sizeof(_Py_CODEUNIT);
    if (offset < 0 || offset % sizeof(_Py_CODEUNIT) != 0
        || site >= Py_SIZE(co) || data->base[site] == CACHE)
    {
        PyErr_Format(PyExc_ValueError,
                     "offset %d is not the start of an instruction", offset);
        return NULL;
    }
    if (!hookable(co, data, site)) {
        PyErr_Format(PyExc_ValueError,
                     "a marker cannot be at offset %d: it must come after "
                     "the code's first RESUME, and not on a RESUME",
                     offset);
        return NULL;
    }
    if (PySys_Audit(insert ? "sys.monitoring.insert_marker"
                           : "sys.monitoring.remove_marker",
                    "iOi", tool_id, code, offset) < 0)
    {
        return NULL;
    }
    int present = (unit_marks(data, MARK(INSERTED), site) >> tool_id) & 1;
    if (insert == present) {
        if (insert) {
            Py_RETURN_NONE;
        }
        PyErr_Format(PyExc_ValueError, "tool %d has no marker at offset %d",
                     tool_id, offset);
        return NULL;
    }
    if (insert && data->markers >= _PY_MONITORING_MAX_MARKERS) {
        PyErr_Format(PyExc_ValueError,
                     "a code object can have at most %d markers",
                     _PY_MONITORING_MAX_MARKERS);
        return NULL;
    }
    uint8_t *markers = marks_of(co, data, MARK(INSERTED));
    if (markers == NULL) {
        return NULL;
    }
    markers[site] ^= 1 << tool_id;
    data->markers += insert ? 1 : -1;
    if (co->_co_monitoring_version == interp->monitoring.version) {
        quicken_now(co);
        update_instruction(co, data, site);
    }
    check_instrumentation(co, interp);
    Py_RETURN_NONE;
}

/*[clinic input]
monitoring.insert_marker

    tool_id: int
    code: object
    offset: int
    /

Put a marker of tool_id before the instruction at offset in code.

Where a marker is, the tool's MARKER callback is called, if the tool has
MARKER events set for the code.  A code object takes at most 255 markers.
[clinic start generated code]*/

static PyObject *
monitoring_insert_marker_impl(PyObject *module, int tool_id, PyObject *code,
                              int offset)
/*[clinic end generated code: output=28b611787fd49109 input=4b93d262c5c96b98]*/
{
    return change_marker(tool_id, code, offset, 1);
}

/*[clinic input]
monitoring.remove_marker

    tool_id: int
    code: object
    offset: int
    /

Remove the marker of tool_id at offset in code.
[clinic start generated code]*/

static PyObject *
monitoring_remove_marker_impl(PyObject *module, int tool_id, PyObject *code,
                              int offset)
/*[clinic end generated code: output=40e2e7635dd46830 input=d4b71db563837200]*/
{
    return change_marker(tool_id, code, offset, 0);
}

/*[clinic input]
monitoring._all_events

The tools that have each event set for all code, by event name.

A private helper of CPython 3.12's, which tools' tests call to check that
they left nothing behind.
[clinic start generated code]*/

static PyObject *
monitoring__all_events_impl(PyObject *module)
/*[clinic end generated code: output=6b7581e2dbb690f6 input=a0245ca3c26e00dc]*/
{
    struct _Py_monitoring_state *state =
        &_PyInterpreterState_GET()->monitoring;
    PyObject *res = PyDict_New();
    if (res == NULL) {
        return NULL;
    }
    for (int event = 0; event < _PY_MONITORING_EVENTS; event++) {
        uint8_t tools = state->global[event];
        if (tools == 0) {
            continue;
        }
        PyObject *mask = PyLong_FromLong(tools);
        if (mask == NULL
            || PyDict_SetItemString(res, event_names[event], mask) < 0)
        {
            Py_XDECREF(mask);
            Py_DECREF(res);
            return NULL;
        }
        Py_DECREF(mask);
    }
    return res;
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
    MONITORING_INSERT_MARKER_METHODDEF
    MONITORING_REMOVE_MARKER_METHODDEF
    MONITORING__ALL_EVENTS_METHODDEF
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
    memset(state->native, 0, sizeof(state->native));
    state->profiled_threads = 0;
    state->profiler_of = NULL;
    state->builtin_calls_only = 0;
    state->version++;
}
