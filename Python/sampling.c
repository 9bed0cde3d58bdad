/* The interpreter's side of the sampling profiler: see pycore_sampling.h
   and Modules/_profiling/sampling.c. */

#include "Python.h"
#include "pycore_sampling.h"

struct _Py_sampling_hooks _PySampling;

void
_PySampling_Answer(PyThreadState *tstate)
{
    _Py_atomic_store_relaxed(&_PySampling.request, 0);
    /* Set and cleared with the GIL held, as is this called. */
    if (_PySampling.answer != NULL) {
        _PySampling.answer(tstate);
    }
}
