/* Memory accounting by purpose, for ./configure --with-memory-tracking.

   See Include/internal/pycore_memtrack.h for the scheme.  The mem and
   object domains' blocks are counted in _Py_memtrack, with the GIL held;
   tallies claim parts of that for a type or a name, and the anonymous tag
   is the rest.  The raw domain and the threads' frame stacks are used
   without the GIL: their counts are atomic. */

#include "Python.h"

#ifdef Py_TRACK_MEMORY

#include "pycore_memtrack.h"
#include "pycore_object.h"        // _PyType_PreHeaderSize()

#include <stdatomic.h>
#include <string.h>

#define RELAXED memory_order_relaxed

struct _Py_memtrack_locked _Py_memtrack;
_Thread_local void *_Py_memtrack_dying_block;
_Thread_local _Py_memtally *_Py_memtrack_dying_tally;

static _Atomic Py_ssize_t raw_bytes, raw_blocks;
static _Atomic Py_ssize_t stack_bytes, stack_chunks;
static _Atomic Py_ssize_t peak_bytes;

/* Every tally, types' and names'; names are found by a walk. */
static _Py_memtally *tallies;
static _Py_memtally *free_tallies;


/* --- totals and the peak ------------------------------------------------ */

static Py_ssize_t
locked_bytes(void)
{
    /* Written with the GIL held; read here by threads that may lack it. */
    return *(volatile Py_ssize_t *)&_Py_memtrack.bytes;
}

Py_ssize_t
_PyMemTrack_TotalBytes(void)
{
    return (locked_bytes()
            + atomic_load_explicit(&raw_bytes, RELAXED)
            + atomic_load_explicit(&stack_bytes, RELAXED));
}

Py_ssize_t
_PyMemTrack_TotalBlocks(void)
{
    return (*(volatile Py_ssize_t *)&_Py_memtrack.blocks
            + atomic_load_explicit(&raw_blocks, RELAXED)
            + atomic_load_explicit(&stack_chunks, RELAXED));
}

static void
raise_peak(void)
{
    Py_ssize_t now = _PyMemTrack_TotalBytes();
    Py_ssize_t peak = atomic_load_explicit(&peak_bytes, RELAXED);
    while (now > peak
           && !atomic_compare_exchange_weak_explicit(&peak_bytes, &peak, now,
                                                     RELAXED, RELAXED))
    {
    }
}

void
_PyMemTrack_NotePeak(void)
{
    /* GIL held.  Until the locked bytes pass the watermark, the total
       cannot pass the peak (unless the other counts grow: they lower the
       watermark when they do). */
    raise_peak();
    Py_ssize_t room = (atomic_load_explicit(&peak_bytes, RELAXED)
                       - _PyMemTrack_TotalBytes());
    _Py_atomic_store_relaxed(&_Py_memtrack.peak_watermark,
                             (uintptr_t)(_Py_memtrack.bytes + room));
}

static void
other_counts_grew(void)
{
    raise_peak();
    _Py_atomic_store_relaxed(&_Py_memtrack.peak_watermark, 0);
}

Py_ssize_t
_PyMemTrack_PeakBytes(void)
{
    raise_peak();
    return atomic_load_explicit(&peak_bytes, RELAXED);
}

void
_PyMemTrack_ResetPeak(void)
{
    atomic_store_explicit(&peak_bytes, _PyMemTrack_TotalBytes(), RELAXED);
    _Py_atomic_store_relaxed(&_Py_memtrack.peak_watermark, 0);
}


/* --- the raw domain and the frame stacks --------------------------------- */

void
_PyMemTrack_AllocRaw(size_t size)
{
    atomic_fetch_add_explicit(&raw_bytes, (Py_ssize_t)size, RELAXED);
    atomic_fetch_add_explicit(&raw_blocks, 1, RELAXED);
    other_counts_grew();
}

void
_PyMemTrack_FreeRaw(size_t size)
{
    atomic_fetch_sub_explicit(&raw_bytes, (Py_ssize_t)size, RELAXED);
    atomic_fetch_sub_explicit(&raw_blocks, 1, RELAXED);
}

void
_PyMemTrack_FrameStack(Py_ssize_t delta)
{
    atomic_fetch_add_explicit(&stack_bytes, delta, RELAXED);
    atomic_fetch_add_explicit(&stack_chunks, delta > 0 ? 1 : -1, RELAXED);
    if (delta > 0) {
        other_counts_grew();
    }
}


/* --- tallies ------------------------------------------------------------- */

static _Py_memtally *
new_tally(void)
{
    _Py_memtally *t = free_tallies;
    if (t != NULL) {
        free_tallies = t->next;
    }
    else {
        /* Never tracked: the accounting must not account itself. */
        t = PyObject_RAW_MALLOC(sizeof(_Py_memtally));
        if (t == NULL) {
            return NULL;
        }
    }
    memset(t, 0, sizeof(*t));
    t->next = tallies;
    if (tallies != NULL) {
        tallies->prev = t;
    }
    tallies = t;
    return t;
}

static _Py_memtally *
type_tally(PyTypeObject *type, int create)
{
    _Py_memtally *t = (_Py_memtally *)type->tp_cache;
    if (t == NULL && create && (t = new_tally()) != NULL) {
        t->type = type;
        t->object_offset = _PyType_PreHeaderSize(type);
        type->tp_cache = (PyObject *)t;
    }
    return t;
}

void
_PyMemTrack_ForgetType(PyTypeObject *type)
{
    /* Its instances are gone.  What is left (memory a C extension still
       holds under it) becomes anonymous, and the tally is freed before
       another type can be made at this address. */
    _Py_memtally *t = (_Py_memtally *)type->tp_cache;
    if (t == NULL) {
        return;
    }
    type->tp_cache = NULL;
    if (t->prev != NULL) {
        t->prev->next = t->next;
    }
    else {
        tallies = t->next;
    }
    if (t->next != NULL) {
        t->next->prev = t->prev;
    }
    t->next = free_tallies;
    free_tallies = t;
}


/* --- objects ------------------------------------------------------------- */

static inline void *
object_block(PyObject *op, PyTypeObject *type)
{
    return (char *)op - _PyType_PreHeaderSize(type);
}

/* What a tally claims for an object in block: what the allocator reserved,
   which the type may already have told.  (A tuple's length would not do:
   _PyTuple_Resize() may shrink it in place.) */
static Py_ssize_t
claimed_size(_Py_memtally *t, void *block)
{
    if (t->object_block != 0) {
        assert(t->object_block == (Py_ssize_t)_PyMem_ReservedSize(block));
        return t->object_block;
    }
    return _PyMem_ReservedSize(block);
}

void
_PyMemTrack_NewObjectSlow(PyObject *op)
{
    PyTypeObject *type = Py_TYPE(op);
    _Py_memtally *t = type_tally(type, 1);
    if (t == NULL) {
        return;
    }
    /* A static type's tally can be older than PyType_Ready(), which may
       still have added Py_TPFLAGS_HAVE_GC. */
    t->object_offset = _PyType_PreHeaderSize(type);
    Py_ssize_t size = claimed_size(t, (char *)op - t->object_offset);
    _PyMemTrack_Claim(t, size);
    /* Objects of a type without items are all alike, but for str. */
    if (t->object_block == 0
        && type->tp_itemsize == 0
        && !PyType_HasFeature(type, Py_TPFLAGS_UNICODE_SUBCLASS)
        && (size_t)size == _PyMem_ReservedSizeFor(type->tp_basicsize
                                                  + t->object_offset))
    {
        t->object_block = size;
    }
}

void
_PyMemTrack_ForgetKept(_Py_memtally *t, void *block)
{
    if (t != NULL) {
        _PyMemTrack_Unclaim(t, claimed_size(t, block));
    }
}

void
_PyMemTrack_ForgetObject(PyObject *op)
{
    PyTypeObject *type = Py_TYPE(op);
    _PyMemTrack_ForgetKept(type_tally(type, 0), object_block(op, type));
}

void
_PyMemTrack_ChangeClass(PyObject *op, PyTypeObject *from)
{
    /* __class__ assignment keeps the layout, hence the block. */
    PyTypeObject *to = Py_TYPE(op);
    void *block = object_block(op, to);
    _Py_memtally *old = type_tally(from, 0);
    _Py_memtally *new = type_tally(to, 1);
    if (old != NULL && new != NULL) {
        _PyMemTrack_Unclaim(old, claimed_size(old, block));
        _PyMemTrack_Claim(new, claimed_size(new, block));
        if (block == _Py_memtrack_dying_block) {
            _Py_memtrack_dying_tally = new;     /* a finalizer did it */
        }
    }
}


/* What the allocator reserved for a live block: known without asking it
   when the block is the one it handed out last. */
static Py_ssize_t
block_size(void *ptr)
{
    if (ptr == _Py_memtrack.last_block) {
        return _Py_memtrack.last_size;
    }
    return _PyMem_ReservedSize(ptr);
}


/* --- buffers owned by objects of core types ------------------------------ */

void
_PyMemTrack_ClaimBlock(PyTypeObject *owner, void *ptr)
{
    _Py_memtally *t = type_tally(owner, 1);
    if (t != NULL) {
        _PyMemTrack_Claim(t, block_size(ptr));
    }
}

void
_PyMemTrack_UnclaimBlock(PyTypeObject *owner, void *ptr)
{
    _Py_memtally *t = type_tally(owner, 0);
    if (t != NULL) {
        _PyMemTrack_Unclaim(t, _PyMem_ReservedSize(ptr));
    }
}

void
_PyMemTrack_MoveBlock(PyTypeObject *from, PyTypeObject *to, void *ptr)
{
    _PyMemTrack_UnclaimBlock(from, ptr);
    _PyMemTrack_ClaimBlock(to, ptr);
}

/* A new block (if the allocator gave one) becomes owner's. */
static void *
claimed_new(PyTypeObject *owner, void *ptr)
{
    if (ptr != NULL) {
        _PyMemTrack_ClaimBlock(owner, ptr);
    }
    return ptr;
}

/* Reallocate a block that t (if not NULL) claims: the claim follows the
   block, or stays with the old one if the allocator fails. */
static void *
realloc_claimed(_Py_memtally *t, void *ptr, size_t size,
                void *(*resize)(void *, size_t))
{
    if (t != NULL && ptr != NULL) {
        _PyMemTrack_Unclaim(t, _PyMem_ReservedSize(ptr));
    }
    void *new = resize(ptr, size);
    if (t != NULL && (new != NULL || ptr != NULL)) {
        _PyMemTrack_Claim(t, block_size(new != NULL ? new : ptr));
    }
    return new;
}

/* Free a block that t (if not NULL) claims: the allocator gives it back
   from the tally with the size it knows. */
static void
free_claimed(_Py_memtally *t, void *ptr, void (*release)(void *))
{
    _Py_memtrack.free_to = t;
    release(ptr);
}

void *
_PyMem_OwnedMalloc(PyTypeObject *owner, size_t size)
{
    return claimed_new(owner, PyMem_Malloc(size));
}

void *
_PyMem_OwnedCalloc(PyTypeObject *owner, size_t nelem, size_t elsize)
{
    return claimed_new(owner, PyMem_Calloc(nelem, elsize));
}

void *
_PyMem_OwnedRealloc(PyTypeObject *owner, void *ptr, size_t size)
{
    return realloc_claimed(type_tally(owner, 1), ptr, size, PyMem_Realloc);
}

void
_PyMem_OwnedFree(PyTypeObject *owner, void *ptr)
{
    free_claimed(type_tally(owner, 0), ptr, PyMem_Free);
}

void *
_PyObject_OwnedMalloc(PyTypeObject *owner, size_t size)
{
    return claimed_new(owner, PyObject_Malloc(size));
}

void *
_PyObject_OwnedRealloc(PyTypeObject *owner, void *ptr, size_t size)
{
    return realloc_claimed(type_tally(owner, 1), ptr, size, PyObject_Realloc);
}

void
_PyObject_OwnedFree(PyTypeObject *owner, void *ptr)
{
    free_claimed(type_tally(owner, 0), ptr, PyObject_Free);
}


/* --- named tallies, for the public API ----------------------------------- */

/* The tally of a name; NULL for the anonymous tag, or without memory. */
static _Py_memtally *
named_tally(const char *what)
{
    if (what == NULL || what[0] == '\0') {
        return NULL;
    }
    for (_Py_memtally *t = tallies; t != NULL; t = t->next) {
        if (t->type == NULL && strcmp(t->name, what) == 0) {
            return t;
        }
    }
    size_t len = strlen(what) + 1;
    char *copy = PyObject_RAW_MALLOC(len);
    if (copy == NULL) {
        return NULL;
    }
    _Py_memtally *t = new_tally();
    if (t == NULL) {
        PyObject_RAW_FREE(copy);
        return NULL;
    }
    memcpy(copy, what, len);
    t->name = copy;
    return t;
}

void
Py_AdjustTrackedMemory(const char *what, Py_ssize_t delta)
{
    _Py_memtally *t = named_tally(what);
    if (t != NULL) {
        assert(t->bytes + delta >= 0);
        if (t->bytes + delta < 0) {
            delta = -t->bytes;
        }
        t->bytes += delta;
    }
    else if (delta < 0) {
        return;     /* nothing to take anonymous memory from */
    }
    _Py_memtrack.bytes += delta;
    if (delta > 0) {
        _PyMemTrack_NotePeak();
    }
}

void
Py_TrackMemory(const char *what, size_t nbytes)
{
    Py_AdjustTrackedMemory(what, (Py_ssize_t)nbytes);
}

void
Py_UntrackMemory(const char *what, size_t nbytes)
{
    Py_AdjustTrackedMemory(what, -(Py_ssize_t)nbytes);
}

void *
PyObject_TrackedMalloc(const char *what, size_t nbytes)
{
    void *ptr = PyObject_Malloc(nbytes);
    _Py_memtally *t;
    if (ptr != NULL && (t = named_tally(what)) != NULL) {
        _PyMemTrack_Claim(t, block_size(ptr));
    }
    return ptr;
}

void *
PyObject_TrackedRealloc(const char *what, void *ptr, size_t nbytes)
{
    return realloc_claimed(named_tally(what), ptr, nbytes, PyObject_Realloc);
}

void
PyObject_TrackedFree(const char *what, void *ptr)
{
    free_claimed(ptr != NULL ? named_tally(what) : NULL, ptr, PyObject_Free);
}


/* --- reading it back (sys) ----------------------------------------------- */

static int
add_to(PyObject *dict, PyObject *key, Py_ssize_t value)
{
    if (key == NULL) {
        return -1;
    }
    PyObject *old = PyDict_GetItemWithError(dict, key);
    if (old == NULL && PyErr_Occurred()) {
        return -1;
    }
    if (old != NULL) {
        value += PyLong_AsSsize_t(old);
    }
    PyObject *v = PyLong_FromSsize_t(value);
    int res = v == NULL ? -1 : PyDict_SetItem(dict, key, v);
    Py_XDECREF(v);
    return res;
}

/* Add an entry; steals the reference to key. */
static int
report(PyObject *dict, PyObject *key, Py_ssize_t value)
{
    int res = add_to(dict, key, value);
    Py_XDECREF(key);
    return res;
}

PyObject *
_PyMemTrack_Usage(int blocks, int by_type)
{
    /* Building the dict allocates, which changes the tallies: copy them
       first, then report the copy. */
    size_t n = 0;
    for (_Py_memtally *t = tallies; t != NULL; t = t->next) {
        n++;
    }
    _Py_memtally *snap = PyObject_RAW_MALLOC((n ? n : 1) * sizeof(*snap));
    if (snap == NULL) {
        return PyErr_NoMemory();
    }
    Py_ssize_t anonymous = blocks ? _Py_memtrack.blocks : _Py_memtrack.bytes;
    n = 0;
    for (_Py_memtally *t = tallies; t != NULL; t = t->next) {
        snap[n] = *t;
        anonymous -= blocks ? t->blocks : t->bytes;
        n++;
    }
    Py_ssize_t raw = atomic_load_explicit(blocks ? &raw_blocks : &raw_bytes,
                                          RELAXED);
    Py_ssize_t stacks = atomic_load_explicit(
        blocks ? &stack_chunks : &stack_bytes, RELAXED);

    PyObject *result = PyDict_New();
    if (result == NULL) {
        goto done;
    }
    for (size_t i = 0; i < n; i++) {
        Py_ssize_t value = blocks ? snap[i].blocks : snap[i].bytes;
        if (value == 0 && snap[i].type != NULL) {
            continue;
        }
        PyObject *key;
        if (snap[i].type == NULL) {
            key = PyUnicode_InternFromString(snap[i].name);
        }
        else if (by_type) {
            key = Py_NewRef(snap[i].type);
        }
        else {
            /* Interned: repeated snapshots share their keys. */
            key = PyUnicode_InternFromString(_PyType_Name(snap[i].type));
        }
        if (report(result, key, value) < 0) {
            goto error;
        }
    }
    if (report(result, by_type ? Py_NewRef(&PyFrame_Type)
                                : PyUnicode_InternFromString("frame"),
               stacks) < 0
        || report(result, PyUnicode_InternFromString(""), anonymous) < 0
        || report(result, PyUnicode_InternFromString("<raw>"), raw) < 0)
    {
        goto error;
    }
    goto done;

error:
    Py_CLEAR(result);
done:
    PyObject_RAW_FREE(snap);
    return result;
}

#endif  /* Py_TRACK_MEMORY */
