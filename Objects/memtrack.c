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
#include "pycore_pymem.h"         // PYMEM_FORBIDDENBYTE

#ifdef HAVE_MALLOC_USABLE_SIZE
#  include <malloc.h>             // malloc_usable_size()
#else
#  include <stddef.h>             // max_align_t
#endif

#include <stdatomic.h>
#include <string.h>

#define RELAXED memory_order_relaxed

/* What the debug hooks put before the pointer they hand out. */
#define HOOKS_PAD (2 * sizeof(size_t))

struct _Py_memtrack_counts _Py_memtrack = {
#ifdef Py_DEBUG
    /* A debug build starts with the debug hooks. */
    .hooks_pad = HOOKS_PAD,
#endif
};
/* Blocks of the mem and object domains from outside the pools. */
static Py_ssize_t large_blocks;

static _Atomic Py_ssize_t raw_bytes, raw_blocks;
static _Atomic Py_ssize_t stack_bytes, stack_chunks;
/* The peak is the larger of two: the one seen when the mem and object
   domains fall (or the peak is read), kept with the GIL held so that a
   program pays no atomic operation per block, and the one seen when the
   raw domain or the frame stacks fall, which may happen without it. */
static Py_ssize_t locked_peak;
static _Atomic Py_ssize_t other_peak;

/* Every tally, types' and names', for sys to read. */
static _Py_memtally *tallies;
static size_t ntallies;
static uint64_t tally_serials;
static _Py_memtally *free_tallies;

/* The table starts empty, with two slots that are never written. */
static _Py_memtally *no_types[2];
struct _Py_memtrack_type_table _Py_memtrack_types = {
    .slots = no_types, .mask = 1, .shift = 63,
};
_Py_memtally *_Py_memtrack_core_tallies[_PyMemTrack_NCORE];

/* The names' tallies, by name. */
static _Py_hashtable_t *names;

/* --- totals and the peak ------------------------------------------------ */

static Py_ssize_t
locked_bytes(void)
{
    /* Written with the GIL held; read here by threads that may lack it. */
    return *(volatile Py_ssize_t *)&_Py_memtrack.bytes;
}

static Py_ssize_t
other_bytes(void)
{
    return (atomic_load_explicit(&raw_bytes, RELAXED)
            + atomic_load_explicit(&stack_bytes, RELAXED));
}

Py_ssize_t
_PyMemTrack_TotalBytes(void)
{
    return locked_bytes() + other_bytes();
}

static Py_ssize_t count_objects(void);

static Py_ssize_t
total_blocks(void)
{
    Py_ssize_t locked_blocks = count_objects();
    if (locked_blocks < 0) {
        PyErr_NoMemory();
        return -1;
    }
    return (locked_blocks
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

/* The locked bytes' watermark was worked out from the other counts as
   they were. */
static void
other_counts_grew(void)
{
    _Py_atomic_store_relaxed(&_Py_memtrack.peak_watermark, 0);
}

void
_PyMemTrack_NotePeak(void)
{
    /* Until the locked bytes pass the watermark, the total cannot pass the
       peak (unless the other counts grow: they lower the watermark when
       they do). */
    Py_ssize_t others = other_bytes();
    Py_ssize_t now = _Py_memtrack.bytes + others;
    Py_ssize_t room = raise_peak(now) - now;
    _Py_atomic_store_relaxed(&_Py_memtrack.peak_watermark,
                             (uintptr_t)(_Py_memtrack.bytes + room));
    /* Another thread that grew them meanwhile may have lowered the
       watermark before this store: lowered again.  (Had they grown and
       fallen back, the fall raised the peak.) */
    if (other_bytes() != others) {
        other_counts_grew();
    }
}

void *
_PyMemTrack_NoteHandOut(void *block)
{
    _PyMemTrack_NoteChange((uintptr_t)block, 1);
    return block;
}

struct pool_header *
_PyMemTrack_NoteFree(void *block)
{
    _PyMemTrack_NoteChange((uintptr_t)block, 0);
    return _PyMemTrack_PoolOf((uintptr_t)block);
}

struct pool_header *
_PyMemTrack_NoteFreeInPool(void *block)
{
    uintptr_t b = (uintptr_t)block;
    struct pool_header *pool = _PyMemTrack_PoolOf(b);
    _PyMemTrack_BlockChanging(b, 0);
    if (_PyMemTrack_IsData(b)) {
        _PyMemTrack_ClearMark(pool, b);
        /* Unless a claim's, freed as no claim's in a pool that counts no
           mark. */
        if (pool->memtrack_map[0] & _PyMemTrack_POOL_MARKS) {
            _PyMemTrack_CountMark(pool, 0);
        }
    }
    return pool;
}

struct pool_header *
_PyMemTrack_PoolEmptied(struct pool_header *pool)
{
    uint64_t state = pool->memtrack_map[0] & _PyMemTrack_POOL_STATE;
    memset(pool->memtrack_map, 0, sizeof(pool->memtrack_map));
    pool->memtrack_map[0] = state;
    return pool;
}

struct pool_header *
_PyMemTrack_NotePeakAt(void *block)
{
    _PyMemTrack_NotePeak();
    return _PyMemTrack_PoolOf((uintptr_t)block);
}

void *
_PyMemTrack_PooledHandedOutSlow(void *block, struct pool_header *pool,
                                size_t nbytes)
{
    _PyMemTrack_ForgetLastBlock();
    return _PyMemTrack_PooledHandedOut(block, pool, nbytes);
}

void
_PyMemTrack_CollectionStarting(void)
{
    uintptr_t last = _Py_memtrack.last_block;
    if (last != 0) {
        /* An object named in its block's place lies inside the block. */
        size_t size;
        _Py_memtrack.last_block = _PyObject_PooledBlock(last, &size);
        assert(_Py_memtrack.last_block != 0);
    }
}

static Py_ssize_t
peak_bytes(void)
{
    return raise_peak(_PyMemTrack_TotalBytes());
}

static void
reset_peak(void)
{
    locked_peak = _PyMemTrack_TotalBytes();
    atomic_store_explicit(&other_peak, locked_peak, RELAXED);
    _Py_atomic_store_relaxed(&_Py_memtrack.peak_watermark, 0);
}


/* --- the raw domain and the frame stacks --------------------------------- */

static void
raw_handed_out(size_t size)
{
    atomic_fetch_add_explicit(&raw_bytes, (Py_ssize_t)size, RELAXED);
    atomic_fetch_add_explicit(&raw_blocks, 1, RELAXED);
    other_counts_grew();
}

static void
raw_freed(size_t size)
{
    raise_other_peak();
    atomic_fetch_sub_explicit(&raw_bytes, (Py_ssize_t)size, RELAXED);
    atomic_fetch_sub_explicit(&raw_blocks, 1, RELAXED);
}

void
_PyMemTrack_FrameStack(Py_ssize_t delta)
{
    if (delta < 0) {
        raise_other_peak();
    }
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
    t->serial = ++tally_serials;
    ntallies++;
    t->next = tallies;
    if (tallies != NULL) {
        tallies->prev = t;
    }
    tallies = t;
    return t;
}

static void
free_tally(_Py_memtally *t)
{
    /* A class found last is forgotten with its tally. */
    if (_Py_memtrack_types.last_tally == t) {
        _Py_memtrack_types.last_type = NULL;
        _Py_memtrack_types.last_tally = NULL;
    }
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
    ntallies--;
}

/* Both tables here probe linearly, and delete by moving back the entries
   after the emptied slot i whose probe passed it: the entry at slot j,
   first tried at slot home, must move back to i. */
static inline int
probe_passes(size_t home, size_t i, size_t j, size_t mask)
{
    return ((j - home) & mask) >= ((j - i) & mask);
}

/* The empty slot where a type not in the table goes. */
static size_t
type_slot_for_insert(PyTypeObject *type)
{
    size_t i = _PyMemTrack_TypeSlot(type);
    while (_Py_memtrack_types.slots[i] != NULL) {
        assert(_Py_memtrack_types.slots[i]->type != type);
        i = (i + 1) & _Py_memtrack_types.mask;
    }
    return i;
}

static int
grow_types(void)
{
    struct _Py_memtrack_type_table old = _Py_memtrack_types;
    size_t capacity = old.slots == no_types ? 256 : 2 * (old.mask + 1);
    _Py_memtally **slots = PyObject_RAW_MALLOC(capacity * sizeof(*slots));
    if (slots == NULL) {
        return -1;
    }
    memset(slots, 0, capacity * sizeof(*slots));
    int shift = 64;
    for (size_t c = capacity; c > 1; c >>= 1) {
        shift--;
    }
    _Py_memtrack_types.slots = slots;
    _Py_memtrack_types.mask = capacity - 1;
    _Py_memtrack_types.shift = shift;
    for (size_t i = 0; i <= old.mask; i++) {
        if (old.slots[i] != NULL) {
            slots[type_slot_for_insert(old.slots[i]->type)] = old.slots[i];
        }
    }
    if (old.slots != no_types) {
        PyObject_RAW_FREE(old.slots);
    }
    return 0;
}

/* The table has just gained a tally: if it is a core owner's, its entry
   too.  (The table never loses theirs: they are static types, and only
   heap types are forgotten.) */
static void
set_core_tally(PyTypeObject *type, _Py_memtally *t)
{
#define SET_IF_CORE(T) \
    if (type == &T) { \
        _Py_memtrack_core_tallies[_PyMemTrack_CORE_##T] = t; \
    }
    _PyMemTrack_CORE_OWNERS(SET_IF_CORE)
#undef SET_IF_CORE
}

/* The tally of a type, made if it has none; NULL without memory (the
   type's memory then counts as anonymous). */
static _Py_memtally *
type_tally(PyTypeObject *type)
{
    _Py_memtally *t = _PyMemTrack_TallyOf(type);
    if (t != NULL) {
        return t;
    }
    if (2 * (_Py_memtrack_types.count + 1) > _Py_memtrack_types.mask + 1
        && grow_types() < 0)
    {
        return NULL;
    }
    t = new_tally();
    if (t == NULL) {
        return NULL;
    }
    t->type = type;
    _Py_memtrack_types.slots[type_slot_for_insert(type)] = t;
    _Py_memtrack_types.count++;
    set_core_tally(type, t);
    return t;
}

void
_PyMemTrack_AddType(PyTypeObject *type)
{
    _Py_memtally *t = type_tally(type);
    if (t != NULL && type->tp_base != NULL) {
        t->owned_bytes = _PyMemTrack_OwnedBytesOf(type->tp_base);
    }
}

void
_PyMemTrack_SetOwnedBytes(PyTypeObject *type, _PyMemTrack_OwnedBytesFunc func)
{
    _Py_memtally *t = type_tally(type);
    if (t != NULL) {
        t->owned_bytes = func;
    }
}

void
_PyMemTrack_ForgetType(PyTypeObject *type)
{
    /* Its instances are gone.  What is left (memory a C extension still
       holds under it) becomes anonymous, and the tally goes before another
       type can be made at this address. */
    size_t i = _PyMemTrack_TypeSlot(type);
    size_t mask = _Py_memtrack_types.mask;
    _Py_memtally **slots = _Py_memtrack_types.slots;
    while (slots[i] != NULL && slots[i]->type != type) {
        i = (i + 1) & mask;
    }
    if (slots[i] == NULL) {
        return;
    }
    free_tally(slots[i]);
    _Py_memtrack_types.count--;
    for (size_t j = (i + 1) & mask; slots[j] != NULL; j = (j + 1) & mask) {
        if (probe_passes(_PyMemTrack_TypeSlot(slots[j]->type), i, j, mask)) {
            slots[i] = slots[j];
            i = j;
        }
    }
    slots[i] = NULL;
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
    uint64_t h = _PyMemTrack_AddressHash(block);
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
    for (size_t j = (i + 1) & large_mask;
         large_table[j].block != NULL;
         j = (j + 1) & large_mask)
    {
        if (probe_passes(large_slot(large_table[j].block), i, j, large_mask)) {
            large_table[i] = large_table[j];
            i = j;
        }
    }
    large_table[i] = (large_block){NULL, NULL, 0};
}

static void
large_handed_out(void *block, size_t size)
{
    _PyMemTrack_Count(size);
    large_blocks++;
    large_add(block, size);
}

static void
large_freed(void *block, size_t size)
{
    large_remove(block);
    _PyMemTrack_Uncount(size);
    large_blocks--;
}

/* What malloc() reserved for a block of the mem or object domain from
   outside the pools; 0 for one not counted. */
static size_t
large_size(void *block)
{
    large_block *entry = large_lookup(block);
    return entry != NULL ? entry->size : 0;
}

/* --- the base allocator -------------------------------------------------- */

char _PyMemTrack_raw_ctx;

/* Set while pymalloc passes a large request to the raw domain, until the
   base allocator takes it (base_call_serves()). */
static _Thread_local int pymalloc_fallback;

void *
_PyMemTrack_FallbackMalloc(size_t size)
{
    pymalloc_fallback = 1;
    void *ptr = PyMem_RawMalloc(size);
    pymalloc_fallback = 0;
    return ptr;
}

void *
_PyMemTrack_FallbackCalloc(size_t nelem, size_t elsize)
{
    pymalloc_fallback = 1;
    void *ptr = PyMem_RawCalloc(nelem, elsize);
    pymalloc_fallback = 0;
    return ptr;
}

void *
_PyMemTrack_FallbackRealloc(void *ptr, size_t size)
{
    pymalloc_fallback = 1;
    void *new = PyMem_RawRealloc(ptr, size);
    pymalloc_fallback = 0;
    return new;
}

void
_PyMemTrack_FallbackFree(void *ptr)
{
    pymalloc_fallback = 1;
    PyMem_RawFree(ptr);
    pymalloc_fallback = 0;
}

/* Whether debug hooks wrap the raw domain (the object domain's are in
   _Py_memtrack.hooks_pad).  A debug build starts with them. */
#ifdef Py_DEBUG
static int raw_debug_hooks = 1;
#else
static int raw_debug_hooks = 0;
#endif

void
_PyMemTrack_DebugHooks(PyMemAllocatorDomain domain, int hooks)
{
    if (domain == PYMEM_DOMAIN_OBJ) {
        _Py_memtrack.hooks_pad = hooks ? HOOKS_PAD : 0;
    }
    else if (domain == PYMEM_DOMAIN_RAW) {
        raw_debug_hooks = hooks;
    }
}

/* The last wrapper set on each domain, and whether what it wraps has
   debug hooks.  A wrapper may be set again over an allocator set since,
   without being set up anew: _PyMem_SetDefaultAllocator() puts the
   default allocator in place for a while, then the one it replaced back,
   tracemalloc's while it traces.  What it wraps then is what it wrapped
   when it was first set. */
static struct {
    void *(*malloc)(void *ctx, size_t size);
    int hooks;
} wrappers[3];

void
_PyMemTrack_WrapperSet(PyMemAllocatorDomain domain,
                       void *(*malloc)(void *ctx, size_t size))
{
    if (domain != PYMEM_DOMAIN_OBJ && domain != PYMEM_DOMAIN_RAW) {
        return;
    }
    if (wrappers[domain].malloc == malloc) {
        _PyMemTrack_DebugHooks(domain, wrappers[domain].hooks);
    }
    else {
        wrappers[domain].malloc = malloc;
        wrappers[domain].hooks = (domain == PYMEM_DOMAIN_OBJ
                                  ? _Py_memtrack.hooks_pad != 0
                                  : raw_debug_hooks);
    }
}

#ifdef HAVE_MALLOC_USABLE_SIZE
/* malloc() tells what it reserved for a block. */
#  define SIZE_PREFIX 0
#else
/* Each block starts with what it takes in all, prefix included, in a
   prefix that keeps malloc()'s alignment. */
#  define SIZE_PREFIX _Alignof(max_align_t)
static_assert(SIZE_PREFIX >= sizeof(size_t), "the prefix holds a size");
#endif

/* What a block of the base allocator takes. */
static size_t
base_size(void *base)
{
#ifdef HAVE_MALLOC_USABLE_SIZE
    return malloc_usable_size(base);
#else
    size_t size;
    memcpy(&size, base, sizeof(size));
    return size;
#endif
}

/* Whose block a call of the base allocator serves: the raw domain's own
   (RAW_OWN), pymalloc's large request passed through the raw domain
   (FALLBACK), or one of the mem or object domain under
   PYTHONMALLOC=malloc.  Only the first call under the flag serves
   pymalloc's request: a wrapper of the raw domain, such as tracemalloc's,
   calls down first, and what it allocates or frees for itself after is
   the raw domain's. */
enum { RAW_OWN, FALLBACK, DOMAIN };

static int
base_call_serves(void *ctx)
{
    if (ctx != _PyMemTrack_RAW_CTX) {
        return DOMAIN;
    }
    int fallback = pymalloc_fallback;
    pymalloc_fallback = 0;
    return fallback ? FALLBACK : RAW_OWN;
}

/* A block of the object (or mem) domain as the domain handed it out,
   from the pointer the base allocator hands out.  pymalloc passes its
   large requests to the raw domain, whose own debug hooks add a header
   first. */
static void *
domain_block(int whose, void *ptr)
{
    if (whose == FALLBACK && raw_debug_hooks) {
        ptr = (char *)ptr + HOOKS_PAD;
    }
    return (char *)ptr + _Py_memtrack.hooks_pad;
}

/* Count a block malloc() gave, of size bytes with the prefix; the pointer
   to hand out. */
static void *
base_handed_out(int whose, void *base, size_t size)
{
#ifndef HAVE_MALLOC_USABLE_SIZE
    memcpy(base, &size, sizeof(size));
#endif
    void *ptr = (char *)base + SIZE_PREFIX;
    if (whose == RAW_OWN) {
        raw_handed_out(base_size(base));
    }
    else {
        large_handed_out(domain_block(whose, ptr), base_size(base));
    }
    return ptr;
}

/* Count out a block malloc() gave, at base; the bytes it took. */
static size_t
base_freed(int whose, void *base)
{
    size_t size = base_size(base);
    if (whose == RAW_OWN) {
        raw_freed(size);
    }
    else {
        large_freed(domain_block(whose, (char *)base + SIZE_PREFIX), size);
    }
    return size;
}

static void *
base_malloc(int whose, size_t size)
{
#ifndef HAVE_MALLOC_USABLE_SIZE
    if (size > SIZE_MAX - SIZE_PREFIX) {
        return NULL;
    }
#endif
    void *base = malloc(SIZE_PREFIX + size);
    if (base == NULL) {
        return NULL;
    }
    return base_handed_out(whose, base, SIZE_PREFIX + size);
}

void *
_PyMemTrack_BaseMalloc(void *ctx, size_t size)
{
    return base_malloc(base_call_serves(ctx), size);
}

void *
_PyMemTrack_BaseCalloc(void *ctx, size_t nelem, size_t elsize)
{
    int whose = base_call_serves(ctx);
#ifndef HAVE_MALLOC_USABLE_SIZE
    if (elsize != 0 && nelem > (SIZE_MAX - SIZE_PREFIX) / elsize) {
        return NULL;
    }
    size_t size = SIZE_PREFIX + nelem * elsize;
    void *base = calloc(1, size);
#else
    size_t size = 0;
    void *base = calloc(nelem, elsize);
#endif
    return base != NULL ? base_handed_out(whose, base, size) : NULL;
}

void *
_PyMemTrack_BaseRealloc(void *ctx, void *ptr, size_t size)
{
    int whose = base_call_serves(ctx);
#ifndef HAVE_MALLOC_USABLE_SIZE
    if (size > SIZE_MAX - SIZE_PREFIX) {
        return NULL;
    }
#endif
    if (ptr == NULL) {
        return base_malloc(whose, size);
    }
    /* realloc() may free the block: count it out first, and back in if it
       fails. */
    void *base = (char *)ptr - SIZE_PREFIX;
    size_t old_size = base_freed(whose, base);
    void *new = realloc(base, SIZE_PREFIX + size);
    if (new == NULL) {
        base_handed_out(whose, base, old_size);
        return NULL;
    }
    return base_handed_out(whose, new, SIZE_PREFIX + size);
}

void
_PyMemTrack_BaseFree(void *ctx, void *ptr)
{
    int whose = base_call_serves(ctx);
    if (ptr != NULL) {
        void *base = (char *)ptr - SIZE_PREFIX;
        (void)base_freed(whose, base);
        free(base);
    }
}


void
_PyMemTrack_NewLargeObject(void *block, PyObject *op)
{
    large_block *entry = large_lookup(block);
    if (entry != NULL) {
        entry->op = op;
    }
}


/* --- blocks and objects -------------------------------------------------- */

/* An allocated pooled block holds data that a claim owns: marked as the
   claim's, which its free or reallocation takes off (an anonymous mark it
   had becomes the claim's). */
static void
mark_claimed(uintptr_t block)
{
    struct pool_header *pool = _PyMemTrack_PoolOf(block);
    _PyMemTrack_BlockChanging(block, 0);
    if (_PyMemTrack_IsData(block)) {
        _PyMemTrack_CountMark(pool, 0);
    }
    else {
        _PyMemTrack_SetMark(pool, block);
    }
    if (block == _Py_memtrack.last_block) {
        _Py_memtrack.last_block = 0;
    }
}

/* The pooled block that a block of the mem or object domain starts
   (after the debug hooks' pad); 0 for one outside the pools. */
static uintptr_t
pooled_block_of(void *ptr)
{
    uintptr_t block = (uintptr_t)ptr - _Py_memtrack.hooks_pad;
    size_t size;
    if (block == _Py_memtrack.last_block
        || _PyObject_PooledBlock(block, &size) == block)
    {
        return block;
    }
    return 0;
}

uintptr_t
_PyMemTrack_ClaimEnding(void *ptr)
{
    uintptr_t block = ptr != NULL ? pooled_block_of(ptr) : 0;
    if (block == 0) {
        return 0;
    }
    _PyMemTrack_BlockChanging(block, 0);
    _PyMemTrack_ClearMark(_PyMemTrack_PoolOf(block), block);
    return block;
}

/* What the allocator reserved for a block of the mem or object domain:
   its pymalloc size class, or what malloc() really gave; 0 for a block
   the accounting does not count (one from an allocator that replaced
   Python's).  If claimed, the block holds data: a pooled one is marked. */
static size_t
reserved_size(void *ptr, int claimed)
{
    assert(ptr != NULL);
    uintptr_t block = (uintptr_t)ptr - _Py_memtrack.hooks_pad;
    size_t size;
    if (block == _Py_memtrack.last_block) {
        /* Just handed out (a reallocated buffer, say): surely pooled. */
        size = _PyMemTrack_PooledSize(block);
    }
    else if (_PyObject_PooledBlock(block, &size) != block) {
        /* Not read from the block: it may come from anywhere. */
        return large_size(ptr);
    }
    /* The hooks overwrite the pad bytes before the block when they free
       it.  The size of a freed block is whatever the allocator made of it
       since: asking for it is a bug of the accounting. */
    for (size_t i = 1; _Py_memtrack.hooks_pad && i < sizeof(size_t); i++) {
        if (((uint8_t *)ptr)[-(Py_ssize_t)i] != PYMEM_FORBIDDENBYTE) {
            Py_FatalError("memory tracking: the size of a freed block");
        }
    }
    if (claimed) {
        mark_claimed(block);
    }
    return size;
}

size_t
_PyMem_ReservedSize(const void *ptr)
{
    return ptr != NULL ? reserved_size((void *)ptr, 0) : 0;
}

size_t
_PyMemTrack_ClaimedSize(void *ptr)
{
    return reserved_size(ptr, 1);
}

void
_PyMemTrack_NewObjectSlow(PyObject *op)
{
    /* Made after other blocks were handed out (in a collection that its
       allocation started, say), in a block that was already an object's
       (resized in place), under debug hooks, or elsewhere. */
    uintptr_t pooled = _PyMemTrack_ObjectBlock(op);
    size_t size;
    uintptr_t start = _PyObject_PooledBlock(pooled, &size);
    if (start == 0) {
        /* Large blocks go by what the domain handed out. */
        _PyMemTrack_NewLargeObject(
            (void *)(pooled + _Py_memtrack.hooks_pad), op);
    }
    else if (start == pooled) {
        _PyMemTrack_Unmark(pooled);
    }
    /* Any other lies inside a block that something else holds, and counts
       as part of it. */
}

void
_PyMemTrack_AssigningClass(PyObject *op)
{
    uintptr_t pooled = _PyMemTrack_ObjectBlock(op);
    size_t size;
    if (_PyObject_PooledBlock(pooled, &size) == pooled) {
        _PyMemTrack_BlockChanging(pooled, 0);
    }
}


/* --- buffers owned by objects of core types ------------------------------ */

/* t (if not NULL) claims the block ptr (if not NULL and counted). */
static void
claim(_Py_memtally *t, void *ptr)
{
    size_t size = t != NULL && ptr != NULL ? _PyMemTrack_ClaimedSize(ptr) : 0;
    if (size > 0) {
        _PyMemTrack_Claim(t, (Py_ssize_t)size);
    }
}

void
_PyMemTrack_ClaimBlock(PyTypeObject *owner, void *ptr)
{
    claim(type_tally(owner), ptr);
}

void
_PyMemTrack_MoveBlock(PyTypeObject *from, PyTypeObject *to, void *ptr)
{
    _Py_memtally *t = _PyMemTrack_TallyOf(from);
    if (t == NULL) {
        /* Never claimed, nor marked as data. */
        claim(type_tally(to), ptr);
        return;
    }
    /* Claimed, so marked: only its size moves, looked up once. */
    size_t size = _PyMem_ReservedSize(ptr);
    _Py_memtally *to_tally = type_tally(to);
    if (size > 0 && to_tally != t) {
        _PyMemTrack_Unclaim(t, (Py_ssize_t)size);
        if (to_tally != NULL) {
            _PyMemTrack_Claim(to_tally, (Py_ssize_t)size);
        }
    }
}

/* Reallocate a block that t (if not NULL) claims: the claim follows the
   block, or stays with the old one if the allocator fails.  What the
   allocator reserved changed by as much as the count did, as a claimed
   block's free by its domain finds (obmalloc.c): neither block is looked
   up to size it.  The claim's mark, which the domain's free would leave
   on a free block, is taken off while the domain may move the data, and
   put on the block that holds it after. */
static void *
realloc_claimed(_Py_memtally *t, void *ptr, size_t size,
                void *(*resize)(void *, size_t))
{
    uintptr_t old = t != NULL ? _PyMemTrack_ClaimEnding(ptr) : 0;
    Py_ssize_t before = _Py_memtrack.bytes;
    void *new = resize(ptr, size);
    if (t == NULL) {
        return new;
    }
    if (new == NULL) {
        if (old != 0) {
            mark_claimed(old);
        }
        return NULL;
    }
    Py_ssize_t change = _Py_memtrack.bytes - before;
    if (ptr == NULL) {
        if (change > 0) {
            _PyMemTrack_Claim(t, change);
        }
    }
    else {
        assert(t->bytes + change >= 0 && t->blocks > 0);
        if (t->bytes + change >= 0) {
            t->bytes += change;
        }
    }
    uintptr_t block = new == ptr ? old : pooled_block_of(new);
    if (block != 0) {
        mark_claimed(block);
    }
    return new;
}

void *
_PyMem_OwnedRealloc(PyTypeObject *owner, void *ptr, size_t size)
{
    return realloc_claimed(type_tally(owner), ptr, size, PyMem_Realloc);
}

void *
_PyObject_OwnedRealloc(PyTypeObject *owner, void *ptr, size_t size)
{
    return realloc_claimed(type_tally(owner), ptr, size, PyObject_Realloc);
}


/* --- named tallies, for the public API ----------------------------------- */

static Py_uhash_t
hash_name(const void *name)
{
    /* FNV-1a */
    Py_uhash_t h = (Py_uhash_t)14695981039346656037u;
    for (const unsigned char *c = name; *c != '\0'; c++) {
        h = (h ^ *c) * (Py_uhash_t)1099511628211u;
    }
    return h;
}

static int
same_name(const void *a, const void *b)
{
    return strcmp(a, b) == 0;
}

/* The tally of a name; NULL for the anonymous tag, or without memory. */
static _Py_memtally *
named_tally(const char *what)
{
    if (what == NULL || what[0] == '\0') {
        return NULL;
    }
    if (names == NULL) {
        /* Never tracked: the accounting must not account itself. */
        _Py_hashtable_allocator_t untracked = {
            _PyObject_RawMallocUntracked, free};
        names = _Py_hashtable_new_full(hash_name, same_name, NULL, NULL,
                                       &untracked);
        if (names == NULL) {
            return NULL;
        }
    }
    _Py_memtally *t = _Py_hashtable_get(names, what);
    if (t != NULL) {
        return t;
    }
    size_t len = strlen(what) + 1;
    char *copy = PyObject_RAW_MALLOC(len);
    if (copy == NULL) {
        return NULL;
    }
    memcpy(copy, what, len);
    t = new_tally();
    if (t == NULL || _Py_hashtable_set(names, copy, t) < 0) {
        if (t != NULL) {
            free_tally(t);
        }
        PyObject_RAW_FREE(copy);
        return NULL;
    }
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
    if (delta > 0) {
        _PyMemTrack_Count((size_t)delta);
    }
    else {
        _PyMemTrack_Uncount((size_t)-delta);
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
    _PyMemTrack_ClaimedFree(PYMEM_DOMAIN_OBJ,
                            ptr != NULL ? named_tally(what) : NULL, ptr);
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

/* The object in a block in a pool that is neither marked as data nor
   freed, with its type's tally; NULL if there is none after all (see
   _Py_memtrack_types).  The object starts after what its type puts before
   an object (the GC header, the managed dict), and before that the block
   holds no type: those words are the GC header's link to the previous
   object (with flag bits) and the managed dict's pointers. */
static PyObject *
pooled_object(uintptr_t block, size_t size, _Py_memtally **tally)
{
    /* The block starts before what the domain handed out by the pad. */
    block += _Py_memtrack.hooks_pad;
    size_t room = size - _Py_memtrack.hooks_pad;
    const size_t most = sizeof(PyGC_Head) + 2 * sizeof(PyObject *);
    for (size_t pre = 0; pre <= most && pre + sizeof(PyObject) <= room;
         pre += 2 * sizeof(PyObject *))
    {
        PyObject *op = (PyObject *)(block + pre);
        _Py_memtally *t = _PyMemTrack_TableTally(Py_TYPE(op));
        if (t != NULL && _PyType_PreHeaderSize(Py_TYPE(op)) == pre) {
            *tally = t;
            return op;
        }
    }
    return NULL;
}

/* Whether an allocated pooled block may hold an object: it is neither
   marked as data nor stamped as freed. */
static inline int
may_hold_object(uintptr_t block)
{
    return (!_PyMemTrack_IsData(block)
            && ((uintptr_t *)block)[1] != _PyMemTrack_FREED);
}

/* The object in an allocated pooled block, with its type's tally; NULL
   for none. */
static PyObject *
object_in_block(uintptr_t block, size_t size, _Py_memtally **tally)
{
    if (!may_hold_object(block)) {
        return NULL;
    }
    return pooled_object(block, size, tally);
}

/* The changes a pool's memo notes, at most.  A noted block costs a
   reading one load from memory, a pool looked into whole about 250: with
   5, a reading after 40,000 tuples of a 1M heap were replaced at random
   took 13-15 ms, with 16 6.2-6.9 ms (with 32, 4.7-5.6 ms).  The
   replacements took about 5% longer, as more changes are noted by a
   call, and the memos grew from 0.5% to 0.8% of that heap (see
   bench/README.md). */
#define NOTED_MAX 16
/* An old entry of a block that held no object. */
#define NO_ENTRY UINT8_MAX

/* What the walk found in a pool when it last looked: its blocks, and how
   many objects of each type, in the order it met them (a pool holds few
   types, often one); and the blocks that changed since, while few, each
   with the entry of the object it held then. */
typedef struct {
    Py_ssize_t blocks;
    size_t size;
    uint32_t length;
    uint32_t capacity;
    uint8_t noted;
    uint8_t old_entries[NOTED_MAX];
    uint16_t noted_granules[NOTED_MAX];
    struct {
        PyTypeObject *type;
        uint64_t serial;
        Py_ssize_t count;
    } entries[];
} pool_memo;

/* By pool number; raw memory, as the other tables here. */
static pool_memo **memos;
static size_t memos_length;
/* The sum of the memos' blocks. */
static Py_ssize_t pooled_blocks;

/* The list of changed pools (pycore_memtrack.h).  Its room covers every
   pool whose state is clear: a walk makes room for all the numbers there
   are before it clears any state (and empties the list), and so does
   listing a pool set up since.  A number may be listed twice (its pool
   changed, its arena was given back, and another was made at its index),
   or the list given up: the walk then looks into every pool.  So it does
   at first. */
struct _Py_memtrack_changed_pools _Py_memtrack_changed;
static size_t changed_capacity;
static int changed_unlisted = 1;

/* Room for `extra` numbers more than the list holds, and for one for each
   pool there can be; -1 without memory. */
static int
make_room_for_changes(size_t extra)
{
    size_t needed = _Py_memtrack_changed.length + extra
                    + _PyMemTrack_PoolNumbers();
    if (needed <= changed_capacity) {
        return 0;
    }
    size_t capacity = Py_MAX(needed, 2 * changed_capacity);
    size_t *grown = PyObject_RAW_REALLOC(_Py_memtrack_changed.numbers,
                                         capacity * sizeof(size_t));
    if (grown == NULL) {
        return -1;
    }
    _Py_memtrack_changed.numbers = grown;
    changed_capacity = capacity;
    return 0;
}

void
_PyMemTrack_PoolSetUp(struct pool_header *pool)
{
    /* Changed, and no block marked. */
    static_assert(_PyMemTrack_POOL_CHANGED == 0, "changed is all clear");
    memset(pool->memtrack_map, 0, sizeof(pool->memtrack_map));
    if (changed_unlisted) {
        return;
    }
    /* More numbers listed than there are pools: given up. */
    if (_Py_memtrack_changed.length >= _PyMemTrack_PoolNumbers()
        || make_room_for_changes(1) < 0)
    {
        _Py_memtrack_changed.length = 0;
        changed_unlisted = 1;
        return;
    }
    _Py_memtrack_changed.numbers[_Py_memtrack_changed.length++] =
        _PyMemTrack_PoolNumber(pool);
}

/* The entry of t's type in memo, or memo->length for none. */
static uint32_t
memo_entry(pool_memo *memo, _Py_memtally *t)
{
    uint32_t i = 0;
    while (i < memo->length && (memo->entries[i].type != t->type
                                || memo->entries[i].serial != t->serial))
    {
        i++;
    }
    return i;
}

/* Note that a block in a pool with a memo is about to change, with what
   it holds; 0 if that cannot be noted. */
static int
note_change(pool_memo *memo, uintptr_t block, int was_free)
{
    uint16_t granule = (uint16_t)((block & _PyMemTrack_POOL_MASK)
                                  >> _PyObmalloc_GRANULE_SHIFT);
    for (uint8_t i = 0; i < memo->noted; i++) {
        if (memo->noted_granules[i] == granule) {
            /* What it held at the walk is noted already. */
            return 1;
        }
    }
    if (memo->noted == NOTED_MAX) {
        return 0;
    }
    uint8_t old = NO_ENTRY;
    _Py_memtally *t;
    /* A block handed out was free; the size is the pool's now, as the
       memo's may be that of the pool's last life. */
    if (!was_free
        && object_in_block(block, _PyMemTrack_PooledSize(block), &t) != NULL)
    {
        uint32_t i = memo_entry(memo, t);
        if (i >= NO_ENTRY) {
            /* Not what the walk saw: not an object then, or too many
               types. */
            return 0;
        }
        old = (uint8_t)i;
    }
    memo->noted_granules[memo->noted] = granule;
    memo->old_entries[memo->noted] = old;
    memo->noted++;
    return 1;
}

void
_PyMemTrack_NoteChange(uintptr_t block, int was_free)
{
    struct pool_header *pool = _PyMemTrack_PoolOf(block);
    size_t number = _PyMemTrack_PoolNumber(pool);
    if (_PyMemTrack_PoolState(pool) == _PyMemTrack_POOL_UNCHANGED) {
        _Py_memtrack_changed.numbers[_Py_memtrack_changed.length++] = number;
    }
    pool_memo *memo = number < memos_length ? memos[number] : NULL;
    _PyMemTrack_SetPoolState(pool, (memo != NULL
                                    && note_change(memo, block, was_free)
                                    ? _PyMemTrack_POOL_NOTED
                                    : _PyMemTrack_POOL_CHANGED));
}

/* Whether the debug hooks of a domain may hold pymalloc's blocks, and
   are called with the GIL held: those of the mem and object domains.  The
   raw domain's blocks are malloc()'s, and any thread allocates and frees
   them. */
static inline int
hooks_domain_pooled(char api_id)
{
    return api_id != 'r';
}

void
_PyMemTrack_HooksErasing(char api_id, void *block)
{
    size_t size;
    if (hooks_domain_pooled(api_id)
        && _PyObject_PooledBlock((uintptr_t)block, &size) == (uintptr_t)block)
    {
        _PyMemTrack_BlockChanging((uintptr_t)block, 0);
    }
}

void
_PyMemTrack_HooksHandedOut(char api_id)
{
    if (hooks_domain_pooled(api_id)) {
        _PyMemTrack_ForgetLastBlock();
    }
}

/* Count an object of t's type in memo, whose entry is then at *index;
   NULL without memory, the memo freed. */
static pool_memo *
memo_add(pool_memo *memo, _Py_memtally *t, uint32_t *index)
{
    uint32_t i = memo_entry(memo, t);
    if (i == memo->length) {
        if (memo->length == memo->capacity) {
            uint32_t capacity = 2 * memo->capacity;
            pool_memo *grown = PyObject_RAW_REALLOC(
                memo, sizeof(pool_memo)
                      + capacity * sizeof(memo->entries[0]));
            if (grown == NULL) {
                PyObject_RAW_FREE(memo);
                return NULL;
            }
            memo = grown;
            memo->capacity = capacity;
        }
        memo->entries[i].type = t->type;
        memo->entries[i].serial = t->serial;
        memo->entries[i].count = 0;
        memo->length++;
    }
    memo->entries[i].count++;
    *index = i;
    return memo;
}

/* Look into a pool's blocks, reusing memo if not NULL (which is freed on
   failure); NULL without memory. */
static pool_memo *
look_into_pool(pool_memo *memo, uintptr_t first, uintptr_t end, size_t size)
{
    if (memo == NULL) {
        const uint32_t capacity = 2;
        memo = PyObject_RAW_MALLOC(sizeof(pool_memo)
                                   + capacity * sizeof(memo->entries[0]));
        if (memo == NULL) {
            return NULL;
        }
        memo->capacity = capacity;
    }
    memo->size = size;
    memo->length = 0;
    memo->noted = 0;
    /* A pool holds mostly objects of one type.  After an object that
       starts its block, the next block is first tried for another of its
       type, where pooled_object() would look first. */
    uint32_t last = UINT32_MAX;
    const uintptr_t pad = _Py_memtrack.hooks_pad;
    const size_t type_at = pad + offsetof(PyObject, ob_type);
    for (uintptr_t b = first; b < end; b += size) {
        if (last != UINT32_MAX
            && *(PyTypeObject **)(b + type_at) == memo->entries[last].type
            && may_hold_object(b))
        {
            memo->entries[last].count++;
            continue;
        }
        _Py_memtally *t;
        PyObject *op = object_in_block(b, size, &t);
        if (op != NULL) {
            uint32_t i;
            memo = memo_add(memo, t, &i);
            if (memo == NULL) {
                return NULL;
            }
            last = (uintptr_t)op == b + pad ? i : UINT32_MAX;
        }
    }
    return memo;
}

/* Add a memo to the sums (sign 1), or take it away (-1).  A type freed
   since the walk looked counts nothing, nor does another type made at
   its address since. */
static void
sum_memo(pool_memo *memo, int sign)
{
    pooled_blocks += sign * memo->blocks;
    for (uint32_t i = 0; i < memo->length; i++) {
        _Py_memtally *t = _PyMemTrack_TableTally(memo->entries[i].type);
        if (t != NULL && t->serial == memo->entries[i].serial) {
            Py_ssize_t count = sign * memo->entries[i].count;
            t->pooled_objects += count;
            t->pooled_bytes += count * (Py_ssize_t)memo->size;
        }
    }
}

/* The slot for a pool's memo; NULL without memory. */
static pool_memo **
memo_slot(size_t number)
{
    if (number >= memos_length) {
        size_t length = Py_MAX(2 * memos_length, number + 1);
        pool_memo **grown = PyObject_RAW_REALLOC(memos,
                                                 length * sizeof(*memos));
        if (grown == NULL) {
            return NULL;
        }
        memset(grown + memos_length, 0,
               (length - memos_length) * sizeof(*memos));
        memos = grown;
        memos_length = length;
    }
    return &memos[number];
}

/* Look at the blocks noted in memo (which is freed on failure), of a
   pool whose blocks lie in [first, end); NULL without memory. */
static pool_memo *
look_at_noted(pool_memo *memo, uintptr_t first, uintptr_t end)
{
    /* memo_add() may move the memo. */
    uint8_t noted = memo->noted;
    uint8_t old_entries[NOTED_MAX];
    uint16_t granules[NOTED_MAX];
    memcpy(old_entries, memo->old_entries, sizeof(old_entries));
    memcpy(granules, memo->noted_granules, sizeof(granules));
    memo->noted = 0;
    uintptr_t pool = first & ~_PyMemTrack_POOL_MASK;
    for (uint8_t i = 0; i < noted; i++) {
        if (old_entries[i] != NO_ENTRY) {
            assert(memo->entries[old_entries[i]].count > 0);
            memo->entries[old_entries[i]].count--;
        }
        uintptr_t b = pool + ((uintptr_t)granules[i]
                              << _PyObmalloc_GRANULE_SHIFT);
        assert(b >= first && (b - first) % memo->size == 0);
        _Py_memtally *t;
        if (b < end && object_in_block(b, memo->size, &t) != NULL) {
            uint32_t index;
            memo = memo_add(memo, t, &index);
            if (memo == NULL) {
                return NULL;
            }
        }
    }
    return memo;
}

/* Whether the blocks noted in memo start blocks of size, in a pool whose
   first block is at first.  They may not: the pool may have emptied since
   the walk, served another size class for a few blocks, emptied again and
   come back to this one. */
static int
noted_are_blocks(pool_memo *memo, uintptr_t first, size_t size)
{
    uintptr_t pool = first & ~_PyMemTrack_POOL_MASK;
    for (uint8_t i = 0; i < memo->noted; i++) {
        uintptr_t b = pool + ((uintptr_t)memo->noted_granules[i]
                              << _PyObmalloc_GRANULE_SHIFT);
        if (b < first || (b - first) % size != 0) {
            return 0;
        }
    }
    return 1;
}

static void
look_into_visited(uintptr_t first, uintptr_t end, size_t size,
                  unsigned int state, void *arg)
{
    pool_memo **memo = arg;
    if (*memo != NULL && state != _PyMemTrack_POOL_CHANGED
        && (*memo)->size == size && noted_are_blocks(*memo, first, size))
    {
        *memo = look_at_noted(*memo, first, end);
    }
    else {
        *memo = look_into_pool(*memo, first, end, size);
    }
}

/* Look again into a pool, by number. */
static void
relook_pool(size_t number)
{
    pool_memo *memo = number < memos_length ? memos[number] : NULL;
    if (memo != NULL) {
        sum_memo(memo, -1);
        memos[number] = NULL;
    }
    pool_memo *fresh = memo;
    Py_ssize_t blocks = _PyMemTrack_VisitPool(number, look_into_visited,
                                              &fresh);
    if (blocks == 0) {
        /* No pool, or an empty one, unvisited. */
        if (fresh != NULL) {
            PyObject_RAW_FREE(fresh);
        }
        return;
    }
    pool_memo **slot = fresh != NULL ? memo_slot(number) : NULL;
    if (slot == NULL) {
        /* Without memory: its objects count nowhere until all the pools
           are looked into again. */
        if (fresh != NULL) {
            PyObject_RAW_FREE(fresh);
        }
        changed_unlisted = 1;
        return;
    }
    fresh->blocks = blocks;
    sum_memo(fresh, 1);
    *slot = fresh;
}

#ifdef Py_DEBUG
/* The cross-check: the sums are what a fresh look into every pool finds,
   and no pool is left changed. */
static void
check_visited(uintptr_t first, uintptr_t end, size_t size,
              unsigned int state, void *Py_UNUSED(arg))
{
    assert(state == _PyMemTrack_POOL_UNCHANGED);
    for (uintptr_t b = first; b < end; b += size) {
        _Py_memtally *t;
        if (object_in_block(b, size, &t) != NULL) {
            t->checked_objects++;
            t->checked_bytes += (Py_ssize_t)size;
        }
    }
}

static void
check_sums(void)
{
    for (_Py_memtally *t = tallies; t != NULL; t = t->next) {
        t->checked_objects = t->checked_bytes = 0;
    }
    Py_ssize_t blocks = _PyMemTrack_VisitPools(check_visited, NULL);
    assert(blocks == pooled_blocks);
    for (_Py_memtally *t = tallies; t != NULL; t = t->next) {
        assert(t->checked_objects == t->pooled_objects);
        assert(t->checked_bytes == t->pooled_bytes);
    }
#define CHECK_CORE(T) \
    assert(_Py_memtrack_core_tallies[_PyMemTrack_CORE_##T] \
           == _PyMemTrack_TableTally(&T));
    _PyMemTrack_CORE_OWNERS(CHECK_CORE)
#undef CHECK_CORE
}
#endif

/* Bring the sums up to date: look again into the pools that changed; -1
   without memory. */
static int
look_into_changed_pools(void)
{
    if (make_room_for_changes(0) < 0) {
        return -1;
    }
    /* Its use is known now, or never will be. */
    _PyMemTrack_ForgetLastBlock();
    /* Looking allocates nothing from the pools: the list stays. */
    size_t *numbers = _Py_memtrack_changed.numbers;
    if (changed_unlisted) {
        changed_unlisted = 0;
        size_t n = Py_MAX(memos_length, _PyMemTrack_PoolNumbers());
        for (size_t number = 0; number < n; number++) {
            relook_pool(number);
        }
    }
    else {
        for (size_t i = 0; i < _Py_memtrack_changed.length; i++) {
            relook_pool(numbers[i]);
        }
    }
    _Py_memtrack_changed.length = 0;
#ifdef Py_DEBUG
    if (!changed_unlisted) {
        check_sums();
    }
#endif
    return 0;
}

static void
count_objects_as(PyTypeObject *type, Py_ssize_t count, size_t size)
{
    _Py_memtally *t = _PyMemTrack_TableTally(type);
    if (t != NULL) {
        t->object_bytes += count * (Py_ssize_t)size;
        t->objects += count;
    }
}

/* Count every object under its type, as it is now; return how many blocks
   the mem and object domains hold, or -1 without memory. */
static Py_ssize_t
count_objects(void)
{
    if (look_into_changed_pools() < 0) {
        return -1;
    }
    for (_Py_memtally *t = tallies; t != NULL; t = t->next) {
        t->object_bytes = t->pooled_bytes;
        t->objects = t->pooled_objects;
    }
    for (size_t i = 0; large_count > 0 && i <= large_mask; i++) {
        large_block *entry = &large_table[i];
        if (entry->op != NULL) {
            count_objects_as(Py_TYPE(entry->op), 1, entry->size);
        }
    }
    return pooled_blocks + large_blocks;
}

typedef struct {
    int (*visit)(PyObject *, void *);
    void *arg;
    int stop;
} object_visit;

static void
visit_pool_objects(uintptr_t first, uintptr_t end, size_t size,
                   unsigned int Py_UNUSED(state), void *arg)
{
    object_visit *v = arg;
    for (uintptr_t b = first; b < end && !v->stop; b += size) {
        _Py_memtally *t;
        PyObject *op = object_in_block(b, size, &t);
        if (op != NULL) {
            v->stop = v->visit(op, v->arg);
        }
    }
}

int
_PyMemTrack_VisitObjects(int (*visit)(PyObject *op, void *arg), void *arg)
{
    object_visit v = {visit, arg, 0};
    (void)_PyMemTrack_VisitPools(visit_pool_objects, &v);
    for (size_t i = 0; !v.stop && large_count > 0 && i <= large_mask; i++) {
        PyObject *op = large_table[i].op;
        if (op != NULL) {
            v.stop = visit(op, arg);
        }
    }
    return v.stop;
}

static PyObject *
usage_by_tag(int blocks, int by_type)
{
    /* Filling the dict allocates, which changes the tallies: copy them
       first, then report the copy.  The copy holds its types: the dict may
       set off a collection, which may free them. */
    Py_ssize_t locked_blocks = count_objects();
    if (locked_blocks < 0) {
        return PyErr_NoMemory();
    }
    size_t n = ntallies;
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


/* Bytes summed by name: open addressing with linear probing, at most
   half full. */
typedef struct {
    const char *name;               /* NULL for an empty slot */
    Py_uhash_t hash;
    Py_ssize_t bytes;
} name_sum;

static void
add_by_name(name_sum *sums, size_t mask, const char *name, Py_ssize_t bytes)
{
    if (bytes <= 0) {
        return;
    }
    Py_uhash_t hash = hash_name(name);
    size_t i = (size_t)hash & mask;
    for (; sums[i].name != NULL; i = (i + 1) & mask) {
        if (sums[i].hash == hash && strcmp(sums[i].name, name) == 0) {
            sums[i].bytes += bytes;
            return;
        }
    }
    sums[i] = (name_sum){name, hash, bytes};
}

Py_ssize_t
_PyMemTrack_TopTags(_PyMemTrack_TagBytes *top, Py_ssize_t n)
{
    if (count_objects() < 0) {
        return -1;
    }
    /* Types may share a name (classes made by a function): their bytes
       are summed by name, as sys.type_memory_usage() does, before the
       largest are picked. */
    size_t capacity = 8;
    while (capacity < 2 * (ntallies + 1)) {     /* and the frame stacks */
        capacity *= 2;
    }
    name_sum *sums = PyObject_RAW_MALLOC(capacity * sizeof(name_sum));
    if (sums == NULL) {
        return -1;
    }
    memset(sums, 0, capacity * sizeof(name_sum));
    size_t mask = capacity - 1;
    add_by_name(sums, mask, _PyType_Name(&PyFrame_Type),
                atomic_load_explicit(&stack_bytes, RELAXED));
    for (_Py_memtally *t = tallies; t != NULL; t = t->next) {
        add_by_name(sums, mask,
                    t->type != NULL ? _PyType_Name(t->type) : t->name,
                    t->bytes + t->object_bytes);
    }

    Py_ssize_t found = 0;
    for (size_t k = 0; k < capacity; k++) {
        Py_ssize_t bytes = sums[k].bytes;
        Py_ssize_t i;
        if (sums[k].name == NULL) {
            continue;
        }
        if (found < n) {
            i = found++;
        }
        else if (n > 0 && top[n - 1].bytes < bytes) {
            i = n - 1;
        }
        else {
            continue;
        }
        for (; i > 0 && top[i - 1].bytes < bytes; i--) {
            top[i] = top[i - 1];
        }
        top[i] = (_PyMemTrack_TagBytes){sums[k].name, bytes};
    }
    PyObject_RAW_FREE(sums);
    return found;
}


/* --- the sys functions --------------------------------------------------- */

/*[clinic input]
module sys
[clinic start generated code]*/
/*[clinic end generated code: output=da39a3ee5e6b4b0d input=3726b388feee8cea]*/

#include "clinic/memtrack.c.h"

/*[clinic input]
sys.total_memory_used -> Py_ssize_t

Return the bytes currently allocated through Python's allocators.

What the allocators really reserve for each block, plus memory that C code
accounts with Py_TrackMemory().  Only in builds made with
--with-memory-tracking.
[clinic start generated code]*/

static Py_ssize_t
sys_total_memory_used_impl(PyObject *module)
/*[clinic end generated code: output=5b554544eac0b0e3 input=adc35a57485edfeb]*/
{
    return _PyMemTrack_TotalBytes();
}

/*[clinic input]
sys.peak_memory_used -> Py_ssize_t

Return the highest total_memory_used() since start-up or the last reset.
[clinic start generated code]*/

static Py_ssize_t
sys_peak_memory_used_impl(PyObject *module)
/*[clinic end generated code: output=375156bb43ca1fc2 input=ffadb06f2ac20219]*/
{
    return peak_bytes();
}

/*[clinic input]
sys.reset_peak_memory_used

Set the peak to the current total_memory_used().
[clinic start generated code]*/

static PyObject *
sys_reset_peak_memory_used_impl(PyObject *module)
/*[clinic end generated code: output=5eb61612e8bcad2f input=92d4afaaafe264a5]*/
{
    reset_peak();
    Py_RETURN_NONE;
}

/*[clinic input]
sys.total_allocation_count -> Py_ssize_t

Return how many blocks are currently allocated through Python's allocators.
[clinic start generated code]*/

static Py_ssize_t
sys_total_allocation_count_impl(PyObject *module)
/*[clinic end generated code: output=41f404766a0eb968 input=33f8ba807517f9ed]*/
{
    return total_blocks();
}

/*[clinic input]
sys.type_memory_usage

    *
    by_type: bool = False
        Key the result by type object rather than by name, so that types
        sharing a name are told apart.

Return a dict of the bytes currently allocated, by purpose.

Keys are type names (an object's memory and the buffers it owns count
under its type), names given to the tracked-allocation C API, '' for
memory nothing claimed, and '<raw>' for the raw domain.  The values add
up to total_memory_used() at the time of the call.
[clinic start generated code]*/

static PyObject *
sys_type_memory_usage_impl(PyObject *module, int by_type)
/*[clinic end generated code: output=865136c29dab02f1 input=8a1ff4c5585805ab]*/
{
    return usage_by_tag(0, by_type);
}

/*[clinic input]
sys.type_allocation_counts

    *
    by_type: bool = False

Return a dict of how many blocks are allocated, keyed as type_memory_usage().
[clinic start generated code]*/

static PyObject *
sys_type_allocation_counts_impl(PyObject *module, int by_type)
/*[clinic end generated code: output=9a0a857f514b6e8f input=354559c17c3c038f]*/
{
    return usage_by_tag(1, by_type);
}

static PyMethodDef sys_functions[] = {
    SYS_TOTAL_MEMORY_USED_METHODDEF
    SYS_PEAK_MEMORY_USED_METHODDEF
    SYS_RESET_PEAK_MEMORY_USED_METHODDEF
    SYS_TOTAL_ALLOCATION_COUNT_METHODDEF
    SYS_TYPE_MEMORY_USAGE_METHODDEF
    SYS_TYPE_ALLOCATION_COUNTS_METHODDEF
    {NULL, NULL}
};

int
_PyMemTrack_AddSysFunctions(PyObject *sysmod)
{
    return PyModule_AddFunctions(sysmod, sys_functions);
}

#endif  /* Py_TRACK_MEMORY */
