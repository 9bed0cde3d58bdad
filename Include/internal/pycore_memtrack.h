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
   domain).  Whoever knows what a block is for then claims it for that tag:
   _Py_NewReference() claims an object's block for its type, and the core
   types claim the buffers their objects own (list items, ...).  Claims
   leave the total alone, so the tags always add up to it.

   Asking the allocator for a block's size costs a pool lookup, so the
   allocator tells it where it can: the block it handed out last, which is
   usually the one an object is made in next, and the size of the block it
   frees for the object _Py_Dealloc() is deallocating. */

#ifdef Py_TRACK_MEMORY

#include "pycore_atomic.h"        // _Py_atomic_address
#include "pycore_object.h"        // _PyType_PreHeaderSize()

/* A note on layout.  Fields that one function writes are never
   neighbours: GCC would combine two such stores into one 16-byte vector
   store, and on the AMD machines we measure on, a word load cannot take
   its value from a vector store still in flight.  Each such load then
   waits for the store to reach the cache (measured: a fifth of the time
   of an int-heavy loop). */

/* What one type, or one name given to the tracked-malloc API, holds.  A
   type's tally hangs from its tp_cache, which CPython 3.11 leaves unused,
   so that finding it costs one load. */
typedef struct _Py_memtally {
    Py_ssize_t bytes;
    /* The block every object of the type takes, once known to be the same
       for all of them; 0: ask the allocator.  Objects are claimed and given
       back with it alike, so one odd object cannot unbalance the tally. */
    Py_ssize_t object_block;
    Py_ssize_t blocks;
    /* How far before an object its block starts: _PyType_PreHeaderSize(),
       kept here to save working it out. */
    Py_ssize_t object_offset;
    PyTypeObject *type;             /* NULL for a name */
    char *name;                     /* a name's own copy */
    struct _Py_memtally *prev, *next;
} _Py_memtally;

/* What the mem and object domains hold, and what the allocator tells the
   accounting: used with the GIL held only.  The anonymous tag is what no
   tally has claimed of the bytes. */
struct _Py_memtrack_locked {
    Py_ssize_t bytes;
    /* The block handed out last... */
    void *last_block;
    /* Above this, the peak may have to move. */
    _Py_atomic_address peak_watermark;
    Py_ssize_t blocks;
    /* ...the size of the block handed out last... */
    Py_ssize_t last_size;
    /* ...and the tally a block being freed comes back from, set only while
       the allocator frees it. */
    _Py_memtally *free_to;
};
extern struct _Py_memtrack_locked _Py_memtrack;

/* The object being deallocated: its block, NULL once freed, and the tally
   it counts under.  Per thread, since a finalizer can let another thread
   run in the middle of a deallocation. */
extern _Thread_local void *_Py_memtrack_dying_block;
extern _Thread_local _Py_memtally *_Py_memtrack_dying_tally;

extern void _PyMemTrack_NotePeak(void);

static inline void
_PyMemTrack_Claim(_Py_memtally *t, Py_ssize_t size)
{
    t->bytes += size;
    t->blocks++;
}

static inline void
_PyMemTrack_Unclaim(_Py_memtally *t, Py_ssize_t size)
{
    /* A block must be given back by the tally that claimed it. */
    assert(t->bytes >= size && t->blocks > 0);
    if (t->bytes >= size && t->blocks > 0) {
        t->bytes -= size;
        t->blocks--;
    }
}

/* Called by the base allocators (obmalloc.c) for every block of the mem
   and object domains. */
static inline void
_PyMemTrack_Alloc(void *block, size_t size)
{
    _Py_memtrack.bytes += (Py_ssize_t)size;
    _Py_memtrack.blocks++;
    _Py_memtrack.last_block = block;
    _Py_memtrack.last_size = (Py_ssize_t)size;
    if ((size_t)_Py_memtrack.bytes
        > _Py_atomic_load_relaxed(&_Py_memtrack.peak_watermark))
    {
        _PyMemTrack_NotePeak();
    }
}

static inline void
_PyMemTrack_Free(size_t size)
{
    _Py_memtrack.bytes -= (Py_ssize_t)size;
    _Py_memtrack.blocks--;
    _Py_memtally *t = _Py_memtrack.free_to;
    if (t != NULL) {
        _Py_memtrack.free_to = NULL;
        _PyMemTrack_Unclaim(t, (Py_ssize_t)size);
    }
}

/* PyObject_Free() and PyMem_Free() bracket the free: whatever allocator
   (or hook) serves them, the block of the dying object comes back from the
   object's tally, with the size it was claimed with.  After the free,
   nothing is left set for the next one (an allocator from outside never
   calls _PyMemTrack_Free()). */
static inline void
_PyMemTrack_BeforeFree(void *ptr)
{
    if (ptr == _Py_memtrack_dying_block && ptr != NULL) {
        _Py_memtally *t = _Py_memtrack_dying_tally;
        Py_ssize_t size = t->object_block;
        _Py_memtrack_dying_block = NULL;
        if (size == 0) {
            _Py_memtrack.free_to = t;       /* the allocator knows it */
        }
        else {
            _PyMemTrack_Unclaim(t, size);
        }
    }
}

static inline void
_PyMemTrack_AfterFree(void)
{
    _Py_memtrack.free_to = NULL;
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
extern void _PyMemTrack_ForgetKept(_Py_memtally *t, void *block);
/* Before an object's block is resized in place: _Py_NewReference() claims
   it again afterwards. */
extern void _PyMemTrack_ForgetObject(PyObject *op);

static inline void
_PyMemTrack_NewObject(PyObject *op)
{
    _Py_memtally *t = (_Py_memtally *)Py_TYPE(op)->tp_cache;
    if (t != NULL) {
        Py_ssize_t size = t->object_block;
        if (size == 0
            && (char *)op - t->object_offset == _Py_memtrack.last_block)
        {
            size = _Py_memtrack.last_size;
        }
        if (size != 0) {
            _PyMemTrack_Claim(t, size);
            return;
        }
    }
    _PyMemTrack_NewObjectSlow(op);
}

/* If the block of the object being deallocated is still there, the
   deallocator kept it: it becomes anonymous.  The tally is read now, since
   a finalizer may have assigned __class__.  The trashcan calls this too,
   before its destroy chain runs code that could take the block from a free
   list and free it: by the time the deallocator returns, the block may be
   gone, and its size with it. */
static inline void
_PyMemTrack_ForgetDying(void)
{
    void *block = _Py_memtrack_dying_block;
    if (block != NULL) {
        _Py_memtrack_dying_block = NULL;
        _PyMemTrack_ForgetKept(_Py_memtrack_dying_tally, block);
    }
}

/* Run an object's deallocator.  If it frees the object's block, the
   allocator gives the block back from the type's tally; if it keeps it (a
   free list, a finalizer that resurrected the object, the trashcan), the
   block becomes anonymous here.  Without a tally, nothing was claimed. */
static inline void
_PyMemTrack_Dealloc(PyObject *op, destructor dealloc)
{
    _Py_memtally *t = (_Py_memtally *)Py_TYPE(op)->tp_cache;
    if (t == NULL) {
        (*dealloc)(op);
        return;
    }
    void *block = (char *)op - t->object_offset;
    void *outer_block = _Py_memtrack_dying_block;
    _Py_memtally *outer_tally = _Py_memtrack_dying_tally;
    _Py_memtrack_dying_block = block;
    _Py_memtrack_dying_tally = t;
    (*dealloc)(op);
    _PyMemTrack_ForgetDying();
    _Py_memtrack_dying_block = outer_block;
    _Py_memtrack_dying_tally = outer_tally;
}

extern void _PyMemTrack_ChangeClass(PyObject *op, PyTypeObject *from);
extern void _PyMemTrack_ForgetType(PyTypeObject *type);

/* A block of the mem or object domain that an object of `owner` owns.
   These and the _PyMem_Owned functions are exported for the array
   module. */
PyAPI_FUNC(void) _PyMemTrack_ClaimBlock(PyTypeObject *owner, void *ptr);
extern void _PyMemTrack_UnclaimBlock(PyTypeObject *owner, void *ptr);
extern void _PyMemTrack_MoveBlock(PyTypeObject *from, PyTypeObject *to,
                                  void *ptr);

/* Buffers an object owns, from the mem domain, counted under `owner`. */
PyAPI_FUNC(void *) _PyMem_OwnedMalloc(PyTypeObject *owner, size_t size);
PyAPI_FUNC(void *) _PyMem_OwnedCalloc(PyTypeObject *owner, size_t nelem,
                                       size_t elsize);
PyAPI_FUNC(void *) _PyMem_OwnedRealloc(PyTypeObject *owner, void *ptr,
                                        size_t size);
PyAPI_FUNC(void) _PyMem_OwnedFree(PyTypeObject *owner, void *ptr);
/* The same, from the object domain. */
extern void *_PyObject_OwnedMalloc(PyTypeObject *owner, size_t size);
extern void *_PyObject_OwnedRealloc(PyTypeObject *owner, void *ptr,
                                    size_t size);
extern void _PyObject_OwnedFree(PyTypeObject *owner, void *ptr);

/* For sys: totals, peak, and the tags as a dict. */
extern Py_ssize_t _PyMemTrack_TotalBytes(void);
extern Py_ssize_t _PyMemTrack_TotalBlocks(void);
extern Py_ssize_t _PyMemTrack_PeakBytes(void);
extern void _PyMemTrack_ResetPeak(void);
extern PyObject *_PyMemTrack_Usage(int blocks, int by_type);

#else

#  define _PyMemTrack_BeforeFree(ptr) ((void)0)
#  define _PyMemTrack_AfterFree() ((void)0)
#  define _PyMemTrack_ClaimBlock(owner, ptr) ((void)0)
#  define _PyMemTrack_UnclaimBlock(owner, ptr) ((void)0)
#  define _PyMemTrack_MoveBlock(from, to, ptr) ((void)0)
#  define _PyMem_OwnedMalloc(owner, size) PyMem_Malloc(size)
#  define _PyMem_OwnedCalloc(owner, nelem, elsize) PyMem_Calloc(nelem, elsize)
#  define _PyMem_OwnedRealloc(owner, ptr, size) PyMem_Realloc(ptr, size)
#  define _PyMem_OwnedFree(owner, ptr) PyMem_Free(ptr)
#  define _PyObject_OwnedMalloc(owner, size) PyObject_Malloc(size)
#  define _PyObject_OwnedRealloc(owner, ptr, size) PyObject_Realloc(ptr, size)
#  define _PyObject_OwnedFree(owner, ptr) PyObject_Free(ptr)

#endif  /* Py_TRACK_MEMORY */

#ifdef __cplusplus
}
#endif
#endif  /* !Py_INTERNAL_MEMTRACK_H */
