/* The deterministic profiler behind cProfile and profiling.tracing: the
   _lsprof module, as a client of sys.monitoring.

   Its events come as C callbacks of the tool PROFILER_ID (claimed as
   "cProfile", as 3.12's cProfile claims it), with no Python call and no
   object made per event.  One set of callbacks serves every enabled
   Profiler, so several can run at once, and each records per thread.

   A Profiler records a calling context tree per thread: a node per call
   path, keyed by its parent and what was entered (a code object, or the
   PyMethodDef of a C function), holding the calls made on that path and
   the ticks spent there and below.  What pstats wants (per function, per
   caller and callee, with times that count each recursive call once) is
   derived from the trees when asked, as are the exports.  Frames are
   opened by PY_START (a call), PY_RESUME and PY_THROW (the same call going
   on: a generator counts one call however often it is resumed), and
   closed by PY_RETURN, PY_YIELD and PY_UNWIND; a C function is timed
   from CALL to C_RETURN or C_RAISE. */

#ifndef Py_BUILD_CORE_BUILTIN
#  define Py_BUILD_CORE_MODULE 1
#endif

#include "Python.h"
#include "pycore_call.h"          // _PyObject_CallNoArgs()
#include "pycore_memtrack.h"      // _Py_memtrack
#include "pycore_monitoring.h"    // _PyMonitoring_SetNativeCallback()
#include "pycore_pystate.h"       // _PyThreadState_GET()
#include "clock.h"
#include "table.h"

#define EVENT(name) _PY_MONITORING_EVENT_##name
/* sys.monitoring.PROFILER_ID, and the name 3.12's cProfile uses. */
#define PROFILER_TOOL 2
#define PROFILER_TOOL_NAME "cProfile"

#define PY_EVENTS \
    (1u << EVENT(PY_START) | 1u << EVENT(PY_RESUME) | 1u << EVENT(PY_THROW) \
     | 1u << EVENT(PY_RETURN) | 1u << EVENT(PY_YIELD) \
     | 1u << EVENT(PY_UNWIND))
#define C_EVENTS \
    (1u << EVENT(CALL) | 1u << EVENT(C_RETURN) | 1u << EVENT(C_RAISE))

/* A node of a calling context tree.  A thread's root has no key. */
typedef struct {
    void *key;
    int32_t parent;
    int32_t function;
    int64_t calls;
    /* Ticks spent in this node's closed frames, callees included, and
       with memory the bytes allocated there and those retained (allocated
       less freed).  What they took outside callees is found when asked
       (node_totals()): what its children took is what its frames'
       callees took. */
    int64_t ticks;
    int64_t allocated;
    int64_t retained;
} Node;

/* A frame open on a thread's stack: its node, and the time and with
   memory the allocator's counts at its start. */
typedef struct {
    int32_t node;
    int64_t start;
    int64_t allocated_start;
    int64_t retained_start;
} Frame;

/* An edge of a tree: from the node `parent`, for a callee's `key`, to the
   node `child`. */
typedef struct {
    void *key;
    int32_t parent;
    int32_t child;
} CachedEdge;

/* Slots of the cache of edges taken lately (a power of two): most calls
   take an edge taken shortly before, a loop's or a recursion's. */
#define EDGE_CACHE_SIZE 1024

/* A thread's stack starts with a frame for its tree's root, which stays
   open: frames are entered from it like from any other. */
typedef struct {
    /* PyThreadState.id, never reused, and threading.get_ident(). */
    uint64_t id;
    unsigned long ident;
    int32_t depth;
    int32_t capacity;
    Frame *stack;
} ThreadRecord;

/* What a key stands for: the code object, or a str naming a C function
   as 3.11's cProfile names it. */
typedef struct {
    void *key;
    PyObject *label;
} Function;

/* Whether a profiler with `include` records a code object. */
typedef struct {
    PyCodeObject *code;
    int recorded;
} Verdict;

typedef struct {
    PyObject_HEAD
    int subcalls;
    int builtins;
    int all_threads;
    /* Counts memory too (on a --with-memory-tracking build). */
    int memory;
    int enabled;
    /* The module serving it while it is enabled. */
    struct module_state *state;
    /* The thread that enabled it: the only one it records unless
       all_threads. */
    uint64_t thread_id;
    PyObject *timer;
    double timeunit;
    /* The timer failed: the profiler stopped there. */
    int timer_failed;
    /* What the profiler adds to a call, in seconds, taken out of the
       times reported: to the callee's own time and to its caller's, for
       Python functions then built-ins (set_overhead()). */
    int has_overhead;
    double overhead[2][2];
    int out_of_memory;
    /* The prefixes of the names of the files whose code it records, or
       NULL for all code. */
    PyObject *include;
    Verdict *verdicts;
    int32_t nverdicts;
    int32_t verdicts_capacity;
    IndexTable verdict_table;

    ThreadRecord *threads;
    int32_t nthreads;
    int32_t threads_capacity;
    /* The record found last: most events are of the same thread. */
    ThreadRecord *last_thread;

    Node *nodes;
    int32_t nnodes;
    int32_t nodes_capacity;
    IndexTable node_table;
    CachedEdge edge_cache[EDGE_CACHE_SIZE];

    Function *functions;
    int32_t nfunctions;
    int32_t functions_capacity;
    IndexTable function_table;
} ProfilerObject;

typedef struct module_state {
    PyTypeObject *profiler_type;
    PyTypeObject *stats_entry_type;
    PyTypeObject *stats_subentry_type;
    /* The enabled profilers, each with a reference, that the callbacks
       serve. */
    ProfilerObject **enabled;
    Py_ssize_t nenabled;
    Py_ssize_t enabled_capacity;
    /* Some enabled profiler's timer failed during this event. */
    int failed;
    /* Every enabled profiler has an `include` (the code they record is
       found as it starts, and given local events), and so had they since
       the tool was last cleared: events were disabled where none records
       the code, which a profiler enabled later may want. */
    int filtered;
    int was_filtered;
    /* In that case, the code given local events (strong references), and
       those events. */
    PyCodeObject **localized;
    int32_t nlocalized;
    int32_t localized_capacity;
    IndexTable localized_table;
    uint32_t local_events;
    profiling_clock clock;
} module_state;

static inline module_state *
get_module_state(PyObject *module)
{
    return (module_state *)PyModule_GetState(module);
}

static struct PyModuleDef tracing_module;

/* The module of a profiler's type, or of the base of its subclass. */
static module_state *
state_of(ProfilerObject *self)
{
    PyObject *module = PyType_GetModuleByDef(Py_TYPE(self), &tracing_module);
    assert(module != NULL);
    return get_module_state(module);
}

/*[clinic input]
module _lsprof
class _lsprof.Profiler "ProfilerObject *" "&PyBaseObject_Type"
[clinic start generated code]*/
/*[clinic end generated code: output=da39a3ee5e6b4b0d input=c9f8d2b690d37a83]*/

#include "clinic/tracing.c.h"


/* Tables (table.h), kept at most half full: their lookups are on every
   call. */

#define TABLE_QUARTERS 2

static inline uint32_t
hash_key(void *key, int32_t parent)
{
    return table_hash(key, (uint32_t)parent);
}

static uint32_t
node_hash(void *owner, int32_t index)
{
    Node *node = &((ProfilerObject *)owner)->nodes[index];
    return hash_key(node->key, node->parent);
}

static uint32_t
verdict_hash(void *owner, int32_t index)
{
    return hash_key(((ProfilerObject *)owner)->verdicts[index].code, 0);
}

static uint32_t
function_hash(void *owner, int32_t index)
{
    return hash_key(((ProfilerObject *)owner)->functions[index].key, 0);
}

static int
grow(void **array, int32_t *capacity, int32_t count, size_t item)
{
    if (count < *capacity) {
        return 0;
    }
    if (*capacity > INT32_MAX / 2) {
        return -1;
    }
    int32_t wanted = *capacity ? *capacity * 2 : 16;
    void *bigger = PyMem_Realloc(*array, (size_t)wanted * item);
    if (bigger == NULL) {
        return -1;
    }
    *array = bigger;
    *capacity = wanted;
    return 0;
}


/* Names of C functions, as 3.11's cProfile gives them: a built-in
   function by its module and name, a method by the repr of what its
   type holds under its name. */
static PyObject *
c_function_label(PyObject *callable)
{
    if (Py_IS_TYPE(callable, &PyMethodDescr_Type)) {
        return PyObject_Repr(callable);
    }
    assert(PyCFunction_Check(callable));
    PyCFunctionObject *fn = (PyCFunctionObject *)callable;
    const char *name = fn->m_ml->ml_name;
    if (fn->m_self == NULL) {
        PyObject *module = fn->m_module;
        PyObject *modname = NULL;
        if (module != NULL && PyUnicode_Check(module)) {
            modname = Py_NewRef(module);
        }
        else if (module != NULL && PyModule_Check(module)) {
            modname = PyModule_GetNameObject(module);
            if (modname == NULL) {
                PyErr_Clear();
            }
        }
        PyObject *label;
        if (modname != NULL
            && !_PyUnicode_EqualToASCIIString(modname, "builtins"))
        {
            label = PyUnicode_FromFormat("<%U.%s>", modname, name);
        }
        else {
            label = PyUnicode_FromFormat("<%s>", name);
        }
        Py_XDECREF(modname);
        return label;
    }
    PyObject *attr = PyUnicode_FromString(name);
    if (attr == NULL) {
        return NULL;
    }
    PyObject *method = _PyType_Lookup(Py_TYPE(fn->m_self), attr);
    Py_DECREF(attr);
    if (method != NULL) {
        PyObject *label = PyObject_Repr(method);
        if (label != NULL) {
            return label;
        }
        PyErr_Clear();
    }
    if (fn->m_module != NULL && PyUnicode_Check(fn->m_module)) {
        return PyUnicode_FromFormat("<built-in method %U.%s>",
                                    fn->m_module, name);
    }
    return PyUnicode_FromFormat("<built-in method %s>", name);
}

/* The function of `key`, made from `source` (a code object or a C
   callable) the first time; -1 when out of memory. */
static int
function_has_key(void *owner, int32_t index, const void *key)
{
    return ((ProfilerObject *)owner)->functions[index].key == key;
}

static int32_t
function_of(ProfilerObject *self, void *key, PyObject *source)
{
    IndexTable *table = &self->function_table;
    int32_t found = table_find(table, hash_key(key, 0), self, key,
                               function_has_key);
    if (found >= 0) {
        return found;
    }
    if (table_reserve(table, TABLE_QUARTERS, self, function_hash) < 0
        || grow((void **)&self->functions, &self->functions_capacity,
                self->nfunctions, sizeof(Function)) < 0)
    {
        return -1;
    }
    PyObject *label = PyCode_Check(source) ? Py_NewRef(source)
                                           : c_function_label(source);
    if (label == NULL) {
        /* A name that cannot be made is no reason to stop profiling. */
        PyErr_Clear();
        label = PyUnicode_FromString("<unknown C function>");
        if (label == NULL) {
            PyErr_Clear();
            return -1;
        }
    }
    int32_t index = self->nfunctions++;
    self->functions[index].key = key;
    self->functions[index].label = label;
    table_add(table, hash_key(key, 0), index);
    return index;
}

static int32_t
new_node(ProfilerObject *self, void *key, int32_t parent, int32_t function)
{
    if (grow((void **)&self->nodes, &self->nodes_capacity, self->nnodes,
             sizeof(Node)) < 0)
    {
        return -1;
    }
    int32_t index = self->nnodes++;
    self->nodes[index] = (Node){.key = key, .parent = parent,
                                .function = function};
    return index;
}

typedef struct {
    void *key;
    int32_t parent;
} NodeKey;

static int
node_has_key(void *owner, int32_t index, const void *key)
{
    const NodeKey *wanted = key;
    Node *node = &((ProfilerObject *)owner)->nodes[index];
    return node->key == wanted->key && node->parent == wanted->parent;
}

/* The child of `parent` for `key`, made if need be. */
static Py_NO_INLINE int32_t
find_or_make_child(ProfilerObject *self, int32_t parent, void *key,
                   PyObject *source)
{
    IndexTable *table = &self->node_table;
    uint32_t hash = hash_key(key, parent);
    NodeKey wanted = {key, parent};
    int32_t found = table_find(table, hash, self, &wanted, node_has_key);
    if (found >= 0) {
        return found;
    }
    if (table_reserve(table, TABLE_QUARTERS, self, node_hash) < 0) {
        return -1;
    }
    int32_t function = function_of(self, key, source);
    if (function < 0) {
        return -1;
    }
    int32_t index = new_node(self, key, parent, function);
    if (index < 0) {
        return -1;
    }
    table_add(table, hash, index);
    return index;
}

static ThreadRecord *find_thread_record(ProfilerObject *self,
                                       PyThreadState *tstate);

/* The record of the thread of `tstate`, made if need be; NULL if this
   profiler does not record that thread. */
static inline ThreadRecord *
thread_record(ProfilerObject *self, PyThreadState *tstate)
{
    if (!self->all_threads && tstate->id != self->thread_id) {
        return NULL;
    }
    if (self->last_thread != NULL && self->last_thread->id == tstate->id) {
        return self->last_thread;
    }
    return find_thread_record(self, tstate);
}

static Py_NO_INLINE ThreadRecord *
find_thread_record(ProfilerObject *self, PyThreadState *tstate)
{
    for (int32_t i = 0; i < self->nthreads; i++) {
        if (self->threads[i].id == tstate->id) {
            self->last_thread = &self->threads[i];
            return self->last_thread;
        }
    }
    Frame *stack = PyMem_Malloc(16 * sizeof(Frame));
    int32_t root = new_node(self, NULL, -1, -1);
    if (stack == NULL || root < 0
        || grow((void **)&self->threads, &self->threads_capacity,
                self->nthreads, sizeof(ThreadRecord)) < 0)
    {
        PyMem_Free(stack);
        self->out_of_memory = 1;
        return NULL;
    }
    stack[0] = (Frame){.node = root};
    int32_t i = self->nthreads++;
    self->threads[i] = (ThreadRecord){.id = tstate->id,
                                      .ident = tstate->thread_id,
                                      .depth = 1, .capacity = 16,
                                      .stack = stack};
    self->last_thread = &self->threads[i];
    return self->last_thread;
}


/* Time */

/* The time by the profiler's own timer, in ticks: nanoseconds, or the
   timer's units where timeunit is given.  A timer that fails stops the
   profiler; its exception goes to sys.unraisablehook, as in 3.11 (where
   the profiler went on). */
static int64_t
timer_ticks(ProfilerObject *self, module_state *state)
{
    /* An exception being propagated is set during some events. */
    PyObject *type, *exc, *tb;
    PyErr_Fetch(&type, &exc, &tb);
    int64_t ticks = 0;
    int ok = 0;
    PyObject *value = _PyObject_CallNoArgs(self->timer);
    if (value != NULL) {
        _PyTime_t t;
        ok = (self->timeunit > 0.0
              ? _PyTime_FromNanosecondsObject(&t, value)
              : _PyTime_FromSecondsObject(&t, value, _PyTime_ROUND_FLOOR))
             == 0;
        Py_DECREF(value);
        if (ok) {
            ticks = (int64_t)t;
        }
    }
    if (!ok) {
        _PyErr_WriteUnraisableMsg("in the timer of a profiler, which stopped",
                                  self->timer);
        self->timer_failed = 1;
        state->failed = 1;
    }
    PyErr_Restore(type, exc, tb);
    return ticks;
}

static inline int64_t
ticks_now(ProfilerObject *self, module_state *state, int64_t clock_now)
{
    return self->timer == NULL ? clock_now : timer_ticks(self, state);
}

static double
seconds_per_tick(ProfilerObject *self, module_state *state)
{
    if (self->timer == NULL) {
        return profiling_clock_seconds_per_tick(&state->clock);
    }
    return self->timeunit > 0.0 ? self->timeunit : 1e-9;
}


/* Memory: the counts of the allocators under the GIL.  Between two events
   of a thread, only that thread allocates there, but while it waits for
   the GIL, others do: what they allocate meanwhile counts for the frames
   open in it. */
#ifdef Py_TRACK_MEMORY
#  define MEMORY_ALLOCATED() ((int64_t)_Py_memtrack.allocated)
#  define MEMORY_RETAINED() ((int64_t)_Py_memtrack.bytes)
#else
#  define MEMORY_ALLOCATED() 0
#  define MEMORY_RETAINED() 0
#endif


/* Frames */

/* The slot of the edge from `parent` for `key` in the cache: the key's
   bits above an object's alignment, and the parent's, spread apart. */
static inline CachedEdge *
cached_edge(ProfilerObject *self, int32_t parent, void *key)
{
    size_t slot = ((uintptr_t)key >> 4) ^ ((size_t)parent << 3);
    return &self->edge_cache[slot & (EDGE_CACHE_SIZE - 1)];
}

static inline void
push_frame(ProfilerObject *self, ThreadRecord *thread, int32_t node,
           int call, int64_t now)
{
    assert(thread->depth < thread->capacity);
    self->nodes[node].calls += call;
    Frame *frame = &thread->stack[thread->depth++];
    *frame = (Frame){.node = node, .start = now};
    if (self->memory) {
        frame->allocated_start = MEMORY_ALLOCATED();
        frame->retained_start = MEMORY_RETAINED();
    }
}

/* open_frame() where the edge is not in the cache or the stack is
   full. */
static Py_NO_INLINE int
open_frame_further(ProfilerObject *self, ThreadRecord *thread, void *key,
                   PyObject *source, int call, int64_t now)
{
    int32_t parent = thread->stack[thread->depth - 1].node;
    CachedEdge *edge = cached_edge(self, parent, key);
    if (edge->key != key || edge->parent != parent) {
        int32_t node = find_or_make_child(self, parent, key, source);
        if (node < 0) {
            self->out_of_memory = 1;
            return 0;
        }
        *edge = (CachedEdge){.key = key, .parent = parent, .child = node};
    }
    if (grow((void **)&thread->stack, &thread->capacity, thread->depth,
             sizeof(Frame)) < 0)
    {
        self->out_of_memory = 1;
        return 0;
    }
    push_frame(self, thread, edge->child, call, now);
    return 0;
}

/* Opens a frame of `key` on `thread`'s stack.  Returns 0.  Its most
   frequent case is inline, the others a tail call: the callbacks then
   need no registers saved on their way. */
static inline Py_ALWAYS_INLINE int
open_frame(ProfilerObject *self, ThreadRecord *thread, void *key,
           PyObject *source, int call, int64_t now)
{
    int32_t parent = thread->stack[thread->depth - 1].node;
    CachedEdge *edge = cached_edge(self, parent, key);
    if (edge->key != key || edge->parent != parent
        || thread->depth == thread->capacity)
    {
        return open_frame_further(self, thread, key, source, call, now);
    }
    push_frame(self, thread, edge->child, call, now);
    return 0;
}

static inline void
close_top_frame(ProfilerObject *self, ThreadRecord *thread, int64_t now)
{
    assert(thread->depth > 1);
    Frame *frame = &thread->stack[--thread->depth];
    Node *node = &self->nodes[frame->node];
    node->ticks += now - frame->start;
    if (self->memory) {
        node->allocated += MEMORY_ALLOCATED() - frame->allocated_start;
        node->retained += MEMORY_RETAINED() - frame->retained_start;
    }
}

/* Closes the innermost open frame of `key` and those above it, whose
   closing events were not seen (a C function's result told to no one
   after an instrumentation change, say).  A frame opened before the
   profiler was enabled is on no stack: nothing to close. */
static Py_NO_INLINE int
close_frames_down_to(ProfilerObject *self, ThreadRecord *thread, void *key,
                     int64_t now)
{
    int32_t depth = thread->depth;
    while (depth > 1
           && self->nodes[thread->stack[depth - 1].node].key != key)
    {
        depth--;
    }
    while (depth > 1 && thread->depth >= depth) {
        close_top_frame(self, thread, now);
    }
    return 0;
}

/* Closes the innermost open frame, of `key` most often.  Returns 0. */
static inline Py_ALWAYS_INLINE int
close_frame(ProfilerObject *self, ThreadRecord *thread, void *key,
            int64_t now)
{
    if (thread->depth > 1
        && self->nodes[thread->stack[thread->depth - 1].node].key == key)
    {
        close_top_frame(self, thread, now);
        return 0;
    }
    return close_frames_down_to(self, thread, key, now);
}

/* The time to close the open frames with: now, or where the timer failed
   the last time known. */
static int64_t
closing_time(ProfilerObject *self, module_state *state)
{
    if (self->timer == NULL) {
        return profiling_clock_now(&state->clock);
    }
    if (!self->timer_failed) {
        int64_t now = timer_ticks(self, state);
        if (!self->timer_failed) {
            return now;
        }
    }
    int64_t now = 0;
    for (int32_t i = 0; i < self->nthreads; i++) {
        ThreadRecord *thread = &self->threads[i];
        if (thread->depth > 1) {
            now = Py_MAX(now, thread->stack[thread->depth - 1].start);
        }
    }
    return now;
}

static void
close_all_frames(ProfilerObject *self, int64_t now)
{
    for (int32_t i = 0; i < self->nthreads; i++) {
        while (self->threads[i].depth > 1) {
            close_top_frame(self, &self->threads[i], now);
        }
    }
}


/* The profilers as clients of sys.monitoring */

static int set_events(module_state *state);
static int stop_serving(module_state *state, ProfilerObject *self);

/* After an event in which a timer failed: the profilers whose timer
   failed stop. */
static Py_NO_INLINE void
drop_failed(module_state *state)
{
    /* An exception being propagated is set during some events, and
       dropping a profiler may run code. */
    PyObject *type, *exc, *tb;
    PyErr_Fetch(&type, &exc, &tb);
    state->failed = 0;
    for (Py_ssize_t i = state->nenabled - 1; i >= 0; i--) {
        ProfilerObject *self = state->enabled[i];
        if (self->timer_failed && stop_serving(state, self) < 0) {
            PyErr_WriteUnraisable(NULL);
        }
    }
    PyErr_Restore(type, exc, tb);
}

/* Whether `self` records the code `code`: all code without `include`,
   else code whose file's name starts with one of its prefixes.  The
   verdict is kept per code object, which is kept alive meanwhile so
   that no other code takes its address. */
static int
verdict_has_key(void *owner, int32_t index, const void *key)
{
    return ((ProfilerObject *)owner)->verdicts[index].code == key;
}

static int
records_code(ProfilerObject *self, PyCodeObject *code)
{
    if (self->include == NULL) {
        return 1;
    }
    IndexTable *table = &self->verdict_table;
    int32_t found = table_find(table, hash_key(code, 0), self, code,
                               verdict_has_key);
    if (found >= 0) {
        return self->verdicts[found].recorded;
    }
    int recorded = 0;
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(self->include); i++) {
        Py_ssize_t match = PyUnicode_Tailmatch(
            code->co_filename, PyTuple_GET_ITEM(self->include, i), 0,
            PY_SSIZE_T_MAX, -1);
        if (match != 0) {
            recorded = match > 0;
            break;
        }
    }
    PyErr_Clear();
    if (table_reserve(table, TABLE_QUARTERS, self, verdict_hash) < 0
        || grow((void **)&self->verdicts, &self->verdicts_capacity,
                self->nverdicts, sizeof(Verdict)) < 0)
    {
        self->out_of_memory = 1;
        return recorded;
    }
    int32_t index = self->nverdicts++;
    self->verdicts[index] = (Verdict){.code = (PyCodeObject *)Py_NewRef(code),
                                      .recorded = recorded};
    table_add(table, hash_key(code, 0), index);
    return recorded;
}

static void
forget_localized(module_state *state)
{
    for (int32_t i = 0; i < state->nlocalized; i++) {
        Py_DECREF(state->localized[i]);
    }
    PyMem_Free(state->localized);
    state->localized = NULL;
    state->nlocalized = state->localized_capacity = 0;
    table_clear(&state->localized_table);
}

static uint32_t
localized_hash(void *owner, int32_t index)
{
    return hash_key(((module_state *)owner)->localized[index], 0);
}

static Py_NO_INLINE void
add_localized(module_state *state, PyCodeObject *code)
{
    IndexTable *table = &state->localized_table;
    if (table_reserve(table, TABLE_QUARTERS, state, localized_hash) < 0
        || grow((void **)&state->localized, &state->localized_capacity,
                state->nlocalized, sizeof(PyCodeObject *)) < 0)
    {
        return;
    }
    PyObject *type, *exc, *tb;
    PyErr_Fetch(&type, &exc, &tb);
    if (_PyMonitoring_SetToolLocalEvents(_PyInterpreterState_GET(),
                                         PROFILER_TOOL, code,
                                         state->local_events) < 0)
    {
        /* Out of memory only: the code goes unrecorded after its start. */
        PyErr_Clear();
        PyErr_Restore(type, exc, tb);
        return;
    }
    PyErr_Restore(type, exc, tb);
    int32_t index = state->nlocalized++;
    state->localized[index] = (PyCodeObject *)Py_NewRef(code);
    table_add(table, hash_key(code, 0), index);
}

static int
localized_has_key(void *owner, int32_t index, const void *key)
{
    return ((module_state *)owner)->localized[index] == key;
}

/* Where every enabled profiler is filtered: `code`, which one of them
   records, gets the events of returns, resumes and calls the first time
   it starts after the tool was last cleared. */
static inline void
localize(module_state *state, PyCodeObject *code)
{
    if (table_find(&state->localized_table, hash_key(code, 0), state, code,
                   localized_has_key) < 0)
    {
        add_localized(state, code);
    }
}

/* Runs `body` for each enabled profiler that records the thread of
   `tstate` and `code`, with `self`, `thread` and `now` (its time) set.
   Sets `wanted` when some profiler records `code`.  A timer (Python
   code, which monitoring silences) may enable or disable profilers
   meanwhile. */
#define FOR_EACH_RECORDING(state, tstate, code, clock_now, wanted, body) \
    do { \
        for (Py_ssize_t i_ = 0; i_ < (state)->nenabled; i_++) { \
            ProfilerObject *self = (state)->enabled[i_]; \
            if (!records_code(self, (code))) { \
                continue; \
            } \
            (wanted) = 1; \
            ThreadRecord *thread = thread_record(self, (tstate)); \
            if (thread == NULL) { \
                continue; \
            } \
            if (self->timer == NULL) { \
                int64_t now = (clock_now); \
                body \
            } \
            else { \
                Py_INCREF(self); \
                int64_t now = timer_ticks(self, (state)); \
                /* The timer may have run code that changed the \
                   profiler's records. */ \
                thread = thread_record(self, (tstate)); \
                if (thread != NULL && !self->timer_failed) { \
                    body \
                } \
                Py_DECREF(self); \
            } \
        } \
        if ((state)->failed) { \
            drop_failed(state); \
        } \
    } while (0)

/* What identifies a C function the profilers time, for the two most
   frequent types (NULL for the others): a built-in function's method
   definition, and a method descriptor's when called with its object. */
static inline void *
quick_c_function_key(PyObject *callable, PyObject *arg0)
{
    PyTypeObject *type = Py_TYPE(callable);
    if (type == &PyCFunction_Type) {
        return ((PyCFunctionObject *)callable)->m_ml;
    }
    if (type == &PyMethodDescr_Type && arg0 != _PyMonitoring_MISSING) {
        return ((PyMethodDescrObject *)callable)->d_method;
    }
    return NULL;
}

/* The same for every type, or NULL: as in 3.11, built-in functions and
   methods, and method descriptors called with their object. */
static inline void *
c_function_key(PyObject *callable, PyObject *arg0)
{
    void *key = quick_c_function_key(callable, arg0);
    if (key == NULL && Py_TYPE(callable) != &PyType_Type
        && PyCFunction_Check(callable))
    {
        /* A subclass of builtin_function_or_method: PyCMethod_Type, or
           an extension's. */
        key = ((PyCFunctionObject *)callable)->m_ml;
    }
    return key;
}

/* The events.  Each is defined once, by `op`: an int expression
   evaluated with `self`, `thread`, `now`, `key` and the arguments.
   `key_of` picks what a frame is entered for, or skips the event with
   NULL.  Each event makes two callbacks:
   - One serves every enabled profiler (the module state its argument).
     Where none records the code (all have an `include` that leaves it
     out), a local event is disabled there; where one records it, an
     event that `localizes` gives the code its local events.
   - The other serves a lone profiler of all code with the interpreter's
     clock (the profiler its argument), sparing the most frequent case
     the loop and the filter.  Where the clock needs no call,
     `quick_key_of` (no call either) finds the key, and the thread is the
     one found last, it makes no call but `op`'s last, a tail call: it
     saves no registers on its way. */
#define PROFILER_EVENT(name, key_of, quick_key_of, local, localizes, \
                       op) \
    static int \
    name(void *arg, PyThreadState *tstate, PyCodeObject *code, long where, \
         PyObject *arg1, PyObject *arg2) \
    { \
        void *key = (key_of); \
        if (key == NULL) { \
            return 0; \
        } \
        module_state *state = arg; \
        int64_t clock_now = profiling_clock_now(&state->clock); \
        int wanted = 0; \
        FOR_EACH_RECORDING(state, tstate, code, clock_now, wanted, { \
            (void)(op); \
            if ((localizes) && state->filtered) { \
                localize(state, code); \
            } \
        }); \
        return (local) && !wanted && state->nenabled > 0; \
    } \
    static Py_NO_INLINE int \
    name##_solo_further(ProfilerObject *self, PyThreadState *tstate, \
                        PyCodeObject *code, PyObject *arg1, PyObject *arg2) \
    { \
        int64_t now = profiling_clock_now(&self->state->clock); \
        void *key = (key_of); \
        ThreadRecord *thread = key ? thread_record(self, tstate) : NULL; \
        return thread != NULL ? (op) : 0; \
    } \
    static int \
    name##_solo(void *arg, PyThreadState *tstate, PyCodeObject *code, \
                long where, PyObject *arg1, PyObject *arg2) \
    { \
        ProfilerObject *self = arg; \
        assert(self->timer == NULL && self->include == NULL); \
        void *key = (quick_key_of); \
        ThreadRecord *thread = self->last_thread; \
        if (!profiling_clock_is_tsc(&self->state->clock) || key == NULL \
            || thread == NULL || thread->id != tstate->id) \
        { \
            return name##_solo_further(self, tstate, code, arg1, arg2); \
        } \
        int64_t now = profiling_clock_tsc(); \
        return (op); \
    }

PROFILER_EVENT(on_call, code, code, 1, 1,
               open_frame(self, thread, key, (PyObject *)code, 1, now))

PROFILER_EVENT(on_resume, code, code, 1, 0,
               open_frame(self, thread, key, (PyObject *)code, 0, now))

/* PY_THROW: the call goes on; not a local event. */
PROFILER_EVENT(on_throw, code, code, 0, 0,
               open_frame(self, thread, key, (PyObject *)code, 0, now))

/* PY_RETURN and PY_YIELD. */
PROFILER_EVENT(on_leave, code, code, 1, 0,
               close_frame(self, thread, key, now))

/* PY_UNWIND: not a local event. */
PROFILER_EVENT(on_unwind, code, code, 0, 0,
               close_frame(self, thread, key, now))

PROFILER_EVENT(on_c_call, c_function_key(arg1, arg2),
               quick_c_function_key(arg1, arg2), 1, 0,
               self->builtins ? open_frame(self, thread, key, arg1, 1, now)
                              : 0)

/* C_RETURN and C_RAISE: not local events. */
PROFILER_EVENT(on_c_leave, c_function_key(arg1, arg2),
               quick_c_function_key(arg1, arg2), 0, 0,
               self->builtins ? close_frame(self, thread, key, now) : 0)

#define EVENT_CALLBACKS(suffix) { \
    [EVENT(PY_START)] = on_call##suffix, \
    [EVENT(PY_RESUME)] = on_resume##suffix, \
    [EVENT(PY_THROW)] = on_throw##suffix, \
    [EVENT(PY_RETURN)] = on_leave##suffix, \
    [EVENT(PY_YIELD)] = on_leave##suffix, \
    [EVENT(PY_UNWIND)] = on_unwind##suffix, \
    [EVENT(CALL)] = on_c_call##suffix, \
    [EVENT(C_RETURN)] = on_c_leave##suffix, \
    [EVENT(C_RAISE)] = on_c_leave##suffix, \
}
static const _PyMonitoring_NativeCallback callbacks[] = EVENT_CALLBACKS();
static const _PyMonitoring_NativeCallback solo_callbacks[] =
    EVENT_CALLBACKS(_solo);


/* For sys.getprofile(): the profiler enabled last by `tstate`'s thread,
   as 3.11's cProfile was the profile object of the thread enabling it. */
static PyObject *
profiler_of(void *arg, PyThreadState *tstate)
{
    module_state *state = arg;
    for (Py_ssize_t i = state->nenabled - 1; i >= 0; i--) {
        if (state->enabled[i]->thread_id == tstate->id) {
            return (PyObject *)state->enabled[i];
        }
    }
    return NULL;
}

/* The events the enabled profilers need, set for all code; the tool is
   released when none is enabled. */
static int
set_events(module_state *state)
{
    PyInterpreterState *interp = _PyInterpreterState_GET();
    if (!_PyMonitoring_IsToolClaimedAs(interp, PROFILER_TOOL,
                                       PROFILER_TOOL_NAME))
    {
        /* Freed by someone else: nothing of ours is left there. */
        return 0;
    }
    if (state->nenabled == 0) {
        _PyMonitoring_SetProfilerOf(interp, NULL, NULL);
        forget_localized(state);
        return _PyMonitoring_ReleaseTool(interp, PROFILER_TOOL);
    }
    uint32_t events = PY_EVENTS;
    int filtered = 1;
    for (Py_ssize_t i = 0; i < state->nenabled; i++) {
        if (state->enabled[i]->builtins) {
            events |= C_EVENTS;
        }
        filtered &= state->enabled[i]->include != NULL;
    }
    int solo = state->nenabled == 1 && state->enabled[0]->timer == NULL
               && !filtered;
    state->filtered = filtered;
    state->was_filtered |= filtered;
    if (filtered) {
        /* Code not recorded must run as unprofiled: only the starts of
           code (and the events that cannot be set per code) are told
           everywhere, and code that some profiler records gets the rest
           when it first starts (localize()). */
        state->local_events = events & ~(1u << EVENT(PY_START)
                                         | 1u << EVENT(PY_THROW)
                                         | 1u << EVENT(PY_UNWIND));
        events = 1u << EVENT(PY_START) | 1u << EVENT(PY_THROW)
                 | 1u << EVENT(PY_UNWIND);
        for (Py_ssize_t i = 0; i < state->nlocalized; i++) {
            if (_PyMonitoring_SetToolLocalEvents(
                    interp, PROFILER_TOOL, state->localized[i],
                    state->local_events) < 0)
            {
                return -1;
            }
        }
    }
    _PyMonitoring_SetBuiltinCallsOnly(interp, PROFILER_TOOL, 1);
    for (size_t event = 0; event < Py_ARRAY_LENGTH(callbacks); event++) {
        if (callbacks[event] != NULL) {
            _PyMonitoring_SetNativeCallback(
                interp, PROFILER_TOOL, (int)event,
                solo ? solo_callbacks[event] : callbacks[event],
                solo ? (void *)state->enabled[0] : (void *)state);
        }
    }
    return _PyMonitoring_SetToolEvents(interp, PROFILER_TOOL, events);
}

static int
start_serving(module_state *state, ProfilerObject *self)
{
    PyInterpreterState *interp = _PyInterpreterState_GET();
    if (state->nenabled == 0
        || !_PyMonitoring_IsToolClaimedAs(interp, PROFILER_TOOL,
                                          PROFILER_TOOL_NAME))
    {
        if (_PyMonitoring_ClaimTool(interp, PROFILER_TOOL,
                                    PROFILER_TOOL_NAME) < 0)
        {
            PyErr_SetString(PyExc_ValueError,
                            "Another profiling tool is already active");
            return -1;
        }
        _PyMonitoring_SetProfilerOf(interp, profiler_of, state);
        state->was_filtered = 0;
    }
    else if (state->was_filtered) {
        /* Forget where events were disabled and set locally:
           set_events() sets them anew. */
        if (_PyMonitoring_ClearTool(interp, PROFILER_TOOL) < 0) {
            return -1;
        }
        forget_localized(state);
        state->was_filtered = 0;
    }
    if (state->nenabled == state->enabled_capacity) {
        Py_ssize_t capacity = state->enabled_capacity * 2 + 4;
        ProfilerObject **enabled = PyMem_Realloc(
            state->enabled, (size_t)capacity * sizeof(ProfilerObject *));
        if (enabled == NULL) {
            PyErr_NoMemory();
            return -1;
        }
        state->enabled = enabled;
        state->enabled_capacity = capacity;
    }
    state->enabled[state->nenabled++] = (ProfilerObject *)Py_NewRef(self);
    self->enabled = 1;
    self->state = state;
    return 0;
}

/* Takes `self` off the list and sets the events for the rest; only then
   is its reference dropped, since the callbacks may point at it. */
static int
stop_serving(module_state *state, ProfilerObject *self)
{
    for (Py_ssize_t i = 0; i < state->nenabled; i++) {
        if (state->enabled[i] == self) {
            memmove(&state->enabled[i], &state->enabled[i + 1],
                    (size_t)(state->nenabled - i - 1)
                    * sizeof(ProfilerObject *));
            state->nenabled--;
            break;
        }
    }
    close_all_frames(self, closing_time(self, state));
    self->enabled = 0;
    int err = set_events(state);
    Py_DECREF(self);
    return err;
}


/* The Profiler type */

static void
clear_records(ProfilerObject *self)
{
    for (int32_t i = 0; i < self->nthreads; i++) {
        PyMem_Free(self->threads[i].stack);
    }
    PyMem_Free(self->threads);
    self->threads = NULL;
    self->nthreads = self->threads_capacity = 0;
    self->last_thread = NULL;
    PyMem_Free(self->nodes);
    self->nodes = NULL;
    self->nnodes = self->nodes_capacity = 0;
    table_clear(&self->node_table);
    memset(self->edge_cache, 0, sizeof(self->edge_cache));
    for (int32_t i = 0; i < self->nfunctions; i++) {
        Py_DECREF(self->functions[i].label);
    }
    PyMem_Free(self->functions);
    self->functions = NULL;
    self->nfunctions = self->functions_capacity = 0;
    table_clear(&self->function_table);
}

static void
clear_verdicts(ProfilerObject *self)
{
    for (int32_t i = 0; i < self->nverdicts; i++) {
        Py_DECREF(self->verdicts[i].code);
    }
    PyMem_Free(self->verdicts);
    self->verdicts = NULL;
    self->nverdicts = self->verdicts_capacity = 0;
    table_clear(&self->verdict_table);
}

/*[clinic input]
_lsprof.Profiler.__init__

    timer: object = None
    timeunit: double = 0.0
    subcalls: bool(accept={int}) = True
    builtins: bool(accept={int}) = True
    *
    all_threads: bool = False
    include: object = None
    memory: object = None

Build a profiler.

The default timer is a fast one of the interpreter's, counting real
time.  A timer given returns seconds as a float, or an int of units of
timeunit seconds.  With subcalls, the times of each function are also
kept per caller; with builtins, C functions are timed apart from their
caller.  The thread that calls enable() is recorded, or every thread
with all_threads.  With include, a sequence of str, only the code of
files whose name starts with one of them is recorded; other code runs
as if not profiled once it has run once.  With memory (the default on a
build configured --with-memory-tracking), the bytes each function
allocated, and retained, are counted too.
[clinic start generated code]*/

static int
_lsprof_Profiler___init___impl(ProfilerObject *self, PyObject *timer,
                               double timeunit, int subcalls, int builtins,
                               int all_threads, PyObject *include,
                               PyObject *memory)
/*[clinic end generated code: output=9ac1815dee3b0009 input=ceb41915c65aabaf]*/
{
    if (self->enabled) {
        PyErr_SetString(PyExc_RuntimeError,
                        "cannot reinitialize an enabled profiler");
        return -1;
    }
    if (timer == Py_None) {
        timer = NULL;
    }
    PyObject *prefixes = NULL;
    if (include != Py_None) {
        prefixes = PySequence_Tuple(include);
        if (prefixes == NULL) {
            return -1;
        }
        for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(prefixes); i++) {
            PyObject *prefix = PyTuple_GET_ITEM(prefixes, i);
            if (!PyUnicode_Check(prefix)) {
                PyErr_Format(PyExc_TypeError,
                             "include must be a sequence of str, not of "
                             "%.200s", Py_TYPE(prefix)->tp_name);
                Py_DECREF(prefixes);
                return -1;
            }
        }
    }
#ifdef Py_TRACK_MEMORY
    int tracked = 1;
#else
    int tracked = 0;
#endif
    int count_memory = tracked;
    if (memory != Py_None) {
        count_memory = PyObject_IsTrue(memory);
        if (count_memory < 0) {
            Py_XDECREF(prefixes);
            return -1;
        }
        if (count_memory && !tracked) {
            PyErr_SetString(PyExc_ValueError,
                            "memory needs a build configured "
                            "--with-memory-tracking");
            Py_XDECREF(prefixes);
            return -1;
        }
    }
    if (count_memory != self->memory && self->nnodes > 0) {
        /* Nodes counted one way cannot go on the other. */
        clear_records(self);
    }
    self->memory = count_memory;
    Py_XSETREF(self->include, prefixes);
    clear_verdicts(self);
    Py_XSETREF(self->timer, Py_XNewRef(timer));
    self->timeunit = timeunit;
    self->subcalls = subcalls;
    self->builtins = builtins;
    self->all_threads = all_threads;
    self->last_thread = NULL;
    return 0;
}

/*[clinic input]
_lsprof.Profiler.enable

    subcalls: int = -1
    builtins: int = -1

Start collecting profiling information.

If subcalls is true, also record each function's statistics per caller;
if builtins is true, time the built-in functions apart from their
caller.  A negative value keeps the setting of the constructor.
[clinic start generated code]*/

static PyObject *
_lsprof_Profiler_enable_impl(ProfilerObject *self, int subcalls,
                             int builtins)
/*[clinic end generated code: output=1e747f9dc1edd571 input=3772056ea98aac9b]*/
{
    module_state *state = state_of(self);
    if (subcalls >= 0) {
        self->subcalls = subcalls != 0;
    }
    if (builtins >= 0) {
        self->builtins = builtins != 0;
    }
    if (!self->enabled) {
        self->timer_failed = 0;
        self->thread_id = _PyThreadState_GET()->id;
        if (start_serving(state, self) < 0) {
            return NULL;
        }
    }
    if (set_events(state) < 0) {
        return NULL;
    }
    Py_RETURN_NONE;
}

/*[clinic input]
_lsprof.Profiler.disable

Stop collecting profiling information.
[clinic start generated code]*/

static PyObject *
_lsprof_Profiler_disable_impl(ProfilerObject *self)
/*[clinic end generated code: output=838cffef7f651870 input=05700b3fc68d1f50]*/
{
    if (self->enabled && stop_serving(state_of(self), self) < 0) {
        return NULL;
    }
    if (self->out_of_memory) {
        self->out_of_memory = 0;
        PyErr_SetString(PyExc_MemoryError,
                        "memory was exhausted while profiling");
        return NULL;
    }
    Py_RETURN_NONE;
}

/*[clinic input]
_lsprof.Profiler.clear

Clear all profiling information collected so far.
[clinic start generated code]*/

static PyObject *
_lsprof_Profiler_clear_impl(ProfilerObject *self)
/*[clinic end generated code: output=dd1c668fb84b1335 input=fbe1f88c28be4f98]*/
{
    clear_records(self);
    Py_RETURN_NONE;
}


/* Statistics */

/* Totals of a function, or of a function called by another. */
typedef struct {
    int64_t calls;
    /* Calls made while an outer call of the same was going on. */
    int64_t recursive_calls;
    /* Ticks in the outermost calls, and outside callees. */
    int64_t total;
    int64_t inline_;
    /* Bytes, the same way (with memory). */
    int64_t allocated;
    int64_t inline_allocated;
    int64_t retained;
    int64_t inline_retained;
    /* Calls of it open on the path walked. */
    int32_t open;
} Totals;

typedef struct {
    int32_t caller;
    int32_t callee;
    /* The next edge of the same caller. */
    int32_t next;
    Totals totals;
} Edge;

/* What the frames of a node took (node_totals()). */
typedef struct {
    int64_t ticks;
    int64_t own_ticks;
    int64_t allocated;
    int64_t own_allocated;
    int64_t retained;
    int64_t own_retained;
} NodeTotals;

typedef struct {
    ProfilerObject *self;
    NodeTotals *nodes;
    /* Only the threads of this ident, unless `all`. */
    int all;
    unsigned long ident;
    Totals *functions;
    Edge *edges;
    int32_t nedges;
    int32_t edges_capacity;
    IndexTable edge_table;
    /* Per function, its first edge as a caller. */
    int32_t *first_edge;
} Gathering;

static uint32_t
edge_hash(void *owner, int32_t index)
{
    Edge *edge = &((Gathering *)owner)->edges[index];
    return hash_key((void *)(intptr_t)edge->callee, edge->caller);
}

static int
edge_has_key(void *owner, int32_t index, const void *key)
{
    const Edge *wanted = key;
    Edge *edge = &((Gathering *)owner)->edges[index];
    return edge->caller == wanted->caller && edge->callee == wanted->callee;
}

static int32_t
edge_of(Gathering *g, int32_t caller, int32_t callee)
{
    IndexTable *table = &g->edge_table;
    uint32_t hash = hash_key((void *)(intptr_t)callee, caller);
    Edge wanted = {.caller = caller, .callee = callee};
    int32_t found = table_find(table, hash, g, &wanted, edge_has_key);
    if (found >= 0) {
        return found;
    }
    if (table_reserve(table, TABLE_QUARTERS, g, edge_hash) < 0
        || grow((void **)&g->edges, &g->edges_capacity, g->nedges,
                sizeof(Edge)) < 0)
    {
        return -1;
    }
    int32_t index = g->nedges++;
    g->edges[index] = (Edge){.caller = caller, .callee = callee,
                             .next = g->first_edge[caller]};
    g->first_edge[caller] = index;
    table_add(table, hash, index);
    return index;
}

/* Two arrays of `n` items, both or neither. */
static int
two_arrays(int32_t n, size_t item, void **a, void **b)
{
    *a = PyMem_Malloc((size_t)n * item + 1);
    *b = PyMem_Malloc((size_t)n * item + 1);
    if (*a == NULL || *b == NULL) {
        PyMem_Free(*a);
        PyMem_Free(*b);
        PyErr_NoMemory();
        return -1;
    }
    return 0;
}

/* What the frames of each node took, in all and outside their callees:
   ticks, and with memory bytes allocated and retained.  Frames still open
   count with what they took so far.  What the profiler adds to each call
   is taken out where it was measured: the callee's share from the node,
   the caller's from its parent, never below zero, and the times in all
   made again from what is left.  NULL with an exception set on
   failure. */
static NodeTotals *
node_totals(ProfilerObject *self, module_state *state,
            double seconds_per_tick)
{
    int open = 0;
    for (int32_t i = 0; i < self->nthreads; i++) {
        open |= self->threads[i].depth > 1;
    }
    /* First, as a timer may run profiled code. */
    int64_t now = open ? closing_time(self, state) : 0;
    int32_t n = self->nnodes;
    NodeTotals *totals = PyMem_Calloc((size_t)n + 1, sizeof(NodeTotals));
    if (totals == NULL) {
        PyErr_NoMemory();
        return NULL;
    }
    for (int32_t i = 0; i < n; i++) {
        totals[i].ticks = self->nodes[i].ticks;
        totals[i].allocated = self->nodes[i].allocated;
        totals[i].retained = self->nodes[i].retained;
    }
    int64_t allocated = MEMORY_ALLOCATED(), retained = MEMORY_RETAINED();
    for (int32_t i = 0; open && i < self->nthreads; i++) {
        ThreadRecord *thread = &self->threads[i];
        for (int32_t depth = 1; depth < thread->depth; depth++) {
            Frame *frame = &thread->stack[depth];
            totals[frame->node].ticks += now - frame->start;
            if (self->memory) {
                totals[frame->node].allocated +=
                    allocated - frame->allocated_start;
                totals[frame->node].retained +=
                    retained - frame->retained_start;
            }
        }
    }
    /* Children come after their parents in the array: a parent's own
       share is set before its children take theirs from it. */
    for (int32_t i = 0; i < n; i++) {
        totals[i].own_ticks = totals[i].ticks;
        totals[i].own_allocated = totals[i].allocated;
        totals[i].own_retained = totals[i].retained;
        int32_t parent = self->nodes[i].parent;
        if (parent >= 0) {
            assert(parent < i);
            totals[parent].own_ticks -= totals[i].ticks;
            totals[parent].own_allocated -= totals[i].allocated;
            totals[parent].own_retained -= totals[i].retained;
        }
    }
    if (!self->has_overhead) {
        return totals;
    }
    double *cut = PyMem_Calloc((size_t)n + 1, sizeof(double));
    if (cut == NULL) {
        PyMem_Free(totals);
        PyErr_NoMemory();
        return NULL;
    }
    for (int32_t i = 0; i < n; i++) {
        Node *node = &self->nodes[i];
        if (node->parent < 0) {
            continue;
        }
        int builtin = !PyCode_Check(self->functions[node->function].label);
        double calls = (double)node->calls;
        cut[i] += calls * self->overhead[builtin][0] / seconds_per_tick;
        cut[node->parent] += calls * self->overhead[builtin][1]
                             / seconds_per_tick;
    }
    for (int32_t i = 0; i < n; i++) {
        totals[i].own_ticks = Py_MAX(
            0, (int64_t)((double)totals[i].own_ticks - cut[i]));
        totals[i].ticks = 0;
    }
    /* Children come after their parents in the array. */
    for (int32_t i = n - 1; i >= 0; i--) {
        totals[i].ticks += totals[i].own_ticks;
        if (self->nodes[i].parent >= 0) {
            totals[self->nodes[i].parent].ticks += totals[i].ticks;
        }
    }
    PyMem_Free(cut);
    return totals;
}

/* A node's frames enter the totals: their time counts toward a total
   only where no call of the same is open further out. */
static void
add_node(Gathering *g, Totals *totals, int32_t i)
{
    Node *node = &g->self->nodes[i];
    NodeTotals *took = &g->nodes[i];
    totals->calls += node->calls;
    totals->inline_ += took->own_ticks;
    totals->inline_allocated += took->own_allocated;
    totals->inline_retained += took->own_retained;
    if (totals->open++ == 0) {
        totals->total += took->ticks;
        totals->allocated += took->allocated;
        totals->retained += took->retained;
    }
    else {
        totals->recursive_calls += node->calls;
    }
}

/* The children of every node, as lists: first child, next sibling. */
static int
link_children(ProfilerObject *self, int32_t **first_child,
              int32_t **next_sibling)
{
    int32_t n = self->nnodes;
    if (two_arrays(n, sizeof(int32_t), (void **)first_child,
                   (void **)next_sibling) < 0)
    {
        return -1;
    }
    for (int32_t i = 0; i < n; i++) {
        (*first_child)[i] = -1;
    }
    for (int32_t i = n - 1; i >= 0; i--) {
        int32_t parent = self->nodes[i].parent;
        if (parent >= 0) {
            (*next_sibling)[i] = (*first_child)[parent];
            (*first_child)[parent] = i;
        }
    }
    return 0;
}

/* Walks every thread's tree (or those of one thread), depth first
   without recursion, adding each node to its function's totals and to
   those of its caller and it. */
static int
gather(Gathering *g)
{
    ProfilerObject *self = g->self;
    int32_t *first_child, *next_sibling;
    if (link_children(self, &first_child, &next_sibling) < 0) {
        return -1;
    }
    int32_t *edge = PyMem_Malloc((size_t)self->nnodes * sizeof(int32_t) + 1);
    int err = -1;
    if (edge == NULL) {
        goto done;
    }
    for (int32_t t = 0; t < self->nthreads; t++) {
        if (!g->all && self->threads[t].ident != g->ident) {
            continue;
        }
        int32_t root = self->threads[t].stack[0].node;
        int32_t i = first_child[root];
        while (i >= 0) {
            Node *node = &self->nodes[i];
            add_node(g, &g->functions[node->function], i);
            edge[i] = -1;
            if (self->subcalls && node->parent != root) {
                edge[i] = edge_of(g, self->nodes[node->parent].function,
                                  node->function);
                if (edge[i] < 0) {
                    goto done;
                }
                add_node(g, &g->edges[edge[i]].totals, i);
            }
            if (first_child[i] >= 0) {
                i = first_child[i];
                continue;
            }
            while (i >= 0) {
                g->functions[self->nodes[i].function].open--;
                if (edge[i] >= 0) {
                    g->edges[edge[i]].totals.open--;
                }
                if (next_sibling[i] >= 0) {
                    i = next_sibling[i];
                    break;
                }
                i = self->nodes[i].parent;
                if (i == root) {
                    i = -1;
                }
            }
        }
    }
    err = 0;
done:
    PyMem_Free(first_child);
    PyMem_Free(next_sibling);
    PyMem_Free(edge);
    if (err < 0) {
        PyErr_NoMemory();
    }
    return err;
}

static PyObject *
bytes_or_none(int memory, int64_t bytes)
{
    return memory ? PyLong_FromLongLong(bytes) : Py_NewRef(Py_None);
}

/* A profiler_entry, with `calls`, or a profiler_subentry: the bytes are
   fields after those of the tuple, so that code unpacking 3.11's tuples
   goes on working. */
static PyObject *
make_entry(PyTypeObject *type, PyObject *label, Totals *totals, double factor,
           int memory, PyObject *calls)
{
    PyObject *entry = PyStructSequence_New(type);
    if (entry == NULL) {
        Py_XDECREF(calls);
        return NULL;
    }
    PyObject *items[] = {
        Py_NewRef(label),
        PyLong_FromLongLong(totals->calls),
        PyLong_FromLongLong(totals->recursive_calls),
        PyFloat_FromDouble(factor * (double)totals->total),
        PyFloat_FromDouble(factor * (double)totals->inline_),
        calls,
        bytes_or_none(memory, totals->allocated),
        bytes_or_none(memory, totals->inline_allocated),
        bytes_or_none(memory, totals->retained),
        bytes_or_none(memory, totals->inline_retained),
    };
    Py_ssize_t count = Py_ARRAY_LENGTH(items);
    int failed = 0;
    for (Py_ssize_t i = 0, field = 0; i < count; i++) {
        if (i == 5 && calls == NULL) {
            continue;
        }
        failed |= items[i] == NULL;
        PyStructSequence_SET_ITEM(entry, field++, items[i]);
    }
    if (failed) {
        Py_DECREF(entry);
        return NULL;
    }
    return entry;
}

/* The thread ident `thread` asks for, or -1 (with `*all` set) for all
   threads. */
static int
parse_thread(PyObject *thread, int *all, unsigned long *ident)
{
    *all = thread == Py_None;
    if (*all) {
        return 0;
    }
    if (!PyLong_Check(thread)) {
        PyErr_Format(PyExc_TypeError,
                     "thread must be an int (a thread's ident) or None, "
                     "not %.200s", Py_TYPE(thread)->tp_name);
        return -1;
    }
    *ident = PyLong_AsUnsignedLong(thread);
    return *ident == (unsigned long)-1 && PyErr_Occurred() ? -1 : 0;
}

/*[clinic input]
_lsprof.Profiler.getstats

    thread: object = None

list of profiler_entry objects.

getstats(thread=None) -> list of profiler_entry objects

Return all information collected by the profiler, or what it
collected in the thread of that ident (threading.get_ident()).
Each profiler_entry is a tuple-like object with the
following attributes:

    code          code object
    callcount     how many times this was called
    reccallcount  how many times called recursively
    totaltime     total time in this entry
    inlinetime    inline time in this entry (not in subcalls)
    calls         details of the calls

The calls attribute is either None or a list of
profiler_subentry objects:

    code          called code object
    callcount     how many times this is called
    reccallcount  how many times this is called recursively
    totaltime     total time spent in this call
    inlinetime    inline time (not in further subcalls)

Calls still going on count with the time they took so far.
[clinic start generated code]*/

static PyObject *
_lsprof_Profiler_getstats_impl(ProfilerObject *self, PyObject *thread)
/*[clinic end generated code: output=137fc9d44a130791 input=27cd63c381732c61]*/
{
    module_state *state = state_of(self);
    if (self->out_of_memory) {
        self->out_of_memory = 0;
        PyErr_SetString(PyExc_MemoryError,
                        "memory was exhausted while profiling");
        return NULL;
    }
    Gathering g = {.self = self};
    if (parse_thread(thread, &g.all, &g.ident) < 0) {
        return NULL;
    }
    PyObject *list = NULL;
    /* First, as a timer may run profiled code. */
    double factor = seconds_per_tick(self, state);
    g.nodes = node_totals(self, state, factor);
    if (g.nodes == NULL) {
        goto done;
    }
    g.functions = PyMem_Calloc((size_t)self->nfunctions + 1, sizeof(Totals));
    g.first_edge = PyMem_Malloc(((size_t)self->nfunctions + 1)
                                * sizeof(int32_t));
    if (g.functions == NULL || g.first_edge == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    for (int32_t i = 0; i < self->nfunctions; i++) {
        g.first_edge[i] = -1;
    }
    if (gather(&g) < 0) {
        goto done;
    }
    list = PyList_New(0);
    if (list == NULL) {
        goto done;
    }
    for (int32_t f = 0; f < self->nfunctions; f++) {
        Totals *totals = &g.functions[f];
        if (totals->calls == 0 && totals->total == 0
            && totals->inline_ == 0)
        {
            continue;
        }
        PyObject *calls = Py_NewRef(Py_None);
        if (g.first_edge[f] >= 0) {
            Py_SETREF(calls, PyList_New(0));
            for (int32_t e = g.first_edge[f]; calls != NULL && e >= 0;
                 e = g.edges[e].next)
            {
                Edge *edge = &g.edges[e];
                PyObject *sub = make_entry(
                    state->stats_subentry_type,
                    self->functions[edge->callee].label, &edge->totals,
                    factor, self->memory, NULL);
                if (sub == NULL || PyList_Append(calls, sub) < 0) {
                    Py_XDECREF(sub);
                    Py_CLEAR(calls);
                    break;
                }
                Py_DECREF(sub);
            }
        }
        PyObject *entry = calls == NULL ? NULL
            : make_entry(state->stats_entry_type, self->functions[f].label,
                         totals, factor, self->memory, calls);
        if (entry == NULL || PyList_Append(list, entry) < 0) {
            Py_XDECREF(entry);
            Py_CLEAR(list);
            goto done;
        }
        Py_DECREF(entry);
    }
done:
    PyMem_Free(g.nodes);
    PyMem_Free(g.functions);
    PyMem_Free(g.first_edge);
    PyMem_Free(g.edges);
    table_clear(&g.edge_table);
    return list;
}

/*[clinic input]
_lsprof.Profiler.set_overhead

    overhead: object
    /

Take what profiling adds to each call out of the times reported.

overhead is None, or ((python_callee, python_caller), (builtin_callee,
builtin_caller)): the seconds each call of a Python function and of a
built-in adds to the callee's own time and to its caller's.  Times go
down by that much, never below zero.  See profiling.tracing's
Profile.calibrate(), which measures them.
[clinic start generated code]*/

static PyObject *
_lsprof_Profiler_set_overhead(ProfilerObject *self, PyObject *overhead)
/*[clinic end generated code: output=c4e7c753c9f01830 input=765b87c30ce06b2a]*/
{
    if (overhead == Py_None) {
        self->has_overhead = 0;
        Py_RETURN_NONE;
    }
    double values[2][2];
    if (!PyTuple_Check(overhead)) {
        PyErr_Format(PyExc_TypeError,
                     "overhead must be None or ((float, float), (float, "
                     "float)), not %.200s", Py_TYPE(overhead)->tp_name);
        return NULL;
    }
    if (!PyArg_ParseTuple(overhead, "(dd)(dd);overhead must be None or "
                          "((float, float), (float, float))",
                          &values[0][0], &values[0][1], &values[1][0],
                          &values[1][1]))
    {
        return NULL;
    }
    for (int i = 0; i < 4; i++) {
        double value = values[i / 2][i % 2];
        if (!(value >= 0.0 && value < 1.0)) {
            PyErr_Format(PyExc_ValueError,
                         "an overhead must be at least 0 and less than a "
                         "second, not %R", PyTuple_GET_ITEM(
                             PyTuple_GET_ITEM(overhead, i / 2), i % 2));
            return NULL;
        }
    }
    memcpy(self->overhead, values, sizeof(values));
    self->has_overhead = 1;
    Py_RETURN_NONE;
}

/*[clinic input]
_lsprof.Profiler.threads

Return the idents (threading.get_ident()) of the threads recorded.
[clinic start generated code]*/

static PyObject *
_lsprof_Profiler_threads_impl(ProfilerObject *self)
/*[clinic end generated code: output=dfa90c1588d2e3bd input=4c18ca4b4f4cc215]*/
{
    PyObject *idents = PyList_New(0);
    for (int32_t t = 0; idents != NULL && t < self->nthreads; t++) {
        PyObject *ident = PyLong_FromUnsignedLong(self->threads[t].ident);
        int found = ident == NULL ? -1 : PySequence_Contains(idents, ident);
        if (found < 0 || (!found && PyList_Append(idents, ident) < 0)) {
            Py_CLEAR(idents);
        }
        Py_XDECREF(ident);
    }
    return idents;
}

/* The tree of one thread as a list, parents before children. */
static PyObject *
thread_tree(ProfilerObject *self, ThreadRecord *thread, double factor,
            NodeTotals *totals, int32_t *first_child,
            int32_t *next_sibling, int32_t *position)
{
    PyObject *nodes = PyList_New(0);
    if (nodes == NULL) {
        return NULL;
    }
    int32_t root = thread->stack[0].node;
    position[root] = -1;
    int32_t i = first_child[root];
    while (i >= 0) {
        Node *node = &self->nodes[i];
        NodeTotals *took = &totals[i];
        position[i] = (int32_t)PyList_GET_SIZE(nodes);
        PyObject *item = self->memory
            ? Py_BuildValue("(iOLddLLLL)", position[node->parent],
                            self->functions[node->function].label,
                            (long long)node->calls,
                            factor * (double)took->ticks,
                            factor * (double)took->own_ticks,
                            (long long)took->allocated,
                            (long long)took->own_allocated,
                            (long long)took->retained,
                            (long long)took->own_retained)
            : Py_BuildValue("(iOLdd)", position[node->parent],
                            self->functions[node->function].label,
                            (long long)node->calls,
                            factor * (double)took->ticks,
                            factor * (double)took->own_ticks);
        if (item == NULL || PyList_Append(nodes, item) < 0) {
            Py_XDECREF(item);
            Py_DECREF(nodes);
            return NULL;
        }
        Py_DECREF(item);
        if (first_child[i] >= 0) {
            i = first_child[i];
            continue;
        }
        while (i >= 0 && next_sibling[i] < 0) {
            i = self->nodes[i].parent;
            if (i == root) {
                i = -1;
            }
        }
        if (i >= 0) {
            i = next_sibling[i];
        }
    }
    return nodes;
}

/*[clinic input]
_lsprof.Profiler.calltree

    thread: object = None

Return the calling context tree of each thread recorded.

A list of (ident, nodes) pairs, one per thread (or for the threads of
that ident).  Each node is a tuple (parent, code, calls, totaltime,
inlinetime): the index of its parent in the list (-1 for a function
entered at the thread's outermost level), the code object or the name
of the built-in function, the calls made on that path, the time spent
there and below, and the time spent there outside the callees.  With
memory, four more: the bytes allocated there and below, there outside
the callees, and the same for the bytes retained.  Parents come before
their children.
[clinic start generated code]*/

static PyObject *
_lsprof_Profiler_calltree_impl(ProfilerObject *self, PyObject *thread)
/*[clinic end generated code: output=e06333569bce09a8 input=4505a4ced5baffc2]*/
{
    int all;
    unsigned long ident = 0;
    if (parse_thread(thread, &all, &ident) < 0) {
        return NULL;
    }
    if (self->out_of_memory) {
        self->out_of_memory = 0;
        PyErr_SetString(PyExc_MemoryError,
                        "memory was exhausted while profiling");
        return NULL;
    }
    /* First, as a timer may run profiled code. */
    module_state *state = state_of(self);
    double factor = seconds_per_tick(self, state);
    NodeTotals *totals = node_totals(self, state, factor);
    if (totals == NULL) {
        return NULL;
    }
    int32_t *first_child, *next_sibling;
    if (link_children(self, &first_child, &next_sibling) < 0) {
        PyMem_Free(totals);
        return NULL;
    }
    int32_t *position = PyMem_Malloc((size_t)self->nnodes * sizeof(int32_t)
                                     + 1);
    PyObject *trees = position == NULL ? PyErr_NoMemory() : PyList_New(0);
    for (int32_t t = 0; trees != NULL && t < self->nthreads; t++) {
        ThreadRecord *record = &self->threads[t];
        if (!all && record->ident != ident) {
            continue;
        }
        PyObject *nodes = thread_tree(self, record, factor, totals,
                                      first_child, next_sibling, position);
        PyObject *pair = nodes == NULL ? NULL
            : Py_BuildValue("(kN)", record->ident, nodes);
        if (pair == NULL || PyList_Append(trees, pair) < 0) {
            Py_CLEAR(trees);
        }
        Py_XDECREF(pair);
    }
    PyMem_Free(first_child);
    PyMem_Free(next_sibling);
    PyMem_Free(position);
    PyMem_Free(totals);
    return trees;
}

static int
profiler_traverse(ProfilerObject *self, visitproc visit, void *arg)
{
    Py_VISIT(Py_TYPE(self));
    Py_VISIT(self->timer);
    Py_VISIT(self->include);
    for (int32_t i = 0; i < self->nverdicts; i++) {
        Py_VISIT(self->verdicts[i].code);
    }
    for (int32_t i = 0; i < self->nfunctions; i++) {
        Py_VISIT(self->functions[i].label);
    }
    return 0;
}

static int
profiler_clear(ProfilerObject *self)
{
    Py_CLEAR(self->timer);
    Py_CLEAR(self->include);
    clear_verdicts(self);
    return 0;
}

static void
profiler_dealloc(ProfilerObject *self)
{
    /* The enabled ones are kept alive by the module. */
    assert(!self->enabled);
    PyObject_GC_UnTrack(self);
    profiler_clear(self);
    clear_records(self);
    PyTypeObject *type = Py_TYPE(self);
    type->tp_free(self);
    Py_DECREF(type);
}

static PyMethodDef profiler_methods[] = {
    _LSPROF_PROFILER_GETSTATS_METHODDEF
    _LSPROF_PROFILER_ENABLE_METHODDEF
    _LSPROF_PROFILER_DISABLE_METHODDEF
    _LSPROF_PROFILER_CLEAR_METHODDEF
    _LSPROF_PROFILER_THREADS_METHODDEF
    _LSPROF_PROFILER_CALLTREE_METHODDEF
    _LSPROF_PROFILER_SET_OVERHEAD_METHODDEF
    {NULL, NULL}
};

static PyType_Slot profiler_slots[] = {
    {Py_tp_doc, (void *)_lsprof_Profiler___init____doc__},
    {Py_tp_methods, profiler_methods},
    {Py_tp_dealloc, profiler_dealloc},
    {Py_tp_init, _lsprof_Profiler___init__},
    {Py_tp_traverse, profiler_traverse},
    {Py_tp_clear, profiler_clear},
    {0, 0}
};

static PyType_Spec profiler_spec = {
    .name = "_lsprof.Profiler",
    .basicsize = sizeof(ProfilerObject),
    .flags = (Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE
              | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_IMMUTABLETYPE),
    .slots = profiler_slots,
};

#define MEMORY_FIELDS \
    {"allocated", "bytes allocated in this entry and below (with memory)"}, \
    {"inlineallocated", "bytes allocated in this entry, not in subcalls"}, \
    {"retained", "bytes allocated and not freed, in this entry and below"}, \
    {"inlineretained", "bytes allocated and not freed, not in subcalls"},

static PyStructSequence_Field entry_fields[] = {
    {"code", "code object or built-in function name"},
    {"callcount", "how many times this was called"},
    {"reccallcount", "how many times called recursively"},
    {"totaltime", "total time in this entry"},
    {"inlinetime", "inline time in this entry (not in subcalls)"},
    {"calls", "details of the calls"},
    MEMORY_FIELDS
    {0}
};

static PyStructSequence_Field subentry_fields[] = {
    {"code", "called code object or built-in function name"},
    {"callcount", "how many times this is called"},
    {"reccallcount", "how many times this is called recursively"},
    {"totaltime", "total time spent in this call"},
    {"inlinetime", "inline time (not in further subcalls)"},
    MEMORY_FIELDS
    {0}
};

static PyStructSequence_Desc entry_desc = {
    .name = "_lsprof.profiler_entry",
    .fields = entry_fields,
    .n_in_sequence = 6,
};

static PyStructSequence_Desc subentry_desc = {
    .name = "_lsprof.profiler_subentry",
    .fields = subentry_fields,
    .n_in_sequence = 5,
};


/* The module */

static int
tracing_exec(PyObject *module)
{
    module_state *state = get_module_state(module);
    profiling_clock_init(&state->clock);
    state->profiler_type = (PyTypeObject *)PyType_FromModuleAndSpec(
        module, &profiler_spec, NULL);
    if (state->profiler_type == NULL
        || PyModule_AddType(module, state->profiler_type) < 0)
    {
        return -1;
    }
    state->stats_entry_type = PyStructSequence_NewType(&entry_desc);
    if (state->stats_entry_type == NULL
        || PyModule_AddType(module, state->stats_entry_type) < 0)
    {
        return -1;
    }
    state->stats_subentry_type = PyStructSequence_NewType(&subentry_desc);
    if (state->stats_subentry_type == NULL
        || PyModule_AddType(module, state->stats_subentry_type) < 0)
    {
        return -1;
    }
    return 0;
}

static int
tracing_traverse(PyObject *module, visitproc visit, void *arg)
{
    module_state *state = get_module_state(module);
    Py_VISIT(state->profiler_type);
    Py_VISIT(state->stats_entry_type);
    Py_VISIT(state->stats_subentry_type);
    for (Py_ssize_t i = 0; i < state->nenabled; i++) {
        Py_VISIT(state->enabled[i]);
    }
    for (int32_t i = 0; i < state->nlocalized; i++) {
        Py_VISIT(state->localized[i]);
    }
    return 0;
}

static int
tracing_clear(PyObject *module)
{
    module_state *state = get_module_state(module);
    /* The callbacks point at this state: they go with it. */
    while (state->nenabled > 0) {
        if (stop_serving(state, state->enabled[state->nenabled - 1]) < 0) {
            PyErr_WriteUnraisable(module);
        }
    }
    PyMem_Free(state->enabled);
    state->enabled = NULL;
    state->enabled_capacity = 0;
    forget_localized(state);
    Py_CLEAR(state->profiler_type);
    Py_CLEAR(state->stats_entry_type);
    Py_CLEAR(state->stats_subentry_type);
    return 0;
}

static void
tracing_free(void *module)
{
    tracing_clear((PyObject *)module);
}

static PyModuleDef_Slot tracing_slots[] = {
    {Py_mod_exec, tracing_exec},
    {0, NULL}
};

static struct PyModuleDef tracing_module = {
    PyModuleDef_HEAD_INIT,
    .m_name = "_lsprof",
    .m_doc = "The deterministic profiler of cProfile and profiling.tracing, "
             "on sys.monitoring.",
    .m_size = sizeof(module_state),
    .m_slots = tracing_slots,
    .m_traverse = tracing_traverse,
    .m_clear = tracing_clear,
    .m_free = tracing_free,
};

PyMODINIT_FUNC
PyInit__lsprof(void)
{
    return PyModuleDef_Init(&tracing_module);
}
