/* Memory accounting by purpose, for ./configure --with-memory-tracking.

   See Include/internal/pycore_memtrack.h for the scheme.  The mem and
   object domains' blocks are counted in _Py_memtrack, with the GIL held;
   tallies claim the buffers objects own, for the owner's type, and the
   objects themselves are attributed when sys asks.  The raw domain and
   the threads' frame stacks are used without the GIL: their counts are
   atomic. */

#include "Python.h"

#ifdef Py_TRACK_MEMORY

#include "pycore_hashtable.h"     // _Py_hashtable_t
#include "pycore_memtrack.h"

#include <stdatomic.h>
#include <string.h>

#define RELAXED memory_order_relaxed

struct _Py_memtrack_locked _Py_memtrack = {
#ifdef Py_DEBUG
    /* A debug build starts with the debug hooks. */
    .hooks_pad = 2 * sizeof(size_t),
#endif
};
/* Blocks of the mem and object domains from outside the pools. */
static Py_ssize_t large_blocks;

static _Atomic Py_ssize_t raw_bytes, raw_blocks;
static _Atomic Py_ssize_t stack_bytes, stack_chunks;
/* The peak is the larger of two: the one seen when the mem and object
   domains grow, kept with the GIL held so that a program growing its heap
   pays no atomic operation per block, and the one seen when the others do,
   from any thread. */
static Py_ssize_t locked_peak;
static _Atomic Py_ssize_t other_peak;

/* Every tally, types' and names'; names are found by a walk. */
static _Py_memtally *tallies;
static _Py_memtally *free_tallies;

/* Every type made ready and not freed since.  The walk reads no type that
   is not here: an unmarked block need not hold an object where the walk
   looks for one (C code may make an object inside a block it holds, then
   reuse the memory), and a "type" found there must not be followed. */
static _Py_hashtable_t *live_types;
/* Types a walk found there lately, by their address: a walk meets the
   same few types again and again. */
#define SEEN_BITS 6
static PyTypeObject *live_types_seen[1 << SEEN_BITS];
/* A bit for the hash of every address made a type here, never cleared: an
   address whose bit is clear is no type's.  Most words the walk reads
   where an object may start are not (the GC header's links, the managed
   dict), and this tells so without a look in live_types. */
#define FILTER_BITS 16
static uint8_t live_types_filter[(1 << FILTER_BITS) / 8];

/* An address scrambled, for the tables here: the high bits mix them all. */
static uint64_t
address_hash(const void *p)
{
    return (uint64_t)((uintptr_t)p >> 4) * 0x9E3779B97F4A7C15u;
}

static size_t
seen_slot(PyTypeObject *type)
{
    return (size_t)(address_hash(type) >> (64 - SEEN_BITS));
}

static size_t
filter_bit(PyTypeObject *type)
{
    return (size_t)(address_hash(type) >> (64 - FILTER_BITS));
}


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
    return (_PyMemTrack_VisitPooled(NULL, NULL) + large_blocks
            + atomic_load_explicit(&raw_blocks, RELAXED)
            + atomic_load_explicit(&stack_chunks, RELAXED));
}

static void
raise_other_peak(void)
{
    Py_ssize_t now = _PyMemTrack_TotalBytes();
    Py_ssize_t peak = atomic_load_explicit(&other_peak, RELAXED);
    while (now > peak
           && !atomic_compare_exchange_weak_explicit(&other_peak, &peak, now,
                                                     RELAXED, RELAXED))
    {
    }
}

/* GIL held: the total is `now`; the peak, which this returns, is at
   least that. */
static Py_ssize_t
raise_peak(Py_ssize_t now)
{
    if (now > locked_peak) {
        locked_peak = now;
    }
    Py_ssize_t other = atomic_load_explicit(&other_peak, RELAXED);
    return other > locked_peak ? other : locked_peak;
}

void
_PyMemTrack_NotePeak(void)
{
    /* Until the locked bytes pass the watermark, the total cannot pass the
       peak (unless the other counts grow: they lower the watermark when
       they do). */
    Py_ssize_t now = _PyMemTrack_TotalBytes();
    Py_ssize_t room = raise_peak(now) - now;
    _Py_atomic_store_relaxed(&_Py_memtrack.peak_watermark,
                             (uintptr_t)(_Py_memtrack.bytes + room));
}

void *
_PyMemTrack_NotePeakFor(void *block)
{
    _PyMemTrack_NotePeak();
    return block;
}

void *
_PyMemTrack_ForgetThenAlloc(void *block, size_t nbytes)
{
    _PyMemTrack_ForgetLastBlock();
    return _PyMemTrack_Alloc(block, nbytes);
}

static void
other_counts_grew(void)
{
    raise_other_peak();
    _Py_atomic_store_relaxed(&_Py_memtrack.peak_watermark, 0);
}

Py_ssize_t
_PyMemTrack_PeakBytes(void)
{
    return raise_peak(_PyMemTrack_TotalBytes());
}

void
_PyMemTrack_ResetPeak(void)
{
    locked_peak = _PyMemTrack_TotalBytes();
    atomic_store_explicit(&other_peak, locked_peak, RELAXED);
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
        type->tp_cache = (PyObject *)t;
    }
    return t;
}

void
_PyMemTrack_AddType(PyTypeObject *type)
{
    if (live_types == NULL) {
        /* Never tracked: the accounting must not account itself. */
        _Py_hashtable_allocator_t untracked = {
            _PyObject_RawMallocUntracked, free};
        live_types = _Py_hashtable_new_full(
            _Py_hashtable_hash_ptr, _Py_hashtable_compare_direct,
            NULL, NULL, &untracked);
        if (live_types == NULL) {
            return;
        }
    }
    /* If this fails, the type's objects count as anonymous memory. */
    if (_Py_hashtable_get(live_types, type) == NULL) {
        (void)_Py_hashtable_set(live_types, type, type);
    }
    size_t bit = filter_bit(type);
    live_types_filter[bit / 8] |= (uint8_t)(1u << (bit % 8));
}

/* Whether a walk may read type: the type of an object it found. */
static int
is_live_type(PyTypeObject *type)
{
    size_t slot = seen_slot(type);
    if (live_types_seen[slot] == type) {
        return type != NULL;
    }
    size_t bit = filter_bit(type);
    if (!((live_types_filter[bit / 8] >> (bit % 8)) & 1)
        || live_types == NULL || _Py_hashtable_get(live_types, type) == NULL)
    {
        return 0;
    }
    live_types_seen[slot] = type;
    return 1;
}

void
_PyMemTrack_ForgetType(PyTypeObject *type)
{
    /* Its instances are gone.  What is left (memory a C extension still
       holds under it) becomes anonymous, and the tally is freed before
       another type can be made at this address. */
    if (live_types != NULL) {
        (void)_Py_hashtable_steal(live_types, type);
    }
    size_t slot = seen_slot(type);
    if (live_types_seen[slot] == type) {
        live_types_seen[slot] = NULL;
    }
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


/* --- blocks outside the pools -------------------------------------------- */

/* The blocks of the mem and object domains that pymalloc does not serve
   (large ones, or all of them with PYTHONMALLOC=malloc), each with what
   malloc() reserved and the object that starts in it, if one does: open
   addressing with linear probing, never more than half full.  An object
   counts only in a block listed here, so one that C code makes elsewhere
   (in static memory, in malloc()'s, inside a larger block) is never read
   once gone; and an owner claims only a block listed here, so a block
   from an allocator that replaced Python's (and counts nothing) is never
   claimed either.  Raw memory: the accounting must not account itself. */
typedef struct {
    void *block;
    PyObject *op;                   /* NULL for none */
    size_t size;
} large_block;

static large_block *large_table;
static size_t large_mask;           /* capacity - 1; 0 before the first */
static size_t large_count;

static size_t
large_slot(void *block)
{
    uint64_t h = address_hash(block);
    return (size_t)(h ^ (h >> 32)) & large_mask;
}

/* The slot of block, or the empty slot where it would go. */
static size_t
large_find(void *block)
{
    size_t i = large_slot(block);
    while (large_table[i].block != NULL
           && large_table[i].block != block)
    {
        i = (i + 1) & large_mask;
    }
    return i;
}

static int
large_grow(void)
{
    size_t capacity = large_mask ? 2 * (large_mask + 1) : 64;
    large_block *new = PyObject_RAW_MALLOC(capacity * sizeof(*new));
    if (new == NULL) {
        return -1;
    }
    memset(new, 0, capacity * sizeof(*new));
    large_block *old = large_table;
    size_t old_capacity = large_mask ? large_mask + 1 : 0;
    large_table = new;
    large_mask = capacity - 1;
    for (size_t i = 0; i < old_capacity; i++) {
        if (old[i].block != NULL) {
            large_table[large_find(old[i].block)] = old[i];
        }
    }
    PyObject_RAW_FREE(old);
    return 0;
}

static void
large_add(void *block, size_t size)
{
    if (2 * (large_count + 1) > large_mask + 1 && large_grow() < 0) {
        return;     /* it and its object stay anonymous */
    }
    size_t i = large_find(block);
    /* Listed already, the block's free was missed. */
    assert(large_table[i].block == NULL);
    if (large_table[i].block == NULL) {
        large_table[i].block = block;
        large_count++;
    }
    large_table[i].op = NULL;
    large_table[i].size = size;
}

/* The entry of block, or NULL if it is not listed. */
static large_block *
large_lookup(void *block)
{
    if (large_count == 0) {
        return NULL;
    }
    large_block *entry = &large_table[large_find(block)];
    return entry->block != NULL ? entry : NULL;
}

static void
large_remove(void *block)
{
    large_block *entry = large_lookup(block);
    if (entry == NULL) {
        return;
    }
    size_t i = (size_t)(entry - large_table);
    large_count--;
    /* Move back the entries whose probe passed the emptied slot. */
    for (size_t j = (i + 1) & large_mask;
         large_table[j].block != NULL;
         j = (j + 1) & large_mask)
    {
        size_t home = large_slot(large_table[j].block);
        if (((j - home) & large_mask) >= ((j - i) & large_mask)) {
            large_table[i] = large_table[j];
            i = j;
        }
    }
    large_table[i] = (large_block){NULL, NULL, 0};
}

void
_PyMemTrack_AllocLarge(void *block, size_t size)
{
    _PyMemTrack_Count(size);
    large_blocks++;
    large_add(block, size);
}

void
_PyMemTrack_FreeLarge(void *block, size_t size)
{
    large_remove(block);
    _PyMemTrack_Free(size);
    large_blocks--;
}

size_t
_PyMemTrack_LargeSize(void *block)
{
    large_block *entry = large_lookup(block);
    return entry != NULL ? entry->size : 0;
}

void
_PyMemTrack_NewLargeObject(void *block, PyObject *op)
{
    large_block *entry = large_lookup(block);
    if (entry != NULL) {
        entry->op = op;
    }
}


/* --- buffers owned by objects of core types ------------------------------ */

/* t (if not NULL) claims the block ptr (if not NULL and counted), or
   gives it back. */
static void
claim(_Py_memtally *t, void *ptr)
{
    size_t size = t != NULL && ptr != NULL ? _PyMemTrack_ClaimedSize(ptr) : 0;
    if (size > 0) {
        _PyMemTrack_Claim(t, (Py_ssize_t)size);
    }
}

static void
unclaim(_Py_memtally *t, void *ptr)
{
    size_t size = t != NULL && ptr != NULL ? _PyMem_ReservedSize(ptr) : 0;
    if (size > 0) {
        _PyMemTrack_Unclaim(t, (Py_ssize_t)size);
    }
}

void
_PyMemTrack_ClaimBlock(PyTypeObject *owner, void *ptr)
{
    claim(type_tally(owner, 1), ptr);
}

void
_PyMemTrack_MoveBlock(PyTypeObject *from, PyTypeObject *to, void *ptr)
{
    unclaim(type_tally(from, 0), ptr);
    claim(type_tally(to, 1), ptr);
}

/* Reallocate a block that t (if not NULL) claims: the claim follows the
   block, or stays with the old one if the allocator fails. */
static void *
realloc_claimed(_Py_memtally *t, void *ptr, size_t size,
                void *(*resize)(void *, size_t))
{
    unclaim(t, ptr);
    void *new = resize(ptr, size);
    claim(t, new != NULL ? new : ptr);
    return new;
}

void *
_PyMem_OwnedRealloc(PyTypeObject *owner, void *ptr, size_t size)
{
    return realloc_claimed(type_tally(owner, 1), ptr, size, PyMem_Realloc);
}

void *
_PyObject_OwnedRealloc(PyTypeObject *owner, void *ptr, size_t size)
{
    return realloc_claimed(type_tally(owner, 1), ptr, size, PyObject_Realloc);
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
        _Py_memtrack.allocated += delta;
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
    claim(ptr != NULL ? named_tally(what) : NULL, ptr);
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
    _PyMemTrack_FreeClaimed(ptr != NULL ? named_tally(what) : NULL, ptr,
                            PyObject_Free);
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

static void
count_object(PyObject *op, size_t size)
{
    _Py_memtally *t = type_tally(Py_TYPE(op), 1);
    if (t != NULL) {
        t->object_bytes += (Py_ssize_t)size;
        t->objects++;
    }
}

/* A block in a pool that is not marked as data: find its object, which
   starts after what its type puts before an object (the GC header, the
   managed dict).  Before the object's start the block holds no type:
   those words are the GC header's link to the previous object (with flag
   bits) and the managed dict's pointers. */
static void
count_pooled(void *block, size_t size, void *Py_UNUSED(arg))
{
    /* The block starts before what the domain handed out by the pad. */
    size_t room = size - _Py_memtrack.hooks_pad;
    const size_t most = sizeof(PyGC_Head) + 2 * sizeof(PyObject *);
    for (size_t pre = 0; pre <= most && pre + sizeof(PyObject) <= room;
         pre += 2 * sizeof(PyObject *))
    {
        PyObject *op = (PyObject *)((char *)block + pre);
        PyTypeObject *type = Py_TYPE(op);
        if (is_live_type(type) && _PyType_PreHeaderSize(type) == pre) {
            count_object(op, size);
            return;
        }
    }
    /* Not an object after all (see live_types): anonymous. */
}

/* Count every object under its type, as it is now; return how many blocks
   the mem and object domains hold. */
static Py_ssize_t
count_objects(void)
{
    for (_Py_memtally *t = tallies; t != NULL; t = t->next) {
        t->object_bytes = 0;
        t->objects = 0;
    }
    Py_ssize_t pooled = _PyMemTrack_VisitPooled(count_pooled, NULL);
    for (size_t i = 0; large_count > 0 && i <= large_mask; i++) {
        large_block *entry = &large_table[i];
        if (entry->op != NULL && is_live_type(Py_TYPE(entry->op))) {
            count_object(entry->op, entry->size);
        }
    }
    return pooled + large_blocks;
}

PyObject *
_PyMemTrack_Usage(int blocks, int by_type)
{
    /* Filling the dict allocates, which changes the tallies: copy them
       first, then report the copy.  The copy holds its types: the dict may
       set off a collection, which may free them. */
    Py_ssize_t locked_blocks = count_objects();
    size_t n = 0;
    for (_Py_memtally *t = tallies; t != NULL; t = t->next) {
        n++;
    }
    struct {
        PyTypeObject *type;
        const char *name;
        Py_ssize_t value;
    } *snap = PyObject_RAW_MALLOC((n ? n : 1) * sizeof(*snap));
    if (snap == NULL) {
        return PyErr_NoMemory();
    }
    Py_ssize_t anonymous = blocks ? locked_blocks : _Py_memtrack.bytes;
    n = 0;
    for (_Py_memtally *t = tallies; t != NULL; t = t->next) {
        Py_ssize_t value = (blocks ? t->blocks + t->objects
                                   : t->bytes + t->object_bytes);
        anonymous -= value;
        if (value != 0 || t->type == NULL) {
            snap[n].type = (PyTypeObject *)Py_XNewRef(t->type);
            snap[n].name = t->name;
            snap[n].value = value;
            n++;
        }
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
        if (report(result, key, snap[i].value) < 0) {
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
    for (size_t i = 0; i < n; i++) {
        Py_XDECREF(snap[i].type);
    }
    PyObject_RAW_FREE(snap);
    return result;
}

#endif  /* Py_TRACK_MEMORY */
