/* Memory accounting by purpose, for ./configure --with-memory-tracking.

   See Include/internal/pycore_memtrack.h for the scheme.  Counts live in
   tallies: one anonymous, one for the raw domain, one per type that has
   claimed memory, one per name given to the tracked-malloc API.

   Locking: the raw domain is used without the GIL, so its tally is atomic.
   Everything else changes with the GIL held (the mem and object domains
   require it), in plain fields.  The running total of those is kept as a
   relaxed atomic only so that raw allocations can read it for the peak. */

#include "Python.h"

#ifdef Py_TRACK_MEMORY

#include "pycore_memtrack.h"
#include "pycore_object.h"        // _PyType_PreHeaderSize()

#include <stdatomic.h>
#include <string.h>

typedef struct {
    Py_ssize_t bytes;
    Py_ssize_t blocks;
} tally;

static tally anonymous;
static _Atomic Py_ssize_t raw_bytes, raw_blocks;
/* Threads' frame data stacks: arena memory, not from the three domains,
   and freed without the GIL when a thread state is deleted.  Reported
   under frame. */
static _Atomic Py_ssize_t stack_bytes, stack_chunks;
static _Atomic Py_ssize_t locked_bytes, locked_blocks;
static _Atomic Py_ssize_t peak_bytes;

#define RELAXED memory_order_relaxed

static inline void
locked_add(_Atomic Py_ssize_t *counter, Py_ssize_t n)
{
    /* GIL held: no other writer, so no read-modify-write is needed. */
    atomic_store_explicit(counter,
                          atomic_load_explicit(counter, RELAXED) + n,
                          RELAXED);
}

static inline void
note_peak(void)
{
    Py_ssize_t now = _PyMemTrack_TotalBytes();
    Py_ssize_t peak = atomic_load_explicit(&peak_bytes, RELAXED);
    while (now > peak
           && !atomic_compare_exchange_weak_explicit(&peak_bytes, &peak, now,
                                                     RELAXED, RELAXED))
    {
    }
}


/* --- what the base allocators report ------------------------------------ */

void
_PyMemTrack_AllocAnonymous(size_t size)
{
    anonymous.bytes += (Py_ssize_t)size;
    anonymous.blocks++;
    locked_add(&locked_bytes, (Py_ssize_t)size);
    locked_add(&locked_blocks, 1);
    note_peak();
}

void
_PyMemTrack_FreeAnonymous(size_t size)
{
    anonymous.bytes -= (Py_ssize_t)size;
    anonymous.blocks--;
    locked_add(&locked_bytes, -(Py_ssize_t)size);
    locked_add(&locked_blocks, -1);
}

void
_PyMemTrack_AllocRaw(size_t size)
{
    atomic_fetch_add_explicit(&raw_bytes, (Py_ssize_t)size, RELAXED);
    atomic_fetch_add_explicit(&raw_blocks, 1, RELAXED);
    note_peak();
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
        note_peak();
    }
}


/* --- moving blocks between the anonymous tally and a claimed one -------- */

static inline void
claim(tally *to, Py_ssize_t size)
{
    anonymous.bytes -= size;
    anonymous.blocks--;
    to->bytes += size;
    to->blocks++;
}

static inline void
unclaim(tally *from, Py_ssize_t size)
{
    /* A block must be given back by the tally that claimed it. */
    assert(from->bytes >= size && from->blocks > 0);
    if (from->bytes < size || from->blocks <= 0) {
        return;     /* keep every tally and the sum consistent */
    }
    from->bytes -= size;
    from->blocks--;
    anonymous.bytes += size;
    anonymous.blocks++;
}


/* --- tallies of types: an open-addressing table keyed by the type ------- */

typedef struct {
    PyTypeObject *type;     /* NULL: never used; REMOVED: free again */
    tally counts;
} type_entry;

#define REMOVED ((PyTypeObject *)1)

static type_entry *types;
static size_t types_mask;       /* capacity - 1; capacity a power of two */
static size_t types_filled;     /* entries not NULL, REMOVED included */

static inline size_t
type_hash(PyTypeObject *type)
{
    return (size_t)(((uintptr_t)type >> 4) * 2654435761u);
}

static int
grow_types(void)
{
    size_t capacity = types ? 2 * (types_mask + 1) : 512;
    /* Never tracked: the accounting must not account itself. */
    type_entry *table = PyObject_RAW_MALLOC(capacity * sizeof(type_entry));
    if (table == NULL) {
        return -1;
    }
    memset(table, 0, capacity * sizeof(type_entry));
    size_t filled = 0;
    for (size_t i = 0; types != NULL && i <= types_mask; i++) {
        PyTypeObject *type = types[i].type;
        if (type == NULL || type == REMOVED) {
            continue;
        }
        size_t j = type_hash(type) & (capacity - 1);
        while (table[j].type != NULL) {
            j = (j + 1) & (capacity - 1);
        }
        table[j] = types[i];
        filled++;
    }
    PyObject_RAW_FREE(types);
    types = table;
    types_mask = capacity - 1;
    types_filled = filled;
    return 0;
}

/* The entry of `type`, or NULL; *reuse gets a free slot on its probe path. */
static inline type_entry *
find_type(PyTypeObject *type, type_entry **reuse)
{
    if (types == NULL) {
        return NULL;
    }
    size_t i = type_hash(type) & types_mask;
    for (;;) {
        type_entry *e = &types[i];
        if (e->type == type) {
            return e;
        }
        if (e->type == NULL) {
            return NULL;
        }
        if (e->type == REMOVED && reuse != NULL && *reuse == NULL) {
            *reuse = e;
        }
        i = (i + 1) & types_mask;
    }
}

/* The tally of `type`; with create, made if missing (NULL if no memory). */
static tally *
type_tally(PyTypeObject *type, int create)
{
    type_entry *reuse = NULL;
    type_entry *e = find_type(type, create ? &reuse : NULL);
    if (e != NULL) {
        return &e->counts;
    }
    if (!create) {
        return NULL;
    }
    if (reuse != NULL) {
        reuse->type = type;
        reuse->counts = (tally){0, 0};
        return &reuse->counts;
    }
    if ((types_filled + 1) * 2 > (types ? types_mask + 1 : 0)) {
        if (grow_types() < 0) {
            return NULL;
        }
    }
    size_t i = type_hash(type) & types_mask;
    while (types[i].type != NULL && types[i].type != REMOVED) {
        i = (i + 1) & types_mask;
    }
    if (types[i].type == NULL) {
        types_filled++;
    }
    types[i].type = type;
    types[i].counts = (tally){0, 0};
    return &types[i].counts;
}

void
_PyMemTrack_ForgetType(PyTypeObject *type)
{
    /* Its instances are gone; whatever is left (memory a C extension
       still holds under it) goes back to the anonymous tally, and the
       slot is freed before another type can be made at this address. */
    type_entry *e = find_type(type, NULL);
    if (e == NULL) {
        return;
    }
    anonymous.bytes += e->counts.bytes;
    anonymous.blocks += e->counts.blocks;
    e->type = REMOVED;
}


/* --- objects ------------------------------------------------------------ */

static inline void *
object_block(PyObject *op, PyTypeObject *type)
{
    return (char *)op - _PyType_PreHeaderSize(type);
}

void
_PyMemTrack_NewObject(PyObject *op)
{
    PyTypeObject *type = Py_TYPE(op);
    tally *t = type_tally(type, 1);
    if (t != NULL) {
        claim(t, _PyMem_ReservedSize(object_block(op, type)));
    }
}

void
_PyMemTrack_ForgetObject(PyObject *op)
{
    PyTypeObject *type = Py_TYPE(op);
    tally *t = type_tally(type, 0);
    if (t != NULL) {
        unclaim(t, _PyMem_ReservedSize(object_block(op, type)));
    }
}

void
_PyMemTrack_ChangeClass(PyObject *op, PyTypeObject *from)
{
    /* __class__ assignment keeps the layout, hence the block. */
    PyTypeObject *to = Py_TYPE(op);
    Py_ssize_t size = _PyMem_ReservedSize(object_block(op, to));
    tally *old = type_tally(from, 0);
    tally *new = type_tally(to, 1);
    if (old != NULL && new != NULL) {
        unclaim(old, size);
        claim(new, size);
    }
}


/* --- buffers owned by objects of core types ----------------------------- */

void
_PyMemTrack_ClaimBlock(PyTypeObject *owner, void *ptr)
{
    tally *t = type_tally(owner, 1);
    if (t != NULL) {
        claim(t, _PyMem_ReservedSize(ptr));
    }
}

void
_PyMemTrack_UnclaimBlock(PyTypeObject *owner, void *ptr)
{
    tally *t = type_tally(owner, 0);
    if (t != NULL) {
        unclaim(t, _PyMem_ReservedSize(ptr));
    }
}

void
_PyMemTrack_MoveBlock(PyTypeObject *from, PyTypeObject *to, void *ptr)
{
    _PyMemTrack_UnclaimBlock(from, ptr);
    _PyMemTrack_ClaimBlock(to, ptr);
}

void *
_PyMem_OwnedMalloc(PyTypeObject *owner, size_t size)
{
    void *ptr = PyMem_Malloc(size);
    if (ptr != NULL) {
        _PyMemTrack_ClaimBlock(owner, ptr);
    }
    return ptr;
}

void *
_PyMem_OwnedCalloc(PyTypeObject *owner, size_t nelem, size_t elsize)
{
    void *ptr = PyMem_Calloc(nelem, elsize);
    if (ptr != NULL) {
        _PyMemTrack_ClaimBlock(owner, ptr);
    }
    return ptr;
}

void *
_PyMem_OwnedRealloc(PyTypeObject *owner, void *ptr, size_t size)
{
    if (ptr != NULL) {
        _PyMemTrack_UnclaimBlock(owner, ptr);
    }
    void *new = PyMem_Realloc(ptr, size);
    if (new != NULL) {
        _PyMemTrack_ClaimBlock(owner, new);
    }
    else if (ptr != NULL) {
        _PyMemTrack_ClaimBlock(owner, ptr);    /* failed: the old block stays */
    }
    return new;
}

void
_PyMem_OwnedFree(PyTypeObject *owner, void *ptr)
{
    if (ptr != NULL) {
        _PyMemTrack_UnclaimBlock(owner, ptr);
    }
    PyMem_Free(ptr);
}


/* --- named tallies, for the public API ---------------------------------- */

typedef struct {
    char *name;
    tally counts;
} named_entry;

static named_entry *names;
static size_t names_len, names_cap;

static tally *
named_tally(const char *what)
{
    if (what == NULL) {
        what = "";
    }
    for (size_t i = 0; i < names_len; i++) {
        if (strcmp(names[i].name, what) == 0) {
            return &names[i].counts;
        }
    }
    if (what[0] == '\0') {
        return &anonymous;
    }
    if (names_len == names_cap) {
        size_t cap = names_cap ? 2 * names_cap : 16;
        named_entry *grown = PyObject_RAW_REALLOC(names,
                                                  cap * sizeof(named_entry));
        if (grown == NULL) {
            return NULL;
        }
        names = grown;
        names_cap = cap;
    }
    size_t len = strlen(what) + 1;
    char *copy = PyObject_RAW_MALLOC(len);
    if (copy == NULL) {
        return NULL;
    }
    memcpy(copy, what, len);
    names[names_len] = (named_entry){copy, {0, 0}};
    return &names[names_len++].counts;
}

void
Py_AdjustTrackedMemory(const char *what, Py_ssize_t delta)
{
    tally *t = named_tally(what);
    if (t == NULL) {
        return;
    }
    assert(t->bytes + delta >= 0);
    if (t->bytes + delta < 0) {
        delta = -t->bytes;
    }
    t->bytes += delta;
    locked_add(&locked_bytes, delta);
    if (delta > 0) {
        note_peak();
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
    tally *t;
    if (ptr != NULL && (t = named_tally(what)) != NULL && t != &anonymous) {
        claim(t, _PyMem_ReservedSize(ptr));
    }
    return ptr;
}

void *
PyObject_TrackedRealloc(const char *what, void *ptr, size_t nbytes)
{
    tally *t = named_tally(what);
    if (t == &anonymous) {
        t = NULL;
    }
    if (ptr != NULL && t != NULL) {
        unclaim(t, _PyMem_ReservedSize(ptr));
    }
    void *new = PyObject_Realloc(ptr, nbytes);
    if (t != NULL && (new != NULL || ptr != NULL)) {
        claim(t, _PyMem_ReservedSize(new != NULL ? new : ptr));
    }
    return new;
}

void
PyObject_TrackedFree(const char *what, void *ptr)
{
    tally *t;
    if (ptr != NULL && (t = named_tally(what)) != NULL && t != &anonymous) {
        unclaim(t, _PyMem_ReservedSize(ptr));
    }
    PyObject_Free(ptr);
}


/* --- reading it back (sys) ---------------------------------------------- */

Py_ssize_t
_PyMemTrack_TotalBytes(void)
{
    return (atomic_load_explicit(&locked_bytes, RELAXED)
            + atomic_load_explicit(&raw_bytes, RELAXED)
            + atomic_load_explicit(&stack_bytes, RELAXED));
}

Py_ssize_t
_PyMemTrack_TotalBlocks(void)
{
    return (atomic_load_explicit(&locked_blocks, RELAXED)
            + atomic_load_explicit(&raw_blocks, RELAXED)
            + atomic_load_explicit(&stack_chunks, RELAXED));
}

Py_ssize_t
_PyMemTrack_PeakBytes(void)
{
    note_peak();
    return atomic_load_explicit(&peak_bytes, RELAXED);
}

void
_PyMemTrack_ResetPeak(void)
{
    atomic_store_explicit(&peak_bytes, _PyMemTrack_TotalBytes(), RELAXED);
}

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

PyObject *
_PyMemTrack_Usage(int blocks, int by_type)
{
    /* Building the dict allocates, which changes the tallies and may move
       the type table: take a copy first, then report the copy. */
    size_t ntypes = types ? types_mask + 1 : 0;
    type_entry *snap_types = PyObject_RAW_MALLOC(
        (ntypes ? ntypes : 1) * sizeof(type_entry));
    named_entry *snap_names = PyObject_RAW_MALLOC(
        (names_len ? names_len : 1) * sizeof(named_entry));
    if (snap_types == NULL || snap_names == NULL) {
        PyObject_RAW_FREE(snap_types);
        PyObject_RAW_FREE(snap_names);
        return PyErr_NoMemory();
    }
    if (ntypes) {
        memcpy(snap_types, types, ntypes * sizeof(type_entry));
    }
    size_t nnames = names_len;
    if (nnames) {
        memcpy(snap_names, names, nnames * sizeof(named_entry));
    }
    tally anon = anonymous;
    tally raw = {atomic_load_explicit(&raw_bytes, RELAXED),
                 atomic_load_explicit(&raw_blocks, RELAXED)};
    tally stacks = {atomic_load_explicit(&stack_bytes, RELAXED),
                    atomic_load_explicit(&stack_chunks, RELAXED)};

#define VALUE(t) (blocks ? (t).blocks : (t).bytes)
    PyObject *result = PyDict_New();
    if (result == NULL) {
        goto done;
    }
    /* Types first: a type may hold references to names below. */
    for (size_t i = 0; i < ntypes; i++) {
        PyTypeObject *type = snap_types[i].type;
        if (type == NULL || type == REMOVED
            || (snap_types[i].counts.bytes == 0
                && snap_types[i].counts.blocks == 0))
        {
            continue;
        }
        /* Interned: repeated snapshots share their keys. */
        PyObject *key = by_type ? Py_NewRef(type)
                                : PyUnicode_InternFromString(
                                      _PyType_Name(type));
        int res = add_to(result, key, VALUE(snap_types[i].counts));
        Py_XDECREF(key);
        if (res < 0) {
            goto error;
        }
    }
    for (size_t i = 0; i < nnames; i++) {
        PyObject *key = PyUnicode_InternFromString(snap_names[i].name);
        int res = add_to(result, key, VALUE(snap_names[i].counts));
        Py_XDECREF(key);
        if (res < 0) {
            goto error;
        }
    }
    PyObject *key = by_type ? Py_NewRef(&PyFrame_Type)
                            : PyUnicode_InternFromString("frame");
    int res = add_to(result, key, VALUE(stacks));
    Py_XDECREF(key);
    if (res < 0) {
        goto error;
    }
    key = PyUnicode_InternFromString("");
    res = add_to(result, key, VALUE(anon));
    Py_XDECREF(key);
    if (res < 0) {
        goto error;
    }
    key = PyUnicode_InternFromString("<raw>");
    res = add_to(result, key, VALUE(raw));
    Py_XDECREF(key);
    if (res < 0) {
        goto error;
    }
    goto done;
#undef VALUE

error:
    Py_CLEAR(result);
done:
    PyObject_RAW_FREE(snap_types);
    PyObject_RAW_FREE(snap_names);
    return result;
}

#endif  /* Py_TRACK_MEMORY */
