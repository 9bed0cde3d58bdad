#ifndef Py_INTERNAL_SAMPLING_H
#define Py_INTERNAL_SAMPLING_H
#ifdef __cplusplus
extern "C" {
#endif

#ifndef Py_BUILD_CORE
#  error "this header requires Py_BUILD_CORE define"
#endif

#include "pycore_atomic.h"        // _Py_atomic_int

/* What the interpreter does for the sampling profiler
   (Modules/_profiling/sampling.c), which runs in a thread of its own that
   never takes the GIL.  It reads the frames of the threads that do not
   hold the GIL itself, holding the GIL's mutex so that none of them can
   take the GIL meanwhile.  The thread that holds the GIL it asks, through
   the eval breaker, to record its own stack at its next check point: the
   interpreter calls `answer` there.  A thread clearing its own state
   calls `state_cleared`, so that its last ticks are counted.  And as the
   samples keep code objects by address, `code_died` is told of each code
   object freed while a sampler runs, before its names are gone. */

#define _PySampling_WAITING_SLOTS 128

struct _Py_sampling_hooks {
    /* Set, with the interpreter's eval breaker, when a sample of the
       thread holding the GIL is wanted. */
    _Py_atomic_int request;
    /* Set while a sampler runs. */
    void (*answer)(PyThreadState *tstate);
    void (*state_cleared)(PyThreadState *tstate);
    void (*code_died)(PyCodeObject *code);
    /* Counts the takes of the GIL, with the GIL's mutex held: a thread
       without the GIL has the stack it had the last time the count was
       the same. */
    unsigned long gil_takes;
    /* The threads waiting in take_gil(), by their states' addresses: kept
       here, not in the states, because Py_Finalize() frees the states of
       daemon threads that may still be there.  Written and read with the
       GIL's mutex held; a thread that finds no free slot goes unmarked
       (and is shown idle). */
    PyThreadState *waiting[_PySampling_WAITING_SLOTS];
};

PyAPI_DATA(struct _Py_sampling_hooks) _PySampling;

/* take_gil() is to wait: the slot it took, or -1. */
static inline int
_PySampling_StartWaiting(PyThreadState *tstate)
{
    for (int i = 0; i < _PySampling_WAITING_SLOTS; i++) {
        if (_PySampling.waiting[i] == NULL) {
            _PySampling.waiting[i] = tstate;
            return i;
        }
    }
    return -1;
}

static inline void
_PySampling_StopWaiting(int slot)
{
    if (slot >= 0) {
        _PySampling.waiting[slot] = NULL;
    }
}

static inline int
_PySampling_IsWaiting(PyThreadState *tstate)
{
    for (int i = 0; i < _PySampling_WAITING_SLOTS; i++) {
        if (_PySampling.waiting[i] == tstate) {
            return 1;
        }
    }
    return 0;
}

/* Called first by PyThreadState_Clear(), for every state: before the
   state's on_delete lets Thread.join() return, so that a thread joined is
   counted to its end.  The sampler keeps to its own thread's. */
static inline void
_PySampling_ClearingState(PyThreadState *tstate)
{
    if (_PySampling.state_cleared != NULL) {
        _PySampling.state_cleared(tstate);
    }
}

/* Called by the eval loop when the eval breaker is set and a request is
   pending: records the stack of `tstate`, which holds the GIL. */
extern void _PySampling_Answer(PyThreadState *tstate);

#ifdef __cplusplus
}
#endif
#endif  /* !Py_INTERNAL_SAMPLING_H */
