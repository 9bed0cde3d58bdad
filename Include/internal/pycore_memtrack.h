#ifndef Py_INTERNAL_MEMTRACK_H
#define Py_INTERNAL_MEMTRACK_H
#ifdef __cplusplus
extern "C" {
#endif

#ifndef Py_BUILD_CORE
#  error "this header requires Py_BUILD_CORE define"
#endif

/* The accounting behind --with-memory-tracking (Objects/memtrack.c).

   The allocators count every block they hand out, with the size they
   really reserve, under the anonymous tag (or the raw tag, for the raw
   domain).  Whoever knows what a block is for then moves it to that tag:
   _Py_NewReference() moves an object's block to its type, and the core
   types move the buffers their objects own (list items, ...).  Moves
   leave the total alone, so the tags always add up to it. */

#ifdef Py_TRACK_MEMORY

#include "pycore_atomic.h"        // _Py_atomic_address

/* What one type, or one name given to the tracked-malloc API, holds.  A
   type's tally hangs from its tp_cache, which CPython 3.11 leaves unused,
   so that finding it costs one load. */
typedef struct _Py_memtally {
    Py_ssize_t bytes;
    Py_ssize_t blocks;
    /* The block each object of the type takes, once known to be the same
       for all of them; 0: ask the allocator every time. */
    Py_ssize_t object_block;
    PyTypeObject *type;             /* NULL for a name */
    char *name;                     /* a name's own copy */
    struct _Py_memtally *prev, *next;
} _Py_memtally;

/* What the mem and object domains hold: changed with the GIL held only.
   The anonymous tag is what no tally has claimed of it. */
struct _Py_memtrack_locked {
    Py_ssize_t bytes;
    Py_ssize_t blocks;
    /* Above this, the peak may have to move. */
    _Py_atomic_address peak_watermark;
};
extern struct _Py_memtrack_locked _Py_memtrack;

extern void _PyMemTrack_NotePeak(void);

/* Called by the base allocators (obmalloc.c) for every block. */
static inline void
_PyMemTrack_AllocAnonymous(size_t size)
{
    _Py_memtrack.bytes += (Py_ssize_t)size;
    _Py_memtrack.blocks++;
    if ((size_t)_Py_memtrack.bytes
        > _Py_atomic_load_relaxed(&_Py_memtrack.peak_watermark))
    {
        _PyMemTrack_NotePeak();
    }
}

static inline void
_PyMemTrack_FreeAnonymous(size_t size)
{
    _Py_memtrack.bytes -= (Py_ssize_t)size;
    _Py_memtrack.blocks--;
}

extern void _PyMemTrack_AllocRaw(size_t size);
extern void _PyMemTrack_FreeRaw(size_t size);

/* Threads' frame data stacks, from the arena allocator (pystate.c). */
extern void _PyMemTrack_FrameStack(Py_ssize_t delta);

/* What the allocator reserved for a block of the mem or object domain. */
extern size_t _PyMem_ReservedSize(void *ptr);
/* What it would reserve for a request of size bytes, when that is the same
   every time (a pymalloc size class); else 0. */
extern size_t _PyMem_ReservedSizeFor(size_t size);

/* Objects: their block counts under their type while they live. */
extern void _PyMemTrack_NewObjectSlow(PyObject *op);
extern void _PyMemTrack_ForgetObjectSlow(PyObject *op);

static inline void
_PyMemTrack_NewObject(PyObject *op)
{
    _Py_memtally *t = (_Py_memtally *)Py_TYPE(op)->tp_cache;
    if (t != NULL && t->object_block != 0) {
        t->bytes += t->object_block;
        t->blocks++;
    }
    else {
        _PyMemTrack_NewObjectSlow(op);
    }
}

static inline void
_PyMemTrack_ForgetObject(PyObject *op)
{
    _Py_memtally *t = (_Py_memtally *)Py_TYPE(op)->tp_cache;
    if (t != NULL && t->object_block != 0
        && t->bytes >= t->object_block && t->blocks > 0)
    {
        t->bytes -= t->object_block;
        t->blocks--;
    }
    else {
        _PyMemTrack_ForgetObjectSlow(op);
    }
}

extern void _PyMemTrack_ChangeClass(PyObject *op, PyTypeObject *from);
extern void _PyMemTrack_ForgetType(PyTypeObject *type);

/* A block of the mem or object domain that an object of `owner` owns. */
extern void _PyMemTrack_ClaimBlock(PyTypeObject *owner, void *ptr);
extern void _PyMemTrack_UnclaimBlock(PyTypeObject *owner, void *ptr);
extern void _PyMemTrack_MoveBlock(PyTypeObject *from, PyTypeObject *to,
                                  void *ptr);

/* Buffers an object owns, from the mem domain, counted under `owner`. */
extern void *_PyMem_OwnedMalloc(PyTypeObject *owner, size_t size);
extern void *_PyMem_OwnedCalloc(PyTypeObject *owner, size_t nelem,
                                size_t elsize);
extern void *_PyMem_OwnedRealloc(PyTypeObject *owner, void *ptr, size_t size);
extern void _PyMem_OwnedFree(PyTypeObject *owner, void *ptr);

/* For sys: totals, peak, and the tags as a dict. */
extern Py_ssize_t _PyMemTrack_TotalBytes(void);
extern Py_ssize_t _PyMemTrack_TotalBlocks(void);
extern Py_ssize_t _PyMemTrack_PeakBytes(void);
extern void _PyMemTrack_ResetPeak(void);
extern PyObject *_PyMemTrack_Usage(int blocks, int by_type);

#else

#  define _PyMemTrack_ClaimBlock(owner, ptr) ((void)0)
#  define _PyMemTrack_UnclaimBlock(owner, ptr) ((void)0)
#  define _PyMemTrack_MoveBlock(from, to, ptr) ((void)0)
#  define _PyMem_OwnedMalloc(owner, size) PyMem_Malloc(size)
#  define _PyMem_OwnedCalloc(owner, nelem, elsize) PyMem_Calloc(nelem, elsize)
#  define _PyMem_OwnedRealloc(owner, ptr, size) PyMem_Realloc(ptr, size)
#  define _PyMem_OwnedFree(owner, ptr) PyMem_Free(ptr)

#endif  /* Py_TRACK_MEMORY */

#ifdef __cplusplus
}
#endif
#endif  /* !Py_INTERNAL_MEMTRACK_H */
