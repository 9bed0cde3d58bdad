/* Memory accounting by purpose (Sightglass, ./configure --with-memory-tracking).

   In a tracking build every byte obtained through Python's allocators is
   counted, exactly (what the allocator reserves), under a tag: the type of
   the object it holds or owns, a name given by the code that allocated it,
   or "" when nothing claimed it.  sys.type_memory_usage() reports the tags.

   Code that allocates memory for a purpose of its own uses the PyObject_T_*
   macros; they are the plain object allocator in builds without tracking.
   The GIL must be held, as for PyObject_Malloc(). */

#ifndef Py_LIMITED_API
#ifndef Py_CPYTHON_MEMTRACK_H
#define Py_CPYTHON_MEMTRACK_H
#ifdef __cplusplus
extern "C" {
#endif

#ifdef Py_TRACK_MEMORY

/* Account nbytes that the caller manages itself (outside Python's
   allocators) under the tag `what`, a NUL-terminated name. */
PyAPI_FUNC(void) Py_TrackMemory(const char *what, size_t nbytes);
PyAPI_FUNC(void) Py_UntrackMemory(const char *what, size_t nbytes);
/* A signed change: the memory draft's size_t could not shrink. */
PyAPI_FUNC(void) Py_AdjustTrackedMemory(const char *what, Py_ssize_t delta);

/* Allocate from the object allocator and count the block under `what`.
   A block must be reallocated and freed under the tag it was allocated
   with. */
PyAPI_FUNC(void *) PyObject_TrackedMalloc(const char *what, size_t nbytes);
PyAPI_FUNC(void *) PyObject_TrackedRealloc(const char *what, void *ptr,
                                           size_t nbytes);
PyAPI_FUNC(void) PyObject_TrackedFree(const char *what, void *ptr);

#  define PyObject_T_MALLOC(what, n) PyObject_TrackedMalloc((what), (n))
#  define PyObject_T_REALLOC(what, p, n) \
       PyObject_TrackedRealloc((what), (p), (n))
#  define PyObject_T_FREE(what, p) PyObject_TrackedFree((what), (p))

#else

#  define PyObject_T_MALLOC(what, n) PyObject_Malloc(n)
#  define PyObject_T_REALLOC(what, p, n) PyObject_Realloc((p), (n))
#  define PyObject_T_FREE(what, p) PyObject_Free(p)

#endif  /* Py_TRACK_MEMORY */

/* Never tracked: for code that must not recurse into the accounting.
   Memory from these is invisible to it, in every build. */
static inline void *
_PyObject_RawMallocUntracked(size_t n)
{
    return malloc(n == 0 ? 1 : n);
}

static inline void *
_PyObject_RawReallocUntracked(void *p, size_t n)
{
    return realloc(p, n == 0 ? 1 : n);
}

#define PyObject_RAW_MALLOC(n) _PyObject_RawMallocUntracked(n)
#define PyObject_RAW_REALLOC(p, n) _PyObject_RawReallocUntracked((p), (n))
#define PyObject_RAW_FREE(p) free(p)

#ifdef __cplusplus
}
#endif
#endif  /* !Py_CPYTHON_MEMTRACK_H */
#endif  /* !Py_LIMITED_API */
