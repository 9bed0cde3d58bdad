/* The sampling profiler behind profiling.sampling: the _sampling module.

   A thread of its own (a C thread: it never takes the GIL and runs no
   Python code) wakes at absolute deadlines, every interval.  At each
   tick it takes a sample of the threads it watches:

   - a thread that does not hold the GIL cannot run Python code, nor
     change its frames, until it takes the GIL.  The sampler holds the
     GIL's mutex while it reads their frames, so that none can take the
     GIL meanwhile: every read is of frames that stay as they are, in
     memory that stays valid, with no copy that may fault and no signal.
     While no thread has taken the GIL since, a thread's stack is the one
     read last time, and is not read again;
   - the thread that holds the GIL runs on.  The sampler asks it, through
     the eval breaker, to record its own stack at its next check point
     (a loop's jump back, a call, a function's start: within a few
     bytecodes).  A long call of C code delays it: the ticks that pass
     meanwhile are weight of its answer, marked "in C".  If it leaves the
     GIL before it answers, the sampler reads its stack at the next tick.

   Stacks are kept as code objects and code units, interned in a tree
   (a node per frame, keyed by its parent, its code and its unit), and a
   sample is its tick, its thread, its status and weight, and its leaf:
   12 bytes; a thread found the same at consecutive ticks adds them to
   its last sample.  Code objects are kept by address, not by reference
   (the sampler may not touch reference counts): the interpreter tells
   the sampler of each code object freed while it runs, and the nodes of
   that code take its names and lines then, and are not found again; at
   the end the nodes of the code still alive take theirs.  Nothing names
   a freed object.

   Only one sampler runs at a time.  A forked child keeps no running
   sampler: the thread is not in the child, and the sampler is stopped
   there. */

#ifndef Py_BUILD_CORE_BUILTIN
#  define Py_BUILD_CORE_MODULE 1
#endif

#include "Python.h"
#include "opcode.h"                // RESUME
#include "pycore_code.h"          // _PyCode_CODE()
#include "pycore_frame.h"         // _PyInterpreterFrame
#include "pycore_interp.h"        // PyInterpreterState.threads
#include "pycore_memtrack.h"      // _PyMemTrack_TotalBytes()
#include "pycore_pystate.h"       // _PyThreadState_GET()
#include "pycore_runtime.h"       // _PyRuntime
#include "pycore_sampling.h"      // _PySampling
/* The store comes from the C library's allocator: the sampler thread has
   no thread state, and a hook on Python's allocators may take the GIL
   (tracemalloc's does), which the thread waits for while it holds the
   GIL's mutex.  So neither tracemalloc nor memory tracking counts it. */
#define TABLE_CALLOC calloc
#define TABLE_FREE free
#include "table.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <time.h>
#include <unistd.h>
#ifdef __linux__
#  include <sched.h>
#  include <sys/prctl.h>
#  include <sys/resource.h>
#  include <sys/syscall.h>
#endif

/* What a thread was doing at a sample. */
enum {
    STATUS_RUNNING,     /* running bytecode, holding the GIL */
    STATUS_IN_C,        /* holding the GIL in C code (a late answer), or
                           using the CPU in C without it (cpu mode) */
    STATUS_GIL,         /* waiting for the GIL */
    STATUS_IDLE,        /* none of these: blocked, or off the CPU */
    STATUSES
};

static const char *const status_names[STATUSES] = {
    [STATUS_RUNNING] = "running",
    [STATUS_IN_C] = "in C",
    [STATUS_GIL] = "waiting for the GIL",
    [STATUS_IDLE] = "idle",
};

/* Above this rate the sampler thread waits for its deadlines awake: waking
   from a sleep takes about as long as the interval. */
#define SLEEPLESS_NS 50000
/* How long a tick tries for the GIL's mutex before it does without. */
#define GIL_MUTEX_TRIES 1000

/* Stacks deeper than this are cut at their outermost frames. */
#define MAX_DEPTH 65536
/* A sample's weight: ticks, in the bits above its status. */
#define WEIGHT_SHIFT 2
#define MAX_WEIGHT ((1 << (16 - WEIGHT_SHIFT)) - 1)

/* A frame: a code unit of a code object, called from its parent. */
typedef struct {
    int32_t parent;
    int32_t code;            /* in SamplerObject.codes */
    int32_t unit;
    int32_t next_of_code;    /* the next node of the same code */
} StackNode;

/* Where a node's unit is in the source, once resolved (-1 unknown). */
typedef struct {
    int lineno, end_lineno, col, end_col;
} NodeLines;

typedef struct {
    uint32_t tick;
    int32_t node;            /* the innermost frame, or -1 */
    uint16_t thread;
    uint16_t weight_status;
} Sample;

typedef struct {
    uint32_t tick;
    int32_t first_tag;       /* its top tags in `tags`; -1 for none read */
    int64_t rss;
    int64_t tracked;         /* -1 without memory tracking */
    int32_t ntags;
} MemorySample;

/* A tag of sys.type_memory_usage() with its bytes, in a memory sample. */
typedef struct {
    int32_t name;            /* in `tag_names` */
    int64_t bytes;
} TagBytes;

/* The tags a memory sample reads, at most. */
#define TOP_TAGS 10
/* Reading them takes from a tenth of a millisecond to a few, as the heap
   changed since the last reading: the readings are spaced to take at
   most 1/TAGS_SHARE of the time. */
#define TAGS_SHARE 50

/* A frame of the path of a thread's stack interned last. */
typedef struct {
    PyCodeObject *code;
    int32_t unit;
    int32_t node;
} PathEntry;

typedef struct {
    uint64_t id;             /* PyThreadState.id */
    unsigned long ident;
    unsigned long native_id;
    clockid_t cpu_clock;
    int has_cpu_clock;
    /* In cpu mode, counted from its start, and nothing counted yet: the
       first count may go back to the first tick. */
    int reaches_back;
    int64_t cpu_ns;          /* its CPU time counted so far */
    Py_ssize_t last_sample;  /* its latest sample, or -1 */
    /* Ticks it was not read at (the GIL's mutex was busy): weight of the
       next look. */
    uint32_t owed;
    /* The leaf read at the last look, while no thread has taken the GIL
       since: a thread that has not taken it has the same stack. */
    int32_t cached_node;
    int cached;
    unsigned long cached_takes;
    /* The path interned last, outermost first, while no code object with
       nodes has died since (the epoch). */
    PathEntry *path;
    int32_t path_depth, path_capacity;
    uint64_t path_epoch;
    /* The walk of the thread list it was last found in: a thread not
       found in the latest walk is gone. */
    uint64_t walk;
    /* It cleared its state (end_thread()): it is not looked at again. */
    int ended;
    /* Its name in threading, looked up by a thread holding the GIL (see
       name_threads()), or NULL; and the version of threading's table of
       running threads when it was last looked up in vain. */
    PyObject *name;
    uint64_t looked_up;
} ThreadInfo;

/* A code object with nodes.  By address, not by reference: while the
   sampler runs, the entry of a code object that is freed is resolved then,
   and retired (never matched again): a code object made at the same
   address has another.  At stop, all are. */
typedef struct {
    PyCodeObject *code;
    int32_t first_node;
    int retired;
    /* Once resolved: references to its names. */
    PyObject *name;
    PyObject *filename;
    int firstlineno;
} CodeEntry;

typedef struct {
    PyObject_HEAD
    /* The configuration. */
    int64_t interval_ns;
    int cpu_mode;
    int all_threads;
    unsigned long only_ident;     /* unless all_threads */
    uint32_t memory_every;        /* ticks; 0 for none */

    /* The store, guarded by `lock` while the sampler thread runs. */
    pthread_mutex_t lock;
    StackNode *nodes;
    int32_t nnodes, nodes_capacity;
    /* Made when a code object is resolved: for the nodes made so far. */
    NodeLines *lines;
    int32_t lines_capacity;
    IndexTable node_table;
    CodeEntry *codes;
    int32_t ncodes, codes_capacity;
    IndexTable code_table;
    Sample *samples;
    Py_ssize_t nsamples, samples_capacity;
    MemorySample *memory;
    Py_ssize_t nmemory, memory_capacity;
    TagBytes *tags;
    Py_ssize_t ntags, tags_capacity;
    char **tag_names;        /* copies */
    Py_ssize_t ntag_names, tag_names_capacity;
    /* The memory sample whose top tags the next check point of the eval
       loop reads; -1 for none. */
    Py_ssize_t tags_wanted;
    /* No reading before this time (monotonic_ns()), which keeps the
       readings to a share of the time (TAGS_SHARE); INT64_MAX while one
       runs. */
    int64_t tags_next_ns;
    ThreadInfo *threads;
    int32_t nthreads, threads_capacity;
    IndexTable thread_table;  /* by PyThreadState.id */
    uint64_t walks;           /* of the thread list, at ticks */
    /* The threads whose names are still to be looked up, while they run:
       indexes in `threads`, and where the next lookups begin. */
    int32_t *unnamed;
    int32_t nunnamed, unnamed_capacity;
    int32_t unnamed_next;
    /* threading._active, at start(), if an exact dict; else NULL. */
    PyObject *threading_active;
    uint64_t store_generation;   /* counts clear_store() */
    /* Thread states made since start() have ids above this one. */
    uint64_t last_id_at_start;
    /* In cpu mode, the CPU time that threads used after their last look
       (all of it, if never looked at), counted as ticks when they end:
       what is left (or was counted ahead, rounding) goes to the next that
       ends. */
    int64_t cpu_left_ns;
    int out_of_memory;
    /* Counts the deaths of code objects with nodes. */
    uint64_t epoch;

    /* The thread holding the GIL is asked for its stack. */
    struct {
        int pending;
        uint64_t tstate_id;
        uint32_t tick;
        uint32_t weight;
        uint32_t late;       /* ticks since, still unanswered */
    } request;

    /* The sampler thread. */
    PyInterpreterState *interp;
    pthread_t thread;
    int running;             /* started and not stopped */
    int forked;              /* stopped by a fork, not yet retired */
    _Py_atomic_int stop_asked;
    pthread_mutex_t wake_lock;
    pthread_cond_t wake;
    int64_t start_ns;
    int64_t stop_ns;
    uint64_t ticks_taken;    /* ticks the sampler woke for */
    uint64_t ticks_missed;   /* ticks it was late for, or lost */
    uint32_t last_tick;
    int statm;               /* /proc/self/statm, or -1 */
#ifdef __linux__
    /* The CPUs the sampler thread may use, the CPU it last went to sleep
       on (-1 for unknown), and its thread id while it runs (0 else;
       guarded by `lock`): see move_sampler_off(). */
    cpu_set_t cpus;
    _Py_atomic_int sampler_cpu;
    pid_t sampler_tid;
#endif
} SamplerObject;

/* The sampler running, if any: the hooks serve it. */
static SamplerObject *active;

/*[clinic input]
module _sampling
class _sampling.Sampler "SamplerObject *" "&PyBaseObject_Type"
[clinic start generated code]*/
/*[clinic end generated code: output=da39a3ee5e6b4b0d input=6b6dca4e9d9e21c7]*/

#include "clinic/sampling.c.h"


/* Time */

/* The time on `clock`, or -1 where it cannot be read (the CPU clock of a
   thread gone). */
static int64_t
clock_ns(clockid_t clock)
{
    struct timespec ts;
    if (clock_gettime(clock, &ts) != 0) {
        return -1;
    }
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

static int64_t
monotonic_ns(void)
{
    return clock_ns(CLOCK_MONOTONIC);
}


/* The tick under way at `ns` (monotonic_ns()): taken at its end. */
static uint64_t
tick_at(SamplerObject *self, int64_t ns)
{
    return (uint64_t)((ns - self->start_ns) / self->interval_ns) + 1;
}


/* The store.  Every function here runs with `lock` held, or with the
   sampler thread stopped. */

static int
grow(void **array, Py_ssize_t *capacity, Py_ssize_t count, size_t item)
{
    if (count < *capacity) {
        return 0;
    }
    Py_ssize_t wanted = *capacity ? *capacity * 2 : 64;
    if ((size_t)wanted > PY_SSIZE_T_MAX / item) {
        return -1;
    }
    void *bigger = realloc(*array, (size_t)wanted * item);
    if (bigger == NULL) {
        return -1;
    }
    *array = bigger;
    *capacity = wanted;
    return 0;
}

static int
grow32(void **array, int32_t *capacity, int32_t count, size_t item)
{
    Py_ssize_t c = *capacity;
    if (c > INT32_MAX / 2) {
        return count < *capacity ? 0 : -1;
    }
    int err = grow(array, &c, count, item);
    *capacity = (int32_t)c;
    return err;
}

/* The tables are kept at most three quarters full (table.h): the store
   is small, and a lookup of a stack read is rare beside one taken from a
   thread's last path. */
#define TABLE_QUARTERS 3

static inline uint32_t
frame_hash(PyCodeObject *code, int32_t parent, int32_t unit)
{
    return table_hash(code, ((uint64_t)(uint32_t)parent << 32)
                              | (uint32_t)unit);
}

static uint32_t
node_hash(void *owner, int32_t index)
{
    SamplerObject *self = owner;
    StackNode *node = &self->nodes[index];
    return frame_hash(self->codes[node->code].code, node->parent,
                      node->unit);
}

static uint32_t
code_hash(void *owner, int32_t index)
{
    return table_hash(((SamplerObject *)owner)->codes[index].code, 0);
}

static inline int
is_live_code(void *owner, int32_t index, const void *code)
{
    CodeEntry *entry = &((SamplerObject *)owner)->codes[index];
    return entry->code == code && !entry->retired;
}

/* The index of the entry of `code`, a live code object, or -1. */
static int32_t
find_code(SamplerObject *self, PyCodeObject *code)
{
    return table_find(&self->code_table, table_hash(code, 0), self, code,
                      is_live_code);
}

/* The index of the entry of `code`, made if need be; -1 when out of
   memory. */
static int32_t
code_entry(SamplerObject *self, PyCodeObject *code)
{
    int32_t index = find_code(self, code);
    if (index >= 0) {
        return index;
    }
    if (table_reserve(&self->code_table, TABLE_QUARTERS, self,
                      code_hash) < 0
        || grow32((void **)&self->codes, &self->codes_capacity, self->ncodes,
                  sizeof(CodeEntry)) < 0)
    {
        return -1;
    }
    index = self->ncodes++;
    self->codes[index] = (CodeEntry){.code = code, .first_node = -1};
    table_add(&self->code_table, table_hash(code, 0), index);
    return index;
}

typedef struct {
    PyCodeObject *code;
    int32_t parent;
    int32_t unit;
} FrameKey;

static inline int
is_frame(void *owner, int32_t index, const void *key)
{
    SamplerObject *self = owner;
    const FrameKey *frame = key;
    StackNode *node = &self->nodes[index];
    return (node->parent == frame->parent && node->unit == frame->unit
            && is_live_code(self, node->code, frame->code));
}

/* The node of `unit` of `code` under `parent`, made if need be; -1 when
   out of memory.  A node of a code object that died is not found: a code
   object at the same address is another. */
static int32_t
intern_frame(SamplerObject *self, int32_t parent, PyCodeObject *code,
             int32_t unit)
{
    IndexTable *table = &self->node_table;
    uint32_t hash = frame_hash(code, parent, unit);
    FrameKey key = {code, parent, unit};
    int32_t found = table_find(table, hash, self, &key, is_frame);
    if (found >= 0) {
        return found;
    }
    int32_t code_index = code_entry(self, code);
    if (code_index < 0
        || table_reserve(table, TABLE_QUARTERS, self, node_hash) < 0
        || grow32((void **)&self->nodes, &self->nodes_capacity, self->nnodes,
                  sizeof(StackNode)) < 0)
    {
        return -1;
    }
    CodeEntry *of = &self->codes[code_index];
    int32_t index = self->nnodes++;
    self->nodes[index] = (StackNode){
        .parent = parent, .code = code_index, .unit = unit,
        .next_of_code = of->first_node};
    of->first_node = index;
    table_add(table, hash, index);
    return index;
}

/* Reads a thread's stack from its frame `innermost` on (the thread cannot
   change it meanwhile: it holds the GIL and runs this, or it cannot take
   the GIL) and interns it; returns its leaf, or -1 for an empty stack, -2
   when out of memory.  `info`, when given, keeps the path interned last:
   the frames a stack shares with it from the outermost are not looked up
   again. */
static int32_t
intern_stack(SamplerObject *self, _PyInterpreterFrame *innermost,
             ThreadInfo *info)
{
    /* Innermost first, as the frames are linked. */
    _PyInterpreterFrame *stack[256];
    _PyInterpreterFrame **frames = stack;
    Py_ssize_t capacity = Py_ARRAY_LENGTH(stack), depth = 0;
    for (_PyInterpreterFrame *frame = innermost;
         frame != NULL && depth < MAX_DEPTH; frame = frame->previous)
    {
        if (_PyFrame_IsIncomplete(frame)) {
            continue;
        }
        if (depth == capacity) {
            _PyInterpreterFrame **more = malloc(
                (size_t)capacity * 2 * sizeof(*more));
            if (more == NULL) {
                break;
            }
            memcpy(more, frames, (size_t)depth * sizeof(*more));
            if (frames != stack) {
                free(frames);
            }
            frames = more;
            capacity *= 2;
        }
        frames[depth++] = frame;
    }
    if (info != NULL && (info->path_epoch != self->epoch
                         || grow32((void **)&info->path,
                                   &info->path_capacity, (int32_t)depth,
                                   sizeof(PathEntry)) < 0))
    {
        info->path_depth = 0;
        info->path_epoch = self->epoch;
    }
    int32_t node = -1;
    for (Py_ssize_t i = 0; i < depth; i++) {
        _PyInterpreterFrame *frame = frames[depth - 1 - i];
        PyCodeObject *code = frame->f_code;
        int32_t unit = Py_MAX(
            (int32_t)(frame->prev_instr - _PyCode_CODE(code)), 0);
        if (info != NULL && i < info->path_depth) {
            PathEntry *entry = &info->path[i];
            if (entry->code == code && entry->unit == unit) {
                node = entry->node;
                continue;
            }
            info->path_depth = (int32_t)i;
        }
        node = intern_frame(self, node, code, unit);
        if (node < 0) {
            node = -2;
            break;
        }
        if (info != NULL && i < info->path_capacity) {
            info->path[i] = (PathEntry){code, unit, node};
            info->path_depth = (int32_t)i + 1;
        }
    }
    if (frames != stack) {
        free(frames);
    }
    return node;
}

static uint32_t
thread_hash(void *owner, int32_t index)
{
    return table_hash(NULL, ((SamplerObject *)owner)->threads[index].id);
}

static inline int
is_thread(void *owner, int32_t index, const void *id)
{
    return ((SamplerObject *)owner)->threads[index].id
           == *(const uint64_t *)id;
}

/* The index of the record of `tstate`'s thread, or -1.  Looked up at
   every tick for every thread: a program that has started many threads
   must not make the ticks slower. */
static int32_t
known_thread(SamplerObject *self, PyThreadState *tstate)
{
    return table_find(&self->thread_table, table_hash(NULL, tstate->id),
                      self, &tstate->id, is_thread);
}

/* Whether `tstate`'s thread started after start(), so that its CPU clock
   did.  (Unless threading was first imported from a C thread's temporary
   state, which its main Thread then takes for its own: rare, embedders.)
   A thread is known as threading's once it has run a few microseconds;
   one first looked at before counts from that look. */
static int
started_since_start(SamplerObject *self, PyThreadState *tstate)
{
    return tstate->id > self->last_id_at_start && tstate->on_delete != NULL;
}

/* The index of the record of `tstate`'s thread, made if need be. */
static int32_t
thread_index(SamplerObject *self, PyThreadState *tstate)
{
    int32_t known = known_thread(self, tstate);
    if (known >= 0) {
        return known;
    }
    if (self->nthreads > UINT16_MAX
        || table_reserve(&self->thread_table, TABLE_QUARTERS, self,
                         thread_hash) < 0
        || grow32((void **)&self->threads, &self->threads_capacity,
                  self->nthreads, sizeof(ThreadInfo)) < 0)
    {
        return -1;
    }
    ThreadInfo *info = &self->threads[self->nthreads];
    *info = (ThreadInfo){.id = tstate->id, .ident = tstate->thread_id,
                         .native_id = tstate->native_thread_id,
                         .last_sample = -1, .walk = self->walks};
    table_add(&self->thread_table, table_hash(NULL, info->id),
              self->nthreads);
    /* Out of memory, or without threading, it goes without a name. */
    if (self->threading_active != NULL
        && grow32((void **)&self->unnamed, &self->unnamed_capacity,
                  self->nunnamed, sizeof(int32_t)) == 0)
    {
        self->unnamed[self->nunnamed++] = self->nthreads;
    }
#ifdef __linux__
    /* The clock of the thread by its kernel id, as glibc makes it (a
       kernel ABI): a thread that is gone makes clock_gettime() fail,
       where pthread_getcpuclockid() would read freed memory. */
    info->cpu_clock = (clockid_t)((~(unsigned int)info->native_id) << 3 | 6);
#else
    if (pthread_getcpuclockid((pthread_t)tstate->thread_id,
                              &info->cpu_clock) != 0)
    {
        return self->nthreads++;
    }
#endif
    /* In cpu mode, a thread started since start() counts all its CPU
       time, from its first count: counted at its end, the time before its
       first look would be cut to the ticks since its last. */
    int64_t cpu_ns = clock_ns(info->cpu_clock);
    info->has_cpu_clock = cpu_ns >= 0;
    info->reaches_back = self->cpu_mode && started_since_start(self, tstate);
    info->cpu_ns = info->reaches_back ? 0 : Py_MAX(cpu_ns, 0);
    return self->nthreads++;
}

/* Adds a sample standing for the `weight` ticks up to `tick`; or, when it
   continues its thread's latest sample, adds to that one. */
static void
add_sample(SamplerObject *self, uint32_t tick, int32_t node, int32_t thread,
           int status, uint32_t weight)
{
    if (node < -1 || thread < 0) {
        self->out_of_memory = 1;
        return;
    }
    ThreadInfo *info = &self->threads[thread];
    if (info->last_sample >= 0) {
        Sample *last = &self->samples[info->last_sample];
        /* A tick goes to one sample of a thread, in the order of ticks. */
        assert(last->tick <= tick - weight);
        uint32_t last_weight = last->weight_status >> WEIGHT_SHIFT;
        if (last->node == node
            && (last->weight_status & ((1 << WEIGHT_SHIFT) - 1)) == status
            && last->tick + weight == tick
            && last_weight + weight <= MAX_WEIGHT)
        {
            last->tick = tick;
            last->weight_status += (uint16_t)(weight << WEIGHT_SHIFT);
            return;
        }
    }
    while (weight > 0) {
        if (grow((void **)&self->samples, &self->samples_capacity,
                 self->nsamples, sizeof(Sample)) < 0)
        {
            self->out_of_memory = 1;
            return;
        }
        uint32_t part = Py_MIN(weight, MAX_WEIGHT);
        weight -= part;
        info->last_sample = self->nsamples;
        self->samples[self->nsamples++] = (Sample){
            .tick = tick - weight, .node = node, .thread = (uint16_t)thread,
            .weight_status = (uint16_t)(part << WEIGHT_SHIFT | status)};
    }
}

/* Whether the sampler watches `tstate`'s thread. */
static int
watches(SamplerObject *self, PyThreadState *tstate)
{
    return self->all_threads || tstate->thread_id == self->only_ident;
}

/* The record of `tstate`'s thread, if the sampler watches it; else (or
   out of memory) NULL. */
static ThreadInfo *
watched(SamplerObject *self, PyThreadState *tstate)
{
    if (tstate->interp != self->interp) {
        return NULL;
    }
    int32_t thread = known_thread(self, tstate);
    if (thread >= 0) {
        ThreadInfo *info = &self->threads[thread];
        if (info->ended) {
            return NULL;
        }
        info->walk = self->walks;
        return info;
    }
    /* A new thread's state holds the ident of the thread that made it
       until the new thread starts and sets its own (before it takes the
       GIL and pushes a frame): a state without frames is not yet known. */
    if (tstate->cframe->current_frame == NULL || !watches(self, tstate)) {
        return NULL;
    }
    thread = thread_index(self, tstate);
    if (thread < 0) {
        self->out_of_memory = 1;
        return NULL;
    }
    return &self->threads[thread];
}

/* A thread's CPU time, by its clock; -1 where it has none, or is gone. */
static int64_t
thread_cpu_ns(ThreadInfo *info)
{
    return info->has_cpu_clock ? clock_ns(info->cpu_clock) : -1;
}

/* How many of the `weight` ticks since the last look a thread spent on a
   CPU, by its CPU clock (nearest whole ticks).  The rest of the time, up
   to half a tick either way, is carried to the next look: a thread that
   runs in bursts shorter than a tick is counted in full. */
static uint32_t
cpu_ticks(SamplerObject *self, ThreadInfo *info, uint32_t weight)
{
    int64_t now = thread_cpu_ns(info);
    if (now < 0) {
        return 0;
    }
    int64_t used = now - info->cpu_ns;
    if (used <= 0) {
        return 0;
    }
    uint64_t ticks = (uint64_t)(used + self->interval_ns / 2)
                     / (uint64_t)self->interval_ns;
    if (ticks > weight) {
        /* More than the ticks it stands for: the tick was late by part of
           an interval, which the tick numbers do not show.  Up to a tick
           of it is carried. */
        info->cpu_ns = Py_MAX(
            info->cpu_ns + (int64_t)weight * self->interval_ns,
            now - self->interval_ns);
        return weight;
    }
    info->cpu_ns += (int64_t)ticks * self->interval_ns;
    return (uint32_t)ticks;
}

/* Asks the thread holding the GIL for its stack, for `weight` ticks. */
static void
ask_holder(SamplerObject *self, PyThreadState *holder, uint32_t tick,
           uint32_t weight)
{
    if (self->request.pending) {
        /* Still in the same C code, or in a long instruction. */
        assert(self->request.tstate_id == holder->id);
        self->request.late += weight;
    }
    else {
        self->request.pending = 1;
        self->request.tstate_id = holder->id;
        self->request.tick = tick;
        self->request.weight = weight;
        self->request.late = 0;
    }
}

/* Tells the thread holding the GIL that it is asked: once the tick has let
   go of the locks that it needs to answer.  Told again at every tick, as
   the holder may recompute its eval breaker from flags set before. */
static void
tell_holder(SamplerObject *self)
{
    _Py_atomic_store_relaxed(&_PySampling.request, 1);
    _Py_atomic_store_relaxed(&self->interp->ceval.eval_breaker, 1);
}

/* Ends the request, giving `thread` its ticks at `node`: those it was
   asked for and those that passed before the answer. */
static void
close_request(SamplerObject *self, int32_t node, int32_t thread, int status)
{
    uint32_t late = self->request.late;
    add_sample(self, self->request.tick + late, node, thread, status,
               self->request.weight + late);
    self->request.pending = 0;
}

/* A request the asked thread did not answer before it left the GIL (or
   before stop()): it was in C code holding the GIL, and is there still or
   has just left it.  Its stack, which it cannot change now, is the best
   one to give the ticks.  Returns the ticks to add to the sample of
   `current`, when it is the thread asked. */
static uint32_t
settle_request(SamplerObject *self, PyThreadState *current)
{
    PyThreadState *tstate = self->interp->threads.head;
    while (tstate != NULL && tstate->id != self->request.tstate_id) {
        tstate = tstate->next;
    }
    if (tstate != NULL && tstate != current) {
        int32_t thread = thread_index(self, tstate);
        ThreadInfo *info = thread < 0 ? NULL : &self->threads[thread];
        close_request(self,
                      intern_stack(self, tstate->cframe->current_frame, info),
                      thread, STATUS_IN_C);
        return 0;
    }
    uint32_t ticks = self->request.weight + self->request.late;
    self->request.pending = 0;
    if (tstate == NULL) {
        /* The thread is gone. */
        self->ticks_missed += ticks;
        return 0;
    }
    return ticks;
}

/* A tick without the GIL's mutex, which a thread that was preempted while
   it held it (taking or dropping the GIL) can keep for a whole time slice:
   rather than wait and fall behind, the sampler asks the thread that holds
   the GIL, and owes the others this tick, to be read at the next one. */
static void
take_partial_tick(SamplerObject *self, uint32_t tick, uint32_t weight)
{
    _PyRuntimeState *runtime = &_PyRuntime;
    PyThreadState *holder = NULL;
    if (_Py_atomic_load_relaxed(&runtime->ceval.gil.locked)) {
        holder = (PyThreadState *)_Py_atomic_load_relaxed(
            &runtime->ceval.gil.last_holder);
    }
    for (PyThreadState *tstate = self->interp->threads.head; tstate != NULL;
         tstate = tstate->next)
    {
        ThreadInfo *info = watched(self, tstate);
        if (info == NULL) {
            continue;
        }
        /* In cpu mode every thread's CPU clock is read at the next whole
           tick. */
        int asked = self->request.pending
                    && self->request.tstate_id == tstate->id;
        if (asked && !self->cpu_mode) {
            /* Its answer stands for every tick until it comes, whether or
               not it holds the GIL now: a thread's samples take its ticks
               in order. */
            self->request.late += weight;
        }
        else if (tstate == holder && !self->request.pending
                 && !self->cpu_mode)
        {
            ask_holder(self, tstate, tick, weight + info->owed);
            info->owed = 0;
        }
        else {
            info->owed += weight;
        }
    }
}

/* Whether the holder, as it answers, is to look up unnamed threads: some
   thread was last looked up at another version of threading's table of
   running threads than the one now (a new thread never was).  So for a
   thread looked up in vain before threading entered it there, the holder
   is told at the first tick after it is, asked or not: in cpu mode a
   thread that uses little CPU time may never be asked before it ends.
   The holder may be changing the table meanwhile; the version is read in
   one load, and a stale one only tells the holder a tick later. */
static int
names_due(SamplerObject *self)
{
    if (self->nunnamed == 0) {
        return 0;
    }
    assert(self->threading_active != NULL);
    PyDictObject *active = (PyDictObject *)self->threading_active;
    uint64_t version = __atomic_load_n(&active->ma_version_tag,
                                       __ATOMIC_RELAXED);
    for (int32_t i = 0; i < self->nunnamed; i++) {
        if (self->threads[self->unnamed[i]].looked_up != version) {
            return 1;
        }
    }
    return 0;
}

/* One tick, standing for `weight` ticks: reads the watched threads that do
   not hold the GIL, and asks the one that does; or, when that one is
   `current` (stop() takes the last sample), reads it too. */
static void
take_tick(SamplerObject *self, uint32_t tick, uint32_t weight,
          PyThreadState *current)
{
    _PyRuntimeState *runtime = &_PyRuntime;
    struct _gil_runtime_state *gil = &runtime->ceval.gil;
    /* The thread list, then the GIL's mutex: no thread can come or go,
       nor take the GIL, while they are held. */
    PyThread_acquire_lock(runtime->interpreters.mutex, WAIT_LOCK);
    int gil_mutex = -1;
    if (current != NULL) {
        gil_mutex = pthread_mutex_lock(&gil->mutex);
    }
    for (int i = 0; gil_mutex != 0 && i < GIL_MUTEX_TRIES; i++) {
        gil_mutex = pthread_mutex_trylock(&gil->mutex);
    }
    pthread_mutex_lock(&self->lock);
    self->walks++;
    if (gil_mutex != 0) {
        take_partial_tick(self, tick, weight);
        goto done;
    }
    PyThreadState *holder = NULL;
    if (_Py_atomic_load_relaxed(&gil->locked)) {
        /* Set with the mutex held, before the holder runs. */
        holder = (PyThreadState *)_Py_atomic_load_relaxed(&gil->last_holder);
        if (holder == current) {
            holder = NULL;
        }
    }
    uint32_t carried = 0;
    if (self->request.pending
        && (holder == NULL || holder->id != self->request.tstate_id))
    {
        carried = settle_request(self, current);
    }
    unsigned long takes = _PySampling.gil_takes;
    for (PyThreadState *tstate = self->interp->threads.head; tstate != NULL;
         tstate = tstate->next)
    {
        ThreadInfo *info = watched(self, tstate);
        if (info == NULL) {
            continue;
        }
        uint32_t ticks = weight + info->owed;
        info->owed = 0;
        /* Its first count may hold CPU time from before the last look.
           Only the first: a request then pending may grow by a count at
           each look, and its sample must end by the tick under way. */
        uint32_t on_cpu = cpu_ticks(self, info,
                                    info->reaches_back ? tick : ticks);
        if (on_cpu > 0) {
            info->reaches_back = 0;
        }
        uint32_t w = self->cpu_mode ? on_cpu : ticks;
        int status;
        if (tstate == holder) {
            info->cached = 0;
            if (w > 0 || self->request.pending) {
                ask_holder(self, tstate, tick, w);
            }
            continue;
        }
        else if (tstate == current) {
            status = STATUS_RUNNING;
            w = ticks + carried;
        }
        else if (_PySampling_IsWaiting(tstate)) {
            /* Off the CPU now; in cpu mode its weight is the CPU it used
               before the wait, at the place where it waits. */
            status = STATUS_GIL;
        }
        else {
            status = on_cpu ? STATUS_IN_C : STATUS_IDLE;
        }
        if (w == 0) {
            continue;
        }
        int32_t node;
        if (tstate == current) {
            /* At stop(), in the profiler's code: where it was at its last
               sample is where it was. */
            node = info->last_sample >= 0
                   ? self->samples[info->last_sample].node
                   : intern_stack(self, tstate->cframe->current_frame, info);
        }
        else if (info->cached && info->cached_takes == takes) {
            node = info->cached_node;
        }
        else {
            node = intern_stack(self, tstate->cframe->current_frame, info);
            info->cached = node >= -1;
            info->cached_node = node;
            info->cached_takes = takes;
        }
        add_sample(self, tick, node, (int32_t)(info - self->threads), status,
                   w);
    }
    pthread_mutex_unlock(&gil->mutex);
done:;
    int tell = self->request.pending || names_due(self);
    pthread_mutex_unlock(&self->lock);
    PyThread_release_lock(runtime->interpreters.mutex);
    if (tell && current == NULL) {
        tell_holder(self);
    }
}

static int64_t
rss_bytes(SamplerObject *self)
{
    char text[128];
    if (self->statm < 0) {
        return -1;
    }
    ssize_t n = pread(self->statm, text, sizeof(text) - 1, 0);
    if (n <= 0) {
        return -1;
    }
    text[n] = '\0';
    unsigned long long size, resident;
    if (sscanf(text, "%llu %llu", &size, &resident) != 2) {
        return -1;
    }
    return (int64_t)resident * sysconf(_SC_PAGESIZE);
}

/* Returns whether the sample wants the tags read. */
static int
take_memory_sample(SamplerObject *self, uint32_t tick)
{
    int wanted = 0;
    MemorySample sample = {.tick = tick, .first_tag = -1,
                           .rss = rss_bytes(self), .tracked = -1};
#ifdef Py_TRACK_MEMORY
    /* Its counts are read without the GIL: a sum of words. */
    sample.tracked = _PyMemTrack_TotalBytes();
#endif
    pthread_mutex_lock(&self->lock);
    if (grow((void **)&self->memory, &self->memory_capacity, self->nmemory,
             sizeof(MemorySample)) == 0)
    {
        self->memory[self->nmemory++] = sample;
#ifdef Py_TRACK_MEMORY
        /* The tags need the GIL (the reading walks the pools that changed
           since the last): the thread holding it reads them at its next
           check point.  A sample whose reading has not come by the next
           one's goes without, and so do those during a reading and too
           soon after it. */
        if (self->tags_wanted >= 0 || monotonic_ns() >= self->tags_next_ns) {
            self->tags_wanted = self->nmemory - 1;
            wanted = 1;
        }
#endif
    }
    else {
        self->out_of_memory = 1;
    }
    pthread_mutex_unlock(&self->lock);
    return wanted;
}

#ifdef Py_TRACK_MEMORY
/* The index of a tag's name, copied the first time. */
static int32_t
tag_name(SamplerObject *self, const char *name)
{
    for (Py_ssize_t i = 0; i < self->ntag_names; i++) {
        if (strcmp(self->tag_names[i], name) == 0) {
            return (int32_t)i;
        }
    }
    if (self->ntag_names >= INT32_MAX
        || grow((void **)&self->tag_names, &self->tag_names_capacity,
                self->ntag_names, sizeof(char *)) < 0)
    {
        return -1;
    }
    size_t size = strlen(name) + 1;
    char *copy = malloc(size);
    if (copy == NULL) {
        return -1;
    }
    memcpy(copy, name, size);
    self->tag_names[self->ntag_names] = copy;
    return (int32_t)self->ntag_names++;
}

/* Read the top tags of memory sample i, with the GIL held. */
static void
read_top_tags(SamplerObject *self, Py_ssize_t i)
{
    _PyMemTrack_TagBytes top[TOP_TAGS];
    int64_t start = monotonic_ns();
    Py_ssize_t n = _PyMemTrack_TopTags(top, TOP_TAGS);
    int64_t end = monotonic_ns();
    pthread_mutex_lock(&self->lock);
    self->tags_next_ns = end + (end - start) * (TAGS_SHARE - 1);
    Py_ssize_t first = self->ntags;
    if (n < 0) {
        self->out_of_memory = 1;
        goto done;
    }
    for (Py_ssize_t k = 0; k < n; k++) {
        int32_t name = tag_name(self, top[k].name);
        if (name < 0 || self->ntags >= INT32_MAX
            || grow((void **)&self->tags, &self->tags_capacity, self->ntags,
                    sizeof(TagBytes)) < 0)
        {
            self->ntags = first;
            self->out_of_memory = 1;
            goto done;
        }
        self->tags[self->ntags++] = (TagBytes){name, top[k].bytes};
    }
    self->memory[i].first_tag = (int32_t)first;
    self->memory[i].ntags = (int32_t)n;
done:
    pthread_mutex_unlock(&self->lock);
}
#endif

#ifdef __linux__
/* Since Linux 6.6 (EEVDF), a thread of the normal class may ask for a short
   time slice, and is then run soon after it wakes rather than after the
   slice of a thread that runs long (a thread holding the GIL); earlier
   kernels ignore the request.  Its nice value stays as it is. */
static void
ask_for_short_slices(void)
{
#ifdef SYS_sched_setattr
    struct {
        uint32_t size, policy;
        uint64_t flags;
        int32_t nice;
        uint32_t priority;
        uint64_t runtime, deadline, period;
    } attr = {.size = sizeof(attr), .policy = SCHED_OTHER,
              .runtime = 100000};
    errno = 0;
    int nice = getpriority(PRIO_PROCESS, 0);
    if (errno == 0) {
        attr.nice = nice;
        (void)syscall(SYS_sched_setattr, 0, &attr, 0);
    }
#endif
}

/* For move_sampler_off(). */
static void
set_sampler_tid(SamplerObject *self, pid_t tid)
{
    pthread_mutex_lock(&self->lock);
    self->sampler_tid = tid;
    pthread_mutex_unlock(&self->lock);
}
#endif

/* Waits until `deadline`, with `wake_lock` held (and let go while it
   waits); 0 then, -1 when asked to stop. */
static int
wait_until(SamplerObject *self, int64_t deadline)
{
    while (!_Py_atomic_load_relaxed(&self->stop_asked)) {
        int64_t now = monotonic_ns();
        if (now >= deadline) {
            return 0;
        }
        if (self->interval_ns < SLEEPLESS_NS) {
            pthread_mutex_unlock(&self->wake_lock);
            while (monotonic_ns() < deadline
                   && !_Py_atomic_load_relaxed(&self->stop_asked))
            {
                ;
            }
            pthread_mutex_lock(&self->wake_lock);
            continue;
        }
        struct timespec ts = {.tv_sec = deadline / 1000000000,
                              .tv_nsec = deadline % 1000000000};
        (void)pthread_cond_timedwait(&self->wake, &self->wake_lock, &ts);
    }
    return -1;
}

static void *
sampler_main(void *arg)
{
    SamplerObject *self = arg;
#ifdef __linux__
    /* Wake at the deadline, not up to 50 microseconds after it. */
    (void)prctl(PR_SET_TIMERSLACK, 1UL);
    ask_for_short_slices();
    set_sampler_tid(self, (pid_t)syscall(SYS_gettid));
#endif
    uint64_t tick = 0;
    /* Held but while waiting: a fork waits for a tick to end (see
       before_fork()). */
    pthread_mutex_lock(&self->wake_lock);
    while (wait_until(self, self->start_ns
                            + (int64_t)(tick + 1) * self->interval_ns) == 0)
    {
        /* Absolute deadlines: after a stall, the ticks that passed are
           one sample's weight, not a burst of samples. */
        uint64_t due = tick_at(self, monotonic_ns()) - 1;
        if (due > UINT32_MAX) {
            break;
        }
        uint32_t weight = (uint32_t)(due - tick);
        self->ticks_taken++;
        self->ticks_missed += weight - 1;
        take_tick(self, (uint32_t)due, weight, NULL);
        if (self->memory_every
            && due / self->memory_every != tick / self->memory_every)
        {
            if (take_memory_sample(self, (uint32_t)due)) {
                tell_holder(self);
            }
        }
        self->last_tick = (uint32_t)due;
        tick = due;
#ifdef __linux__
        _Py_atomic_store_relaxed(&self->sampler_cpu, sched_getcpu());
#endif
    }
    pthread_mutex_unlock(&self->wake_lock);
#ifdef __linux__
    set_sampler_tid(self, 0);
#endif
    return NULL;
}


/* The interpreter's side: the answer of the thread holding the GIL, and
   the death of code objects.  Both run with the GIL held. */

/* The node that tstate's answer at a check point stands for.  At a RESUME
   its frame has run none of its code since it started or was resumed: the
   ticks since the request are its caller's, at the call.  (Answered late
   there, the caller was in C with no check point after it, such as a big
   multiplication in the call's arguments, or the system had taken its
   CPU away.) */
static int32_t
answer_node(SamplerObject *self, PyThreadState *tstate, int32_t thread)
{
    _PyInterpreterFrame *frame = tstate->cframe->current_frame;
    /* Its forms named: _PyOpcode_Deopt is not exported to modules. */
    int opcode = _Py_OPCODE(*frame->prev_instr);
    if (opcode == RESUME || opcode == RESUME_QUICK
        || opcode == INSTRUMENTED_RESUME)
    {
        /* The caller: the next frame that has begun running its code. */
        _PyInterpreterFrame *caller = frame->previous;
        while (caller != NULL && _PyFrame_IsIncomplete(caller)) {
            caller = caller->previous;
        }
        if (caller != NULL) {
            frame = caller;
        }
    }
    return intern_stack(self, frame,
                        thread < 0 ? NULL : &self->threads[thread]);
}

/* Record the stack of tstate, holding the GIL, if asked for it.  Returns
   whether threads are still to be named. */
static int
answer_request(SamplerObject *self, PyThreadState *tstate)
{
    pthread_mutex_lock(&self->lock);
    if (self->request.pending && self->request.tstate_id == tstate->id
        && tstate->interp == self->interp)
    {
        /* Answered late, it was in a long call of C code meanwhile, or in
           a long instruction. */
        int32_t thread = thread_index(self, tstate);
        close_request(self, answer_node(self, tstate, thread), thread,
                      self->request.late ? STATUS_IN_C : STATUS_RUNNING);
    }
    int unnamed = self->nunnamed > 0;
    pthread_mutex_unlock(&self->lock);
    return unnamed;
}

/* `name` of `obj`, where neither its type nor a base defines it: read
   from the instance, with no code run; NULL where it has none. */
static PyObject *
instance_attribute(PyObject *obj, const char *name)
{
    PyObject *key = PyUnicode_InternFromString(name);
    if (key == NULL) {
        return NULL;
    }
    PyObject *value = NULL;
    if (_PyType_Lookup(Py_TYPE(obj), key) == NULL) {
        value = _PyObject_GenericGetAttrWithDict(obj, key, NULL, 1);
    }
    Py_DECREF(key);
    return value;
}

/* The name threading gave the thread of `ident` and `native_id`, found in
   `active` (threading._active) while it runs; else NULL.  Compares keys
   that are exact ints, and reads attributes of instances only, so as to
   run no Python code (this is the eval loop's check point), and leaves
   any error as it found it. */
static PyObject *
threading_name(PyObject *active, unsigned long ident,
               unsigned long native_id)
{
    PyObject *type, *value, *traceback;
    PyErr_Fetch(&type, &value, &traceback);
    PyObject *name = NULL;
    PyObject *thread = NULL;
    Py_ssize_t pos = 0;
    PyObject *key, *item;
    while (thread == NULL && PyDict_Next(active, &pos, &key, &item)) {
        if (PyLong_CheckExact(key)) {
            if (PyLong_AsUnsignedLong(key) == ident) {
                thread = Py_NewRef(item);
            }
            PyErr_Clear();   /* a negative key */
        }
    }
    if (thread != NULL) {
        /* The ident of a thread gone may be another's now. */
        PyObject *id = instance_attribute(thread, "_native_id");
        if (id != NULL && PyLong_CheckExact(id)
            && PyLong_AsUnsignedLong(id) == native_id)
        {
            name = instance_attribute(thread, "_name");
            if (name != NULL && !PyUnicode_CheckExact(name)) {
                Py_CLEAR(name);
            }
        }
        Py_XDECREF(id);
        Py_DECREF(thread);
    }
    PyErr_Clear();
    PyErr_Restore(type, value, traceback);
    return name;
}

/* At most this many threads are looked up in threading at one answer. */
#define NAMES_PER_ANSWER 4

/* Keeps in `unnamed` the threads still unnamed and running: found in the
   latest walk, and not ended. */
static void
keep_unnamed(SamplerObject *self)
{
    int32_t kept = 0;
    for (int32_t i = 0; i < self->nunnamed; i++) {
        ThreadInfo *info = &self->threads[self->unnamed[i]];
        if (info->name == NULL && info->walk == self->walks && !info->ended) {
            self->unnamed[kept++] = self->unnamed[i];
        }
    }
    self->nunnamed = kept;
    self->unnamed_next = kept ? self->unnamed_next % kept : 0;
}

/* Names threads from threading while they run: those that came and went
   between start() and stop() are named too.  Each answer looks up a few,
   in turn, as threading knows a new thread only once it has started; a
   thread not found in the latest walk is gone and goes without. */
static void
name_threads(SamplerObject *self)
{
    PyObject *active = self->threading_active;
    if (active == NULL) {
        return;
    }
    /* A thread looked up in vain is looked up again once the table has
       changed: a thread state outside threading costs a comparison. */
    uint64_t version = ((PyDictObject *)active)->ma_version_tag;
    struct {
        int32_t thread;
        unsigned long ident, native_id;
        PyObject *name;
    } wanted[NAMES_PER_ANSWER];
    int nwanted = 0;
    pthread_mutex_lock(&self->lock);
    keep_unnamed(self);
    for (int32_t i = 0; i < self->nunnamed && nwanted < NAMES_PER_ANSWER;
         i++)
    {
        int32_t thread = self->unnamed[(self->unnamed_next + i)
                                       % self->nunnamed];
        ThreadInfo *info = &self->threads[thread];
        if (info->looked_up != version) {
            info->looked_up = version;
            wanted[nwanted].thread = thread;
            wanted[nwanted].ident = info->ident;
            wanted[nwanted].native_id = info->native_id;
            nwanted++;
        }
    }
    uint64_t generation = self->store_generation;
    pthread_mutex_unlock(&self->lock);
    if (nwanted == 0) {
        return;
    }
    /* Only a hostile key (a hash equal to a name's, an __eq__ in Python)
       could run code below, and that code stop the sampler or start it
       again: the references and the generation keep that safe. */
    Py_INCREF(self);
    Py_INCREF(active);
    for (int i = 0; i < nwanted; i++) {
        wanted[i].name = threading_name(active, wanted[i].ident,
                                        wanted[i].native_id);
    }
    Py_DECREF(active);
    pthread_mutex_lock(&self->lock);
    for (int i = 0; i < nwanted && self->store_generation == generation;
         i++)
    {
        ThreadInfo *info = &self->threads[wanted[i].thread];
        if (info->name == NULL) {
            info->name = wanted[i].name;
            wanted[i].name = NULL;
        }
    }
    self->unnamed_next += nwanted;
    keep_unnamed(self);
    pthread_mutex_unlock(&self->lock);
    for (int i = 0; i < nwanted; i++) {
        Py_XDECREF(wanted[i].name);
    }
    Py_DECREF(self);
}

#ifdef __linux__
/* A thread that wakes on the CPU of the thread holding the GIL preempts
   it: two context switches for the program at every tick.  The kernel
   tends to wake the sampler on the CPU where it slept, and when the GIL
   changes hands the new holder may be running there.  So the holder,
   answering on the CPU where the sampler sleeps, moves the sampler to the
   others before it wakes.  (Two vCPUs, four threads contending, 10 kHz:
   37% of the ticks woke on the holder's CPU, and the program ran 1.12
   times as long.  With the sampler moving itself when it woke there,
   1.6% and 1.03, each move preempting the holder for 40-160
   microseconds; with this, none of the ticks.) */
static void
move_sampler_off(SamplerObject *self, int cpu)
{
    cpu_set_t others = self->cpus;
    CPU_CLR(cpu, &others);
    if (CPU_COUNT(&others) == 0) {
        return;
    }
    pthread_mutex_lock(&self->lock);
    /* Under the lock, the id is that of a thread still running. */
    if (self->sampler_tid != 0) {
        (void)sched_setaffinity(self->sampler_tid, sizeof(others), &others);
        _Py_atomic_store_relaxed(&self->sampler_cpu, -1);
    }
    pthread_mutex_unlock(&self->lock);
}
#endif

static void
answer(PyThreadState *tstate)
{
    SamplerObject *self = active;
    if (self == NULL) {
        return;
    }
#ifdef __linux__
    int cpu = sched_getcpu();
    if (cpu >= 0 && cpu < CPU_SETSIZE
        && cpu == _Py_atomic_load_relaxed(&self->sampler_cpu))
    {
        move_sampler_off(self, cpu);
    }
#endif
    if (answer_request(self, tstate) && tstate->interp == self->interp) {
        name_threads(self);
    }
#ifdef Py_TRACK_MEMORY
    pthread_mutex_lock(&self->lock);
    Py_ssize_t tags_wanted = self->tags_wanted;
    self->tags_wanted = -1;
    if (tags_wanted >= 0) {
        self->tags_next_ns = INT64_MAX;
    }
    pthread_mutex_unlock(&self->lock);
    if (tags_wanted >= 0) {
        read_top_tags(self, tags_wanted);
        /* The ticks the reading took are this thread's, here, in C: not
           those of its next check point's line. */
        answer_request(self, tstate);
    }
#endif
}

/* A thread clears its state, holding the GIL, its frames gone: the last
   the sampler sees of it.  Its ticks not yet counted go to the stack of its
   latest sample: the request it did not answer, and in cpu mode the CPU
   time it used since its last count.  In cpu mode a thread that threading
   started since start() and that ended between two ticks, never looked
   at, counts all of it, with no stack.  (threading's Thread sets the
   state's on_delete as it starts; a C thread calling Python may make a
   state for each call, long after its own start.) */
static void
end_thread(SamplerObject *self, PyThreadState *tstate)
{
    pthread_mutex_lock(&self->lock);
    int32_t thread = known_thread(self, tstate);
    ThreadInfo *info = thread >= 0 ? &self->threads[thread] : NULL;
    if (info != NULL) {
        info->ended = 1;
    }
    int32_t node = info != NULL && info->last_sample >= 0
                   ? self->samples[info->last_sample].node : -1;
    if (info != NULL && self->request.pending
        && self->request.tstate_id == tstate->id)
    {
        close_request(self, node, thread, STATUS_IN_C);
    }
    if (!self->cpu_mode
        || (info == NULL && !(started_since_start(self, tstate)
                              && watches(self, tstate))))
    {
        goto done;
    }
    int64_t cpu_ns = info != NULL ? thread_cpu_ns(info)
                                  : clock_ns(CLOCK_THREAD_CPUTIME_ID);
    if (cpu_ns < 0) {
        goto done;
    }
    if (info == NULL) {
        self->cpu_left_ns += cpu_ns;
    }
    else {
        self->cpu_left_ns += cpu_ns - info->cpu_ns;
    }
    if (self->cpu_left_ns < self->interval_ns / 2) {
        goto done;
    }
    /* Later than every tick taken. */
    uint64_t tick = tick_at(self, monotonic_ns());
    if (tick > UINT32_MAX) {
        goto done;
    }
    if (info == NULL) {
        thread = thread_index(self, tstate);
        if (thread < 0) {
            self->out_of_memory = 1;
            goto done;
        }
        info = &self->threads[thread];
        info->ended = 1;
    }
    uint64_t since = tick;
    if (info->last_sample >= 0) {
        since -= self->samples[info->last_sample].tick;
    }
    /* Not more than its time since: the rest goes to the next one. */
    uint64_t ticks = Py_MIN(
        (uint64_t)(self->cpu_left_ns + self->interval_ns / 2)
        / (uint64_t)self->interval_ns, since);
    add_sample(self, (uint32_t)tick, node, thread, STATUS_RUNNING,
               (uint32_t)ticks);
    self->cpu_left_ns -= (int64_t)ticks * self->interval_ns;
done:
    pthread_mutex_unlock(&self->lock);
}

static void
state_cleared(PyThreadState *tstate)
{
    SamplerObject *self = active;
    /* Not the states that Py_Finalize() clears of other threads. */
    if (self != NULL && tstate == _PyThreadState_GET()
        && tstate->interp == self->interp)
    {
        end_thread(self, tstate);
    }
}

/* The names of a code object and the lines of its nodes, while it is
   alive. */
static void
resolve_code(SamplerObject *self, CodeEntry *entry)
{
    PyCodeObject *code = entry->code;
    entry->name = Py_NewRef(code->co_qualname);
    entry->filename = Py_NewRef(code->co_filename);
    entry->firstlineno = code->co_firstlineno;
    if (self->lines_capacity < self->nnodes) {
        /* While sampling, room for more nodes; at stop, just enough. */
        int32_t capacity = self->running ? self->nodes_capacity
                                         : self->nnodes;
        NodeLines *lines = realloc(
            self->lines, (size_t)capacity * sizeof(NodeLines));
        if (lines == NULL) {
            self->out_of_memory = 1;
            return;
        }
        self->lines = lines;
        self->lines_capacity = capacity;
    }
    for (int32_t n = entry->first_node; n >= 0;
         n = self->nodes[n].next_of_code)
    {
        NodeLines *at = &self->lines[n];
        if (!PyCode_Addr2Location(code,
                                  self->nodes[n].unit
                                  * (int)sizeof(_Py_CODEUNIT),
                                  &at->lineno, &at->col, &at->end_lineno,
                                  &at->end_col))
        {
            *at = (NodeLines){-1, -1, -1, -1};
        }
    }
}

static void
code_died(PyCodeObject *code)
{
    SamplerObject *self = active;
    if (self == NULL) {
        return;
    }
    pthread_mutex_lock(&self->lock);
    int32_t index = find_code(self, code);
    if (index >= 0) {
        resolve_code(self, &self->codes[index]);
        self->codes[index].retired = 1;
        /* The paths kept may hold it. */
        self->epoch++;
    }
    pthread_mutex_unlock(&self->lock);
}

/* With the sampler thread stopped: the code objects still alive are
   resolved. */
static void
resolve_all(SamplerObject *self)
{
    for (int32_t i = 0; i < self->ncodes; i++) {
        CodeEntry *entry = &self->codes[i];
        if (!entry->retired) {
            resolve_code(self, entry);
            entry->retired = 1;
        }
    }
}


/* Starting and stopping */

static void
clear_store(SamplerObject *self)
{
    for (int32_t i = 0; i < self->ncodes; i++) {
        Py_XDECREF(self->codes[i].name);
        Py_XDECREF(self->codes[i].filename);
    }
    free(self->nodes);
    free(self->lines);
    table_clear(&self->node_table);
    free(self->codes);
    table_clear(&self->code_table);
    free(self->samples);
    free(self->memory);
    free(self->tags);
    for (Py_ssize_t i = 0; i < self->ntag_names; i++) {
        free(self->tag_names[i]);
    }
    free(self->tag_names);
    for (int32_t i = 0; i < self->nthreads; i++) {
        free(self->threads[i].path);
        Py_XDECREF(self->threads[i].name);
    }
    free(self->threads);
    table_clear(&self->thread_table);
    free(self->unnamed);
    self->unnamed = NULL;
    self->nunnamed = self->unnamed_capacity = self->unnamed_next = 0;
    self->walks = 0;
    Py_CLEAR(self->threading_active);
    self->store_generation++;
    self->nodes = NULL;
    self->lines = NULL;
    self->lines_capacity = 0;
    self->codes = NULL;
    self->samples = NULL;
    self->memory = NULL;
    self->tags = NULL;
    self->tag_names = NULL;
    self->threads = NULL;
    self->nnodes = self->nodes_capacity = 0;
    self->ncodes = self->codes_capacity = 0;
    self->nsamples = self->samples_capacity = 0;
    self->nmemory = self->memory_capacity = 0;
    self->ntags = self->tags_capacity = 0;
    self->ntag_names = self->tag_names_capacity = 0;
    self->tags_wanted = -1;
    self->tags_next_ns = 0;
    self->nthreads = self->threads_capacity = 0;
    self->out_of_memory = 0;
    self->ticks_taken = self->ticks_missed = 0;
    self->last_tick = 0;
}

/* The thread's locks and its clock, which waits for absolute deadlines of
   the monotonic clock. */
static int
init_locks(SamplerObject *self)
{
    pthread_condattr_t attr;
    if (pthread_condattr_init(&attr) != 0) {
        return -1;
    }
    int err = (pthread_condattr_setclock(&attr, CLOCK_MONOTONIC) != 0
               || pthread_mutex_init(&self->lock, NULL) != 0
               || pthread_mutex_init(&self->wake_lock, NULL) != 0
               || pthread_cond_init(&self->wake, &attr) != 0);
    pthread_condattr_destroy(&attr);
    return err ? -1 : 0;
}

/* Stops the sampler thread and the answers; with the GIL held. */
static void
stop_thread(SamplerObject *self)
{
    pthread_mutex_lock(&self->wake_lock);
    _Py_atomic_store_relaxed(&self->stop_asked, 1);
    pthread_cond_signal(&self->wake);
    pthread_mutex_unlock(&self->wake_lock);
    /* It never waits for the GIL, and never runs Python code. */
    Py_BEGIN_ALLOW_THREADS
    pthread_join(self->thread, NULL);
    Py_END_ALLOW_THREADS
    _PySampling.answer = NULL;
    _PySampling.state_cleared = NULL;
    _Py_atomic_store_relaxed(&_PySampling.request, 0);
}

/* With no sampler running any more: the code objects still alive name
   their nodes now, and then no death needs telling. */
static void
retire(SamplerObject *self)
{
    assert(active == self && !self->running);
    resolve_all(self);
    _PySampling.code_died = NULL;
    if (self->statm >= 0) {
        close(self->statm);
        self->statm = -1;
    }
    self->forked = 0;
    active = NULL;
    Py_DECREF(self);
}

static void
stop(SamplerObject *self)
{
    assert(active == self && self->running);
    /* The sampler sleeps until its next tick is due: ticks that came due
       after that one, before it was asked to stop, passed while it was
       kept from waking (a stall), missed as if it had woken then.  Not
       those of the wait for the GIL after stop_thread(). */
    uint64_t asked = tick_at(self, monotonic_ns());
    stop_thread(self);
    if (asked >= (uint64_t)self->last_tick + 2) {
        self->ticks_missed += asked - self->last_tick - 2;
    }
    /* The last sample: with the GIL held here, no other thread can change
       its frames, and this one is at its call of stop(). */
    self->stop_ns = monotonic_ns();
    /* The ticks since the sampler's last, the one under way included. */
    uint64_t due = tick_at(self, self->stop_ns);
    if (due > self->last_tick && due <= UINT32_MAX) {
        take_tick(self, (uint32_t)due, (uint32_t)due - self->last_tick,
                  _PyThreadState_GET());
        self->last_tick = (uint32_t)due;
    }
    if (self->memory_every) {
        take_memory_sample(self, self->last_tick);
#ifdef Py_TRACK_MEMORY
        /* The last sample's tags, whatever they cost. */
        self->tags_wanted = -1;
        if (!self->out_of_memory) {
            read_top_tags(self, self->nmemory - 1);
        }
#endif
    }
    self->running = 0;
    retire(self);
}


/* A forked child has no sampler thread: the sampler stops there, keeping
   what it had.  At the fork itself only what needs no lock and no Python
   is done; the child retires the sampler as it comes back to Python
   (os.register_at_fork), and the code objects it frees meanwhile are told
   of as before. */

/* No tick is under way at the fork: the sampler thread holds the GIL's
   mutex during a tick, and the child would find it locked by a thread it
   does not have (and fail to recreate the GIL). */
static void
before_fork(void)
{
    if (active != NULL && active->running) {
        pthread_mutex_lock(&active->wake_lock);
        pthread_mutex_lock(&active->lock);
    }
}

static void
after_fork_in_parent(void)
{
    if (active != NULL && active->running) {
        pthread_mutex_unlock(&active->lock);
        pthread_mutex_unlock(&active->wake_lock);
    }
}

static void
after_fork_in_child(void)
{
    SamplerObject *self = active;
    if (self == NULL || !self->running) {
        return;
    }
    (void)init_locks(self);
    _PySampling.answer = NULL;
    _PySampling.state_cleared = NULL;
    _Py_atomic_store_relaxed(&_PySampling.request, 0);
    self->request.pending = 0;
    self->stop_ns = monotonic_ns();
    self->running = 0;
    self->forked = 1;
    _Py_atomic_store_relaxed(&self->stop_asked, 1);
}

/* The child's sampler, stopped by the fork, is retired. */
static void
retire_forked(void)
{
    if (active != NULL && active->forked) {
        retire(active);
    }
}


/* The Sampler type */

/*[clinic input]
_sampling.Sampler.__init__

    interval: double
    *
    mode: str = "wall"
    thread: object = None
    memory_interval: double = 0.0

The engine of profiling.sampling.Sampler.

interval is the time between samples, in seconds (at least 10
microseconds).  In "wall" mode every watched thread is sampled at each
tick, whatever it does; in "cpu" mode only those using the CPU.  thread
is the ident (threading.get_ident()) of the thread to watch, or None for
all.  memory_interval, when positive, is the time between memory samples
(rounded to a number of ticks).
[clinic start generated code]*/

static int
_sampling_Sampler___init___impl(SamplerObject *self, double interval,
                                const char *mode, PyObject *thread,
                                double memory_interval)
/*[clinic end generated code: output=1b07dc252813a81c input=e1e3e1e960d870d8]*/
{
    if (self->running) {
        PyErr_SetString(PyExc_RuntimeError,
                        "cannot reinitialize a running sampler");
        return -1;
    }
    if (!(interval >= 1e-5 && interval <= 3600.0)) {
        PyErr_SetString(PyExc_ValueError,
                        "the interval must be between 10 microseconds and "
                        "an hour");
        return -1;
    }
    int cpu_mode;
    if (strcmp(mode, "wall") == 0) {
        cpu_mode = 0;
    }
    else if (strcmp(mode, "cpu") == 0) {
        cpu_mode = 1;
    }
    else {
        PyErr_Format(PyExc_ValueError,
                     "mode must be 'wall' or 'cpu', not '%s'", mode);
        return -1;
    }
    unsigned long ident = 0;
    if (thread != Py_None) {
        if (!PyLong_Check(thread)) {
            PyErr_Format(PyExc_TypeError,
                         "thread must be an int (a thread's ident) or None, "
                         "not %.200s", Py_TYPE(thread)->tp_name);
            return -1;
        }
        ident = PyLong_AsUnsignedLong(thread);
        if (ident == (unsigned long)-1 && PyErr_Occurred()) {
            return -1;
        }
    }
    if (!(memory_interval >= 0.0) || memory_interval > 3600.0) {
        PyErr_SetString(PyExc_ValueError,
                        "memory_interval must be 0 (none) or up to an hour");
        return -1;
    }
    self->interval_ns = (int64_t)(interval * 1e9);
    self->cpu_mode = cpu_mode;
    self->all_threads = thread == Py_None;
    self->only_ident = ident;
    self->memory_every = memory_interval > 0.0
        ? (uint32_t)Py_MAX(1.0, memory_interval / interval + 0.5) : 0;
    return 0;
}

/* Keeps threading._active, where threads are named (name_threads()). */
static int
find_threading_active(SamplerObject *self)
{
    PyObject *threading = PyImport_GetModule(&_Py_ID(threading));
    if (threading == NULL) {
        return PyErr_Occurred() ? -1 : 0;
    }
    PyObject *active = PyObject_GetAttrString(threading, "_active");
    Py_DECREF(threading);
    if (active == NULL) {
        if (!PyErr_ExceptionMatches(PyExc_AttributeError)) {
            return -1;
        }
        PyErr_Clear();
        return 0;
    }
    if (PyDict_CheckExact(active)) {
        self->threading_active = active;
        return 0;
    }
    Py_DECREF(active);
    return 0;
}

/*[clinic input]
_sampling.Sampler.start

Start sampling, in a thread of the sampler's own.

Only one sampler runs at a time.  What an earlier run recorded is
dropped.
[clinic start generated code]*/

static PyObject *
_sampling_Sampler_start_impl(SamplerObject *self)
/*[clinic end generated code: output=52c29ee4de07ae38 input=2d2e57c2fa621a9d]*/
{
    if (self->interval_ns == 0) {
        PyErr_SetString(PyExc_RuntimeError, "the sampler was not initialized");
        return NULL;
    }
    retire_forked();
    if (active != NULL) {
        PyErr_SetString(PyExc_RuntimeError,
                        active == self ? "the sampler is already running"
                                       : "another sampler is running");
        return NULL;
    }
    clear_store(self);
    PyThreadState *tstate = _PyThreadState_GET();
    self->interp = tstate->interp;
    if (find_threading_active(self) < 0) {
        return NULL;
    }
    self->statm = open("/proc/self/statm", O_RDONLY | O_CLOEXEC);
    self->request.pending = 0;
    self->cpu_left_ns = 0;
    PyThread_acquire_lock(_PyRuntime.interpreters.mutex, WAIT_LOCK);
    self->last_id_at_start = self->interp->threads.next_unique_id;
    PyThread_release_lock(_PyRuntime.interpreters.mutex);
    _Py_atomic_store_relaxed(&self->stop_asked, 0);
#ifdef __linux__
    _Py_atomic_store_relaxed(&self->sampler_cpu, -1);
    self->sampler_tid = 0;
    /* The CPUs the sampler thread may use: this thread's, which it
       inherits. */
    if (sched_getaffinity(0, sizeof(self->cpus), &self->cpus) != 0) {
        CPU_ZERO(&self->cpus);
    }
#endif
    self->start_ns = monotonic_ns();
    active = (SamplerObject *)Py_NewRef(self);
    _PySampling.answer = answer;
    _PySampling.state_cleared = state_cleared;
    _PySampling.code_died = code_died;
    int err = pthread_create(&self->thread, NULL, sampler_main, self);
    if (err != 0) {
        _PySampling.answer = NULL;
        _PySampling.state_cleared = NULL;
        _PySampling.code_died = NULL;
        active = NULL;
        Py_DECREF(self);
        if (self->statm >= 0) {
            close(self->statm);
            self->statm = -1;
        }
        errno = err;
        PyErr_SetFromErrno(PyExc_OSError);
        return NULL;
    }
#ifdef __linux__
    /* For tools (top -H) to show, from when start() returns. */
    (void)pthread_setname_np(self->thread, "sampler");
#endif
    self->running = 1;
    Py_RETURN_NONE;
}

/*[clinic input]
_sampling.Sampler.stop

Stop sampling, after a last sample of the threads watched.
[clinic start generated code]*/

static PyObject *
_sampling_Sampler_stop_impl(SamplerObject *self)
/*[clinic end generated code: output=a46c114f2ceb29e6 input=865167c291c2d56c]*/
{
    if (!self->running) {
        PyErr_SetString(PyExc_RuntimeError, "the sampler is not running");
        return NULL;
    }
    stop(self);
    if (self->out_of_memory) {
        PyErr_SetString(PyExc_MemoryError,
                        "memory was exhausted while sampling: some samples "
                        "are missing");
        return NULL;
    }
    Py_RETURN_NONE;
}

static PyObject *
sampler_running(SamplerObject *self, void *Py_UNUSED(closure))
{
    retire_forked();
    return PyBool_FromLong(self->running);
}

static int
require_stopped(SamplerObject *self)
{
    retire_forked();
    if (self->running) {
        PyErr_SetString(PyExc_RuntimeError,
                        "the sampler is running: stop() it first");
        return -1;
    }
    return 0;
}

/* A list of `count` items, the i-th made by item(self, i), of a sampler
   stopped. */
static PyObject *
make_list(SamplerObject *self, Py_ssize_t count,
          PyObject *(*item)(SamplerObject *, Py_ssize_t))
{
    if (require_stopped(self) < 0) {
        return NULL;
    }
    PyObject *list = PyList_New(count);
    for (Py_ssize_t i = 0; list != NULL && i < count; i++) {
        PyObject *value = item(self, i);
        if (value == NULL) {
            Py_CLEAR(list);
            break;
        }
        PyList_SET_ITEM(list, i, value);
    }
    return list;
}

static PyObject *
frame_item(SamplerObject *self, Py_ssize_t i)
{
    StackNode *node = &self->nodes[i];
    CodeEntry *of = &self->codes[node->code];
    NodeLines at = {-1, -1, -1, -1};
    if (i < self->lines_capacity) {
        at = self->lines[i];
    }
    return Py_BuildValue("(iOOiiiii)", node->parent,
                         of->name ? of->name : Py_None,
                         of->filename ? of->filename : Py_None,
                         of->firstlineno, at.lineno, at.end_lineno, at.col,
                         at.end_col);
}

static PyObject *
sample_item(SamplerObject *self, Py_ssize_t i)
{
    Sample *s = &self->samples[i];
    return Py_BuildValue("(kiiii)", (unsigned long)s->tick, s->node,
                         (int)s->thread,
                         s->weight_status & ((1 << WEIGHT_SHIFT) - 1),
                         s->weight_status >> WEIGHT_SHIFT);
}

static PyObject *
thread_item(SamplerObject *self, Py_ssize_t i)
{
    ThreadInfo *info = &self->threads[i];
    return Py_BuildValue("(kkO)", info->ident, info->native_id,
                         info->name != NULL ? info->name : Py_None);
}

static PyObject *
memory_item(SamplerObject *self, Py_ssize_t i)
{
    MemorySample *m = &self->memory[i];
    if (m->first_tag < 0) {
        return Py_BuildValue("(kLLO)", (unsigned long)m->tick,
                             (long long)m->rss, (long long)m->tracked,
                             Py_None);
    }
    PyObject *tags = PyDict_New();
    for (int32_t k = 0; tags != NULL && k < m->ntags; k++) {
        TagBytes *tag = &self->tags[m->first_tag + k];
        const char *text = self->tag_names[tag->name];
        PyObject *name = PyUnicode_DecodeUTF8(text, (Py_ssize_t)strlen(text),
                                              "replace");
        PyObject *bytes = PyLong_FromLongLong(tag->bytes);
        if (name == NULL || bytes == NULL
            || PyDict_SetItem(tags, name, bytes) < 0)
        {
            Py_CLEAR(tags);
        }
        Py_XDECREF(name);
        Py_XDECREF(bytes);
    }
    if (tags == NULL) {
        return NULL;
    }
    return Py_BuildValue("(kLLN)", (unsigned long)m->tick, (long long)m->rss,
                         (long long)m->tracked, tags);
}

/*[clinic input]
_sampling.Sampler.frames

Return the frames of the stacks sampled, a list of tuples.

Each is (parent, name, filename, firstlineno, lineno, end_lineno,
col_offset, end_col_offset): the index of the frame it was called from
(-1 for an outermost frame), its code's qualified name and file, and
where the instruction it was at is in the source (-1 where unknown).
[clinic start generated code]*/

static PyObject *
_sampling_Sampler_frames_impl(SamplerObject *self)
/*[clinic end generated code: output=c0f90e9fcffdca6d input=bf4f4b1567e17318]*/
{
    return make_list(self, self->nnodes, frame_item);
}

/*[clinic input]
_sampling.Sampler.samples

Return the samples, a list of tuples.

Each is (tick, frame, thread, status, weight): the tick it was taken at
(times the interval after the start), the index of its innermost frame
(-1 for an empty stack), the index of its thread, what the thread was
doing (an index into STATUSES), and the ticks it stands for.
[clinic start generated code]*/

static PyObject *
_sampling_Sampler_samples_impl(SamplerObject *self)
/*[clinic end generated code: output=cd2a401c4bd1fff2 input=cfce905f6645478c]*/
{
    return make_list(self, self->nsamples, sample_item);
}

/*[clinic input]
_sampling.Sampler.threads

Return the threads sampled: a list of (ident, native_id, name) tuples.

name is the thread's name in threading, looked up while it ran, or
None.
[clinic start generated code]*/

static PyObject *
_sampling_Sampler_threads_impl(SamplerObject *self)
/*[clinic end generated code: output=f86d155a38aebac4 input=34009914f0ec18f3]*/
{
    return make_list(self, self->nthreads, thread_item);
}

/*[clinic input]
_sampling.Sampler.memory

Return the memory samples: a list of (tick, rss, tracked, tags) tuples.

rss is the process's resident set in bytes (-1 where unknown); tracked
is sys.total_memory_used() on a build configured --with-memory-tracking,
else -1.  tags is, on such a build, a dict of the ten tags of
sys.type_memory_usage() that held the most bytes, largest first, read by
the thread holding the GIL at its next check point; None where no thread
ran Python code before the next memory sample, where the last reading was
too recent (the readings take at most 2% of the time), and without
tracking.
[clinic start generated code]*/

static PyObject *
_sampling_Sampler_memory_impl(SamplerObject *self)
/*[clinic end generated code: output=c71d0484f3d19675 input=0e0c0fd0c479c4f1]*/
{
    return make_list(self, self->nmemory, memory_item);
}

/*[clinic input]
_sampling.Sampler.info

Return how the run went, as a dict.

interval (seconds), ticks (intervals from start to stop), taken (ticks
the sampler woke for), missed (ticks that passed while it was late,
counted as weight of the next sample), duration (seconds), samples,
frames (the nodes of the interned stacks) and bytes (what the store
holds).
[clinic start generated code]*/

static PyObject *
_sampling_Sampler_info_impl(SamplerObject *self)
/*[clinic end generated code: output=942540a59a484534 input=20cdd3342237b3a6]*/
{
    int64_t end = self->running ? monotonic_ns() : self->stop_ns;
    size_t bytes = (size_t)self->nnodes * sizeof(StackNode)
                   + (size_t)self->lines_capacity * sizeof(NodeLines)
                   + (size_t)self->nsamples * sizeof(Sample)
                   + (size_t)self->nmemory * sizeof(MemorySample)
                   + (size_t)self->ntags * sizeof(TagBytes)
                   + (size_t)self->ncodes * sizeof(CodeEntry)
                   + (size_t)(self->node_table.mask + 1) * sizeof(int32_t)
                   + (size_t)(self->code_table.mask + 1) * sizeof(int32_t)
                   + (size_t)self->tag_names_capacity * sizeof(char *);
    for (Py_ssize_t i = 0; i < self->ntag_names; i++) {
        bytes += strlen(self->tag_names[i]) + 1;
    }
    return Py_BuildValue(
        "{sdsKsKsKsdsnsisn}",
        "interval", (double)self->interval_ns * 1e-9,
        "ticks", (unsigned long long)(self->start_ns == 0 ? 0
            : tick_at(self, end) - 1),
        "taken", (unsigned long long)self->ticks_taken,
        "missed", (unsigned long long)self->ticks_missed,
        "duration", self->start_ns == 0 ? 0.0
            : (double)(end - self->start_ns) * 1e-9,
        "samples", self->nsamples,
        "frames", (int)self->nnodes,
        "bytes", (Py_ssize_t)bytes);
}

static int
sampler_traverse(SamplerObject *self, visitproc visit, void *arg)
{
    Py_VISIT(Py_TYPE(self));
    return 0;
}

static void
sampler_dealloc(SamplerObject *self)
{
    /* A running sampler is kept alive by `active`. */
    assert(!self->running);
    PyObject_GC_UnTrack(self);
    clear_store(self);
    pthread_mutex_destroy(&self->lock);
    pthread_mutex_destroy(&self->wake_lock);
    pthread_cond_destroy(&self->wake);
    PyTypeObject *type = Py_TYPE(self);
    type->tp_free(self);
    Py_DECREF(type);
}

static PyObject *
sampler_new(PyTypeObject *type, PyObject *args, PyObject *kwargs)
{
    SamplerObject *self = (SamplerObject *)type->tp_alloc(type, 0);
    if (self == NULL) {
        return NULL;
    }
    self->statm = -1;
    if (init_locks(self) < 0) {
        Py_DECREF(self);
        return PyErr_NoMemory();
    }
    return (PyObject *)self;
}

static PyMethodDef sampler_methods[] = {
    _SAMPLING_SAMPLER_START_METHODDEF
    _SAMPLING_SAMPLER_STOP_METHODDEF
    _SAMPLING_SAMPLER_FRAMES_METHODDEF
    _SAMPLING_SAMPLER_SAMPLES_METHODDEF
    _SAMPLING_SAMPLER_THREADS_METHODDEF
    _SAMPLING_SAMPLER_MEMORY_METHODDEF
    _SAMPLING_SAMPLER_INFO_METHODDEF
    {NULL, NULL}
};

static PyGetSetDef sampler_getset[] = {
    {"running", (getter)sampler_running, NULL,
     PyDoc_STR("Whether the sampler runs.")},
    {NULL}
};

static PyType_Slot sampler_slots[] = {
    {Py_tp_doc, (void *)_sampling_Sampler___init____doc__},
    {Py_tp_new, sampler_new},
    {Py_tp_init, _sampling_Sampler___init__},
    {Py_tp_dealloc, sampler_dealloc},
    {Py_tp_traverse, sampler_traverse},
    {Py_tp_methods, sampler_methods},
    {Py_tp_getset, sampler_getset},
    {0, 0}
};

static PyType_Spec sampler_spec = {
    .name = "_sampling.Sampler",
    .basicsize = sizeof(SamplerObject),
    .flags = (Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE
              | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_IMMUTABLETYPE),
    .slots = sampler_slots,
};


/* The module */

/*[clinic input]
_sampling._after_fork_in_child

Retire the sampler a fork stopped (os.register_at_fork calls this).
[clinic start generated code]*/

static PyObject *
_sampling__after_fork_in_child_impl(PyObject *module)
/*[clinic end generated code: output=9c7dd306d05697e3 input=8dc70ba8d3df7e0d]*/
{
    retire_forked();
    Py_RETURN_NONE;
}

/*[clinic input]
_sampling._stop_at_exit

Stop the sampler running, if any, before the interpreter goes (atexit).
[clinic start generated code]*/

static PyObject *
_sampling__stop_at_exit_impl(PyObject *module)
/*[clinic end generated code: output=e52fe3b24500af1f input=0654d8383e2e3e95]*/
{
    retire_forked();
    if (active != NULL) {
        stop(active);
    }
    Py_RETURN_NONE;
}

/* Calls module.`function` with `args` and `kwargs`; 0 or -1. */
static int
call_method(const char *module, const char *function, PyObject *args,
            PyObject *kwargs)
{
    PyObject *callable = _PyImport_GetModuleAttrString(module, function);
    if (callable == NULL) {
        return -1;
    }
    PyObject *result = PyObject_Call(callable, args, kwargs);
    Py_DECREF(callable);
    Py_XDECREF(result);
    return result == NULL ? -1 : 0;
}

static int fork_handlers_set;

static int
sampling_exec(PyObject *module)
{
    if (!fork_handlers_set) {
        if (pthread_atfork(before_fork, after_fork_in_parent,
                           after_fork_in_child) != 0)
        {
            PyErr_NoMemory();
            return -1;
        }
        fork_handlers_set = 1;
    }
    /* What must run with the interpreter: in a forked child, and before
       the interpreter is finalized. */
    PyObject *retire_child = PyObject_GetAttrString(
        module, "_after_fork_in_child");
    PyObject *at_exit = PyObject_GetAttrString(module, "_stop_at_exit");
    PyObject *no_args = PyTuple_New(0);
    PyObject *kwargs = retire_child ? Py_BuildValue(
        "{sO}", "after_in_child", retire_child) : NULL;
    PyObject *exit_args = at_exit ? PyTuple_Pack(1, at_exit) : NULL;
    int err = (kwargs == NULL || exit_args == NULL || no_args == NULL
               || call_method("posix", "register_at_fork", no_args,
                              kwargs) < 0
               || call_method("atexit", "register", exit_args, NULL) < 0);
    Py_XDECREF(retire_child);
    Py_XDECREF(at_exit);
    Py_XDECREF(no_args);
    Py_XDECREF(kwargs);
    Py_XDECREF(exit_args);
    if (err) {
        return -1;
    }
    PyObject *type = PyType_FromModuleAndSpec(module, &sampler_spec, NULL);
    if (type == NULL || PyModule_AddType(module, (PyTypeObject *)type) < 0) {
        Py_XDECREF(type);
        return -1;
    }
    Py_DECREF(type);
    PyObject *statuses = PyTuple_New(STATUSES);
    for (int i = 0; statuses != NULL && i < STATUSES; i++) {
        PyObject *name = PyUnicode_FromString(status_names[i]);
        if (name == NULL) {
            Py_CLEAR(statuses);
            break;
        }
        PyTuple_SET_ITEM(statuses, i, name);
    }
    if (statuses == NULL
        || PyModule_AddObjectRef(module, "STATUSES", statuses) < 0)
    {
        Py_XDECREF(statuses);
        return -1;
    }
    Py_DECREF(statuses);
    return 0;
}

static PyModuleDef_Slot sampling_slots[] = {
    {Py_mod_exec, sampling_exec},
    {0, NULL}
};

static PyMethodDef sampling_functions[] = {
    _SAMPLING__AFTER_FORK_IN_CHILD_METHODDEF
    _SAMPLING__STOP_AT_EXIT_METHODDEF
    {NULL, NULL}
};

static struct PyModuleDef sampling_module = {
    PyModuleDef_HEAD_INIT,
    .m_name = "_sampling",
    .m_doc = "The sampling profiler of profiling.sampling.",
    .m_size = 0,
    .m_methods = sampling_functions,
    .m_slots = sampling_slots,
};

PyMODINIT_FUNC
PyInit__sampling(void)
{
    return PyModuleDef_Init(&sampling_module);
}
