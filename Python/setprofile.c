/* sys.setprofile() and PyEval_SetProfile() as a client of sys.monitoring.

   In 3.11 a profile function put the eval loop on its tracing path, which
   runs every instruction unspecialized: even code that makes no call ran
   at half speed.  Here a profile function is told of the events it has
   always been told of (3.11's order, arguments and frames) by C callbacks
   of the reserved tool 6, whose events are set while some thread of the
   interpreter has a profile function: code pays only where calls and
   returns are.  sys.settrace keeps the tracing path, which LINE needs. */

#include "Python.h"
#include "pycore_code.h"          // _PyCode_InitLineArray()
#include "pycore_frame.h"         // _PyInterpreterFrame
#include "pycore_monitoring.h"
#include "pycore_pyerrors.h"      // _PyErr_Fetch()
#include "pycore_pystate.h"       // _PyThreadState_GET()

#define EVENT(name) _PY_MONITORING_EVENT_##name

/* Calls the thread's profile function for its current frame, where the
   event happened, as 3.11's eval loop did: monitoring silences every hook
   meanwhile, as 3.11 did for the profile function.  An exception being
   propagated is kept aside meanwhile, and replaced if the function
   fails. */
static int
call_profile_function(PyThreadState *tstate, int what, PyObject *arg)
{
    Py_tracefunc func = tstate->c_profilefunc;
    if (func == NULL) {
        /* Another thread profiles; not this one. */
        return 0;
    }
    PyObject *type, *value, *tb;
    _PyErr_Fetch(tstate, &type, &value, &tb);
    _PyInterpreterFrame *frame = tstate->cframe->current_frame;
    PyFrameObject *f = _PyFrame_GetFrameObject(frame);
    int err = -1;
    if (f != NULL && _PyCode_InitLineArray(frame->f_code) == 0) {
        PyObject *obj = Py_XNewRef(tstate->c_profileobj);
        int old_what = tstate->tracing_what;
        tstate->tracing_what = what;
        f->f_lineno = _PyCode_LineNumberFromArray(
            frame->f_code, _PyInterpreterFrame_LASTI(frame));
        err = func(obj, f, what, arg);
        f->f_lineno = 0;
        tstate->tracing_what = old_what;
        Py_XDECREF(obj);
    }
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

static int
profile_call(void *unused, PyThreadState *tstate, PyCodeObject *code,
             long where, PyObject *arg1, PyObject *arg2)
{
    return call_profile_function(tstate, PyTrace_CALL, Py_None);
}

static int
profile_return(void *unused, PyThreadState *tstate, PyCodeObject *code,
               long where, PyObject *retval, PyObject *arg2)
{
    return call_profile_function(tstate, PyTrace_RETURN, retval);
}

/* A frame left by an exception returns NULL, as in 3.11. */
static int
profile_unwind(void *unused, PyThreadState *tstate, PyCodeObject *code,
               long where, PyObject *exc, PyObject *arg2)
{
    return call_profile_function(tstate, PyTrace_RETURN, NULL);
}

/* The C function a profile function is told of for a call of `callable`
   with first argument `arg0`, or NULL: as in 3.11, built-in functions, and
   method descriptors bound to their first argument. */
static PyObject *
c_function(PyObject *callable, PyObject *arg0, int *error)
{
    *error = 0;
    if (PyCFunction_CheckExact(callable) || PyCMethod_CheckExact(callable)) {
        return Py_NewRef(callable);
    }
    if (Py_IS_TYPE(callable, &PyMethodDescr_Type)
        && arg0 != _PyMonitoring_MISSING)
    {
        PyObject *bound = Py_TYPE(callable)->tp_descr_get(
            callable, arg0, (PyObject *)Py_TYPE(arg0));
        *error = bound == NULL;
        return bound;
    }
    return NULL;
}

static int
profile_c_event(PyThreadState *tstate, int what, PyObject *callable,
                PyObject *arg0)
{
    if (tstate->c_profilefunc == NULL) {
        return 0;
    }
    int error;
    PyObject *func = c_function(callable, arg0, &error);
    if (func == NULL) {
        return error ? -1 : 0;
    }
    int err = call_profile_function(tstate, what, func);
    Py_DECREF(func);
    return err;
}

static int
profile_c_call(void *unused, PyThreadState *tstate, PyCodeObject *code,
               long where, PyObject *callable, PyObject *arg0)
{
    return profile_c_event(tstate, PyTrace_C_CALL, callable, arg0);
}

static int
profile_c_return(void *unused, PyThreadState *tstate, PyCodeObject *code,
                 long where, PyObject *callable, PyObject *arg0)
{
    return profile_c_event(tstate, PyTrace_C_RETURN, callable, arg0);
}

static int
profile_c_raise(void *unused, PyThreadState *tstate, PyCodeObject *code,
                long where, PyObject *callable, PyObject *arg0)
{
    return profile_c_event(tstate, PyTrace_C_EXCEPTION, callable, arg0);
}

static const _PyMonitoring_NativeCallback profile_callbacks[] = {
    [EVENT(PY_START)] = profile_call,
    [EVENT(PY_RESUME)] = profile_call,
    [EVENT(PY_THROW)] = profile_call,
    [EVENT(PY_RETURN)] = profile_return,
    [EVENT(PY_YIELD)] = profile_return,
    [EVENT(PY_UNWIND)] = profile_unwind,
    [EVENT(CALL)] = profile_c_call,
    [EVENT(C_RETURN)] = profile_c_return,
    [EVENT(C_RAISE)] = profile_c_raise,
};

/* The events of tool 6 follow the count of threads with a profile
   function. */
static int
count_profiled_thread(PyInterpreterState *interp, int change)
{
    struct _Py_monitoring_state *state = &interp->monitoring;
    int before = state->profiled_threads;
    state->profiled_threads += change;
    assert(state->profiled_threads >= 0);
    if ((before == 0) == (state->profiled_threads == 0)) {
        return 0;
    }
    uint32_t events = 0;
    if (state->profiled_threads > 0) {
        for (size_t event = 0; event < Py_ARRAY_LENGTH(profile_callbacks);
             event++)
        {
            _PyMonitoring_SetNativeCallback(interp, _PY_MONITORING_PROFILE_ID,
                                            (int)event,
                                            profile_callbacks[event], NULL);
            if (profile_callbacks[event] != NULL) {
                events |= 1u << event;
            }
        }
    }
    return _PyMonitoring_SetToolEvents(interp, _PY_MONITORING_PROFILE_ID,
                                       events);
}

int
_PyMonitoring_ProfileFunctionChanged(PyThreadState *tstate, int had_one)
{
    int has_one = tstate->c_profilefunc != NULL;
    return count_profiled_thread(tstate->interp, has_one - had_one);
}

void
_PyMonitoring_ProfiledThreadGone(PyThreadState *tstate)
{
    PyInterpreterState *interp = tstate->interp;
    /* Once the interpreter is being finalized, its monitoring state goes
       as a whole (_PyMonitoring_Clear). */
    if (interp->monitoring.profiled_threads > 0
        && count_profiled_thread(interp, -1) < 0)
    {
        PyErr_WriteUnraisable(NULL);
    }
}
