#ifndef Py_INTERNAL_MEMTRACK_H
#define Py_INTERNAL_MEMTRACK_H
#ifdef __cplusplus
extern "C" {
#endif

#ifndef Py_BUILD_CORE
#  error "this header requires Py_BUILD_CORE define"
#endif

/* The accounting behind --with-memory-tracking (Objects/memtrack.c).

   The allocators count the bytes of every block they hand out, with the
   size they really reserve.  Objects are attributed when someone asks:
   sys.type_memory_usage() walks pymalloc's allocated blocks (and a table
   of the few objects outside the pools) and reads each object's type
   then.  So the hot paths never touch a type's tally, a free list needs
   no bookkeeping, and a block counts as an object's exactly as long as it
   is allocated.  The walk remembers what it found in each pool, and keeps
   the sums by type; it looks again only into the pools whose blocks
   changed since (a state in the pool's header, set where a block is
   handed out, freed or marked, or an object's __class__ assigned, puts
   the pool on a list), so that a reading costs in proportion to what
   changed, not to the heap; and in a pool where few blocks changed, it
   looks only at those, which the pool's memo notes as they change (with
   what the walk saw there: see _PyMemTrack_BlockChanging()).  Buffers an
   object owns (list items, dict tables, ...) are fewer: their owners
   claim them for their type's tally.  The anonymous tag is what no one
   has claimed and no object is in.

   Most blocks hold objects, so it is the other blocks that are marked: a bit
   in a map in the header of each pool says that an allocated block holds
   data (a buffer, claimed or not).  pymalloc hands out every block
   unmarked, and remembers it as the last block until its use is known: an
   object made in it leaves it unmarked, and a claim, the next allocation, a
   collection started by an allocation, the walk or debug hooks (at once)
   mark it as data.  So making an object costs a comparison, and the map is
   written for data only: no free block is marked, so that a hand-out need
   not clear its bit.  A claim's mark goes where its claim does (the free
   or reallocation of a claimed block); the others, the anonymous blocks'
   marks, are counted in their pool's header, and pymalloc's free looks for
   one only in a pool that has them.  A free stamps its block too.  The walk
   visits the allocated blocks that are neither marked nor stamped, and
   finds each one's object after what its type puts before objects (the GC
   header, the managed dict), which holds no type: see pooled_object() in
   memtrack.c. */

#ifdef Py_TRACK_MEMORY

#include "pycore_atomic.h"        // _Py_atomic_address
#include "pycore_object.h"        // _PyType_PreHeaderSize()
#include "pycore_obmalloc_pool.h" // struct pool_header

/* A note on layout.  Fields that one function writes are never
   neighbours: GCC would combine two such stores into one 16-byte vector
   store, and on the AMD machines we measure on, a word load cannot take
   its value from a vector store still in flight.  Each such load then
   waits for the store to reach the cache (measured: a fifth of the time
   of an int-heavy loop). */

/* The bytes the allocator reserved for the blocks an object owns (not
   its own block).  See _PyMemTrack_SetOwnedBytes(). */
typedef size_t (*_PyMemTrack_OwnedBytesFunc)(PyObject *op);

/* What a type's objects own, or what a name given to the tracked-malloc
   API holds; the type's objects in the pools as the walk last saw them;
   and, while sys reads them, all the type's objects. */
typedef struct _Py_memtally {
    /* The owned blocks' bytes and count, which each claim and free of a
       block writes: apart (see the note on layout). */
    Py_ssize_t bytes;
    Py_ssize_t object_bytes;
    Py_ssize_t blocks;
    Py_ssize_t objects;
    Py_ssize_t pooled_bytes;
    Py_ssize_t pooled_objects;
    /* Tells this tally from those of types that had the same address. */
    uint64_t serial;
#ifdef Py_DEBUG
    Py_ssize_t checked_bytes, checked_objects;      /* memtrack.c's check */
#endif
    PyTypeObject *type;             /* NULL for a name */
    char *name;                     /* a name's own copy */
    _PyMemTrack_OwnedBytesFunc owned_bytes;     /* or NULL */
    struct _Py_memtally *prev, *next;
} _Py_memtally;

/* Every type made ready and not freed since, each with its tally (and
   any other type an object claimed a block for): open addressing with
   linear probing, never more than half full, a type's first slot taken
   from the high bits of its hashed address.  Memory a walk finds in an
   object whose type is not here counts as anonymous: C code may make an
   object inside a block it holds, then reuse the memory, and a "type"
   read there must not be followed. */
struct _Py_memtrack_type_table {
    _Py_memtally **slots;
    /* The class last found here through _PyMemTrack_TallyOf(), and its
       tally: a program makes and drops objects of one class in a row, and
       an instance's values are claimed for its class.  (Static types,
       claimed for between those, would take its place.)  Written
       together, so not neighbours (see the note on layout above). */
    PyTypeObject *last_type;
    size_t mask;                    /* capacity - 1 */
    _Py_memtally *last_tally;
    int shift;                      /* 64 - log2(capacity) */
    size_t count;
};
PyAPI_DATA(struct _Py_memtrack_type_table) _Py_memtrack_types;

/* An address scrambled, for the tracking's tables: the high bits mix
   them all. */
static inline uint64_t
_PyMemTrack_AddressHash(const void *p)
{
    return (uint64_t)((uintptr_t)p >> 4) * 0x9E3779B97F4A7C15u;
}

static inline size_t
_PyMemTrack_TypeSlot(PyTypeObject *type)
{
    return (size_t)(_PyMemTrack_AddressHash(type) >> _Py_memtrack_types.shift);
}

/* The tally of a type in the table; NULL for a type not in it. */
static inline _Py_memtally *
_PyMemTrack_TableTally(PyTypeObject *type)
{
    size_t i = _PyMemTrack_TypeSlot(type);
    for (;;) {
        _Py_memtally *t = _Py_memtrack_types.slots[i];
        if (t == NULL || t->type == type) {
            return t;
        }
        i = (i + 1) & _Py_memtrack_types.mask;
    }
}

/* The hot ones among the owners that claims name as constants: the core
   types whose objects' buffers are claimed where they are allocated and
   freed (dict keys and values, list items, ...).  Each one's tally is
   kept in an entry of _Py_memtrack_core_tallies as well as in the table,
   so that those claims read it with one load instead of the table's
   lookup (a hash and two dependent loads: a dozen instructions at each
   allocation and free of such a buffer; its resizes, out of line, still
   look it up). */
#define _PyMemTrack_CORE_OWNERS(X) \
    X(PyDict_Type) \
    X(PyList_Type) \
    X(PyUnicode_Type) \
    X(PyByteArray_Type) \
    X(PyCode_Type)

enum {
#define _PyMemTrack_CORE_INDEX(T) _PyMemTrack_CORE_##T,
    _PyMemTrack_CORE_OWNERS(_PyMemTrack_CORE_INDEX)
#undef _PyMemTrack_CORE_INDEX
    _PyMemTrack_NCORE
};

/* A core owner's tally, or NULL while the table has none for it:
   _PyMemTrack_TableTally() of the type, always (memtrack.c sets both at
   once, the table never loses a static type's tally, and the debug
   cross-check compares them). */
PyAPI_DATA(_Py_memtally *) _Py_memtrack_core_tallies[_PyMemTrack_NCORE];

/* The tally of a type that claims or gives back a block; NULL for a
   type not in the table.  For a core owner named as a constant, GCC and
   clang keep only the load of its entry where they inline this; for any
   other type, and wherever they do not inline it (as in debug builds,
   which so never read the entries), the table's last class found, or its
   lookup.  (The walk and the heap scanner look types up in the table
   itself, and leave the last class to the claims and type_tally().) */
static inline _Py_memtally *
_PyMemTrack_TallyOf(PyTypeObject *type)
{
#ifdef __GNUC__
#  define _PyMemTrack_IF_CORE(T) \
    if (__builtin_constant_p(type == &T) && type == &T) { \
        return _Py_memtrack_core_tallies[_PyMemTrack_CORE_##T]; \
    }
    _PyMemTrack_CORE_OWNERS(_PyMemTrack_IF_CORE)
#  undef _PyMemTrack_IF_CORE
#endif
    if (type == _Py_memtrack_types.last_type) {
        assert(_Py_memtrack_types.last_tally == _PyMemTrack_TableTally(type));
        return _Py_memtrack_types.last_tally;
    }
    _Py_memtally *t = _PyMemTrack_TableTally(type);
    if (t != NULL && (type->tp_flags & Py_TPFLAGS_HEAPTYPE)) {
        _Py_memtrack_types.last_type = type;
        _Py_memtrack_types.last_tally = t;
    }
    return t;
}

/* What the mem and object domains hold, and what the allocator tells the
   accounting: used with the GIL held only. */
struct _Py_memtrack_counts {
    Py_ssize_t bytes;
    /* Up to this, the total is at most the peak.  The total is highest
       just before it falls, if not now: the peak is raised from it then
       (and when read), never as it grows, so that a growing heap pays
       nothing for it. */
    _Py_atomic_address peak_watermark;
    /* The block pymalloc handed out last, while its use is unknown; or,
       until _Py_NewReference(), the object made after a pre-header in it
       (see _PyMemTrack_NameObjectInBlock()). */
    uintptr_t last_block;
    /* What debug hooks put before the pointer they hand out: 0, or two
       size_t. */
    uintptr_t hooks_pad;
    /* All the bytes ever counted in `bytes`, for profilers that tell
       what a function allocated besides what it kept. */
    Py_ssize_t allocated;
};
PyAPI_DATA(struct _Py_memtrack_counts) _Py_memtrack;

/* A pool's header holds a map with a bit for each granule, which says
   that the allocated block starting there holds data.  The bits of the
   granules that the header covers hold the pool's state and its count of
   anonymous marks.  The state says whether what its blocks hold may have
   changed (a block handed out, freed or marked, an object's class
   assigned) since the walk last looked into it.  The walk looks again only
   into pools that changed, and only at the blocks noted if there are few.
   (A state for each quarter of a pool saved a quarter of the walk's time
   on a heap mutated at random, for 1.5% more instructions over bench/'s
   kinds, 2.8% on its integer loop; one per pool costs 0.3% and 0.5%.) */
enum {
    /* Any of its blocks may have changed: the allocator notes nothing.
       All bits clear, as a pool is set up. */
    _PyMemTrack_POOL_CHANGED = 0,
    /* As the walk saw it: a bit of its own (_PyMemTrack_POOL_WATCHED),
       which the allocator tests, to note the next change. */
    _PyMemTrack_POOL_UNCHANGED = 2,
    /* The blocks that changed are noted (in memtrack.c). */
    _PyMemTrack_POOL_NOTED = 3,
};
#define _PyMemTrack_POOL_WATCHED ((uint64_t)2)
#define _PyMemTrack_POOL_STATE ((uint64_t)3)

/* The marks of anonymous blocks in the pool, in the next bits: at most
   _PyMemTrack_POOL_MARKS_MAX, where the count stays until the pool is
   empty, as it must never count fewer marks than there are. */
#define _PyMemTrack_POOL_MARKS_SHIFT 2
#define _PyMemTrack_POOL_MARKS_MAX ((uint64_t)255)
#define _PyMemTrack_POOL_MARKS \
    (_PyMemTrack_POOL_MARKS_MAX << _PyMemTrack_POOL_MARKS_SHIFT)
/* The granules whose bits these take, which no block starts in. */
#define _PyMemTrack_POOL_HEADER_GRANULES 10

#define _PyMemTrack_POOL_MASK \
    (((uintptr_t)1 << _PyObmalloc_POOL_BITS) - 1)

static inline struct pool_header *
_PyMemTrack_PoolOf(uintptr_t block)
{
    return (struct pool_header *)(block & ~_PyMemTrack_POOL_MASK);
}

/* What pymalloc's free writes into a block's second word, so that the walk
   can tell a free block without following the pool's list.  No block that
   holds an object has it there: the word is the object's type, the GC
   header's prev link (a pointer, or a count shifted by two, with two flag
   bits), the managed dict, or the debug hooks' pad; and the stamp is above
   every address and count. */
#define _PyMemTrack_FREED ((uintptr_t)-5)

/* A pool's state, in its map's first word. */
static inline unsigned int
_PyMemTrack_PoolState(struct pool_header *pool)
{
    return (unsigned int)(pool->memtrack_map[0] & _PyMemTrack_POOL_STATE);
}

static inline int
_PyMemTrack_PoolChanged(struct pool_header *pool)
{
    return (pool->memtrack_map[0] & _PyMemTrack_POOL_WATCHED) == 0;
}

/* Whether a free in the pool has more to do than stamp its block: note
   the change, or look for an anonymous mark. */
static inline int
_PyMemTrack_PoolWatchedOrMarked(struct pool_header *pool)
{
    return (pool->memtrack_map[0]
            & (_PyMemTrack_POOL_WATCHED | _PyMemTrack_POOL_MARKS)) != 0;
}

static inline void
_PyMemTrack_SetPoolState(struct pool_header *pool, unsigned int state)
{
    pool->memtrack_map[0] = ((pool->memtrack_map[0] & ~_PyMemTrack_POOL_STATE)
                             | state);
}

/* The map's word that holds the bit of a block in a pool, and the bit's
   place in it. */
static inline uint64_t *
_PyMemTrack_MapWord(struct pool_header *pool, uintptr_t block)
{
    assert(pool == _PyMemTrack_PoolOf(block));
    return &pool->memtrack_map[
        (block & _PyMemTrack_POOL_MASK) >> (_PyObmalloc_GRANULE_SHIFT + 6)];
}

static inline unsigned int
_PyMemTrack_MapShift(uintptr_t block)
{
    return (unsigned int)((block >> _PyObmalloc_GRANULE_SHIFT) % 64);
}

/* A pool's number: its arena's index, and its slot in the span of
   addresses the arena covers (an arena need not start at a multiple of
   its size, but its pools fall in distinct slots all the same).  The same
   number while the pool lasts. */
#define _PyMemTrack_SLOT_BITS (_PyObmalloc_ARENA_BITS - _PyObmalloc_POOL_BITS)

static inline size_t
_PyMemTrack_PoolNumber(struct pool_header *pool)
{
    return ((size_t)pool->arenaindex << _PyMemTrack_SLOT_BITS
            | (((uintptr_t)pool >> _PyObmalloc_POOL_BITS)
               & (((size_t)1 << _PyMemTrack_SLOT_BITS) - 1)));
}

/* The numbers of the pools whose state was set since the walk looked
   into them, so that it looks into no other.  There is always room for
   every pool whose state is clear (see memtrack.c). */
struct _Py_memtrack_changed_pools {
    size_t *numbers;
    size_t length;
};
PyAPI_DATA(struct _Py_memtrack_changed_pools) _Py_memtrack_changed;

/* What a block held as the walk saw it is noted, out of line, at each
   change until its pool has too many to note; once it has, a change costs
   a comparison. */
PyAPI_FUNC(void) _PyMemTrack_NoteChange(uintptr_t block, int was_free);

/* Called before a block in a pool changes: handed out (was_free), freed,
   marked, or its object's class assigned. */
static inline void
_PyMemTrack_BlockChanging(uintptr_t block, int was_free)
{
    if (!_PyMemTrack_PoolChanged(_PyMemTrack_PoolOf(block))) {
        _PyMemTrack_NoteChange(block, was_free);
    }
}

/* The debug hooks of a domain (api_id as theirs: 'r', 'm' or 'o') are
   about to erase a block they free or move: what it holds is noted
   first. */
extern void _PyMemTrack_HooksErasing(char api_id, void *block);
/* ...and have had a block from the allocator they wrap.  It holds data
   until an object is made in it: the objects made in the hooks' blocks
   find theirs the slow way, so that the usual case never allows for the
   hooks' pad. */
extern void _PyMemTrack_HooksHandedOut(char api_id);

/* pymalloc sets up a pool in an arena (whose memory may hold anything). */
extern void _PyMemTrack_PoolSetUp(struct pool_header *pool);

/* pymalloc frees the last allocated block of a pool.  Its map is clear
   but for the count of anonymous marks, which may have stuck at the most;
   and for the marks of claimed blocks freed as no claim's (by PyMem_Free(),
   say), which would hide an object made there: cleared all the same.
   Returns the pool (so pymalloc keeps nothing across the call). */
extern struct pool_header *_PyMemTrack_PoolEmptied(struct pool_header *pool);

/* Whether a block in a pool is marked as holding data. */
static inline int
_PyMemTrack_IsData(uintptr_t block)
{
    return (*_PyMemTrack_MapWord(_PyMemTrack_PoolOf(block), block)
            >> _PyMemTrack_MapShift(block)) & 1;
}

/* Set a block's bit, once its change is noted. */
static inline void
_PyMemTrack_SetMark(struct pool_header *pool, uintptr_t block)
{
    *_PyMemTrack_MapWord(pool, block)
        |= (uint64_t)1 << _PyMemTrack_MapShift(block);
}

static inline void
_PyMemTrack_ClearMark(struct pool_header *pool, uintptr_t block)
{
    /* ~(1 << n) as a rotation of ~1, which spares two instructions. */
    unsigned int n = _PyMemTrack_MapShift(block);
    uint64_t rest = ~(uint64_t)1;
    *_PyMemTrack_MapWord(pool, block)
        &= (rest << n) | (rest >> ((64 - n) % 64));
}

/* One anonymous mark more or fewer in a pool, unless the count stuck. */
static inline void
_PyMemTrack_CountMark(struct pool_header *pool, int more)
{
    uint64_t marks = pool->memtrack_map[0] & _PyMemTrack_POOL_MARKS;
    if (marks != _PyMemTrack_POOL_MARKS) {
        assert(more || marks != 0);
        uint64_t one = (uint64_t)1 << _PyMemTrack_POOL_MARKS_SHIFT;
        if (more) {
            pool->memtrack_map[0] += one;
        }
        else {
            pool->memtrack_map[0] -= one;
        }
    }
}

/* An allocated block that no one claims holds data, or an object. */
static inline void
_PyMemTrack_MarkAnonymous(uintptr_t block)
{
    if (!_PyMemTrack_IsData(block)) {
        struct pool_header *pool = _PyMemTrack_PoolOf(block);
        _PyMemTrack_BlockChanging(block, 0);
        _PyMemTrack_SetMark(pool, block);
        _PyMemTrack_CountMark(pool, 1);
    }
}

/* An object is made in a marked block, an anonymous one's (forgotten as
   the last block before the object was made).  In a pool that counts no
   anonymous mark, the mark is a claim's: C code made an object inside a
   buffer it holds, which counts as part of the buffer.  (Where the pool
   counts others, such a mark is taken for one of them: one counted too
   few, until the pool is empty.) */
static inline void
_PyMemTrack_Unmark(uintptr_t block)
{
    struct pool_header *pool = _PyMemTrack_PoolOf(block);
    if (_PyMemTrack_IsData(block)
        && (pool->memtrack_map[0] & _PyMemTrack_POOL_MARKS) != 0)
    {
        _PyMemTrack_BlockChanging(block, 0);
        _PyMemTrack_ClearMark(pool, block);
        _PyMemTrack_CountMark(pool, 0);
    }
}

/* The block size of a pool in use.  pymalloc sets its maxnextoffset to
   the pool's size less that, with its size class; reading it spares the
   free the two instructions of INDEX2SIZE(szidx). */
static inline size_t
_PyMemTrack_PoolBlockSize(struct pool_header *pool)
{
    size_t size = ((size_t)1 << _PyObmalloc_POOL_BITS) - pool->maxnextoffset;
    assert(size
           == ((size_t)pool->szidx + 1) << _PyObmalloc_GRANULE_SHIFT);
    return size;
}

/* The size of a block in a pool in use. */
static inline size_t
_PyMemTrack_PooledSize(uintptr_t block)
{
    return _PyMemTrack_PoolBlockSize(_PyMemTrack_PoolOf(block));
}

/* The block handed out last holds data, as far as anyone knows: no object
   was made in it before the next allocation, or sys walks now. */
static inline void
_PyMemTrack_ForgetLastBlock(void)
{
    uintptr_t last = _Py_memtrack.last_block;
    if (last != 0) {
        /* Unless it was freed since (its pool may even have been set up
           for another size): a free block holds nothing, and no mark.  (A
           block handed out is unstamped then; one whose data has the
           stamp there reads as free to the walk all the same.) */
        if (((uintptr_t *)last)[1] != _PyMemTrack_FREED) {
            _PyMemTrack_MarkAnonymous(last);
        }
        _Py_memtrack.last_block = 0;
    }
}

/* Raise the peak to the total, which is about to fall. */
extern void _PyMemTrack_NotePeak(void);

static inline void
_PyMemTrack_Claim(_Py_memtally *t, Py_ssize_t size)
{
    t->bytes += size;
    t->blocks++;
}

/* A block must be given back by the tally that claimed it, which the
   debug build checks here and in its cross-check of every tally.  Not
   checked in release builds: two compares at every free of an owned
   buffer, for a tally that would be wrong all the same. */
static inline void
_PyMemTrack_Unclaim(_Py_memtally *t, Py_ssize_t size)
{
    assert(t->bytes >= size && t->blocks > 0);
    t->bytes -= size;
    t->blocks--;
}

/* Whether the total may be above the peak, before it falls. */
static inline int
_PyMemTrack_AbovePeak(void)
{
    return ((size_t)_Py_memtrack.bytes
            > _Py_atomic_load_relaxed(&_Py_memtrack.peak_watermark));
}

/* Called by every allocator of the mem and object domains for a block it
   hands out (and for the bytes a name's tally gains)... */
static inline void
_PyMemTrack_Count(size_t size)
{
    _Py_memtrack.bytes += (Py_ssize_t)size;
    _Py_memtrack.allocated += (Py_ssize_t)size;
}

/* ...by pymalloc, for a block it serves a request of nbytes with, and
   which hands out what this returns: the block.  (So pymalloc keeps no
   more across a call than the request it already keeps.)  It notes the
   block's change (see _PyMemTrack_BlockChanging()). */
extern void *_PyMemTrack_NoteHandOut(void *block);
/* The same, once the block handed out before, in which no object was
   made, is marked as data: out of line, so that the usual case keeps no
   more registers than pymalloc's own. */
extern void *_PyMemTrack_PooledHandedOutSlow(void *block,
                                             struct pool_header *pool,
                                             size_t nbytes);

static inline void *
_PyMemTrack_PooledHandedOut(void *block, struct pool_header *pool,
                            size_t nbytes)
{
    assert(pool == _PyMemTrack_PoolOf((uintptr_t)block));
    if (_Py_memtrack.last_block != 0) {
        return _PyMemTrack_PooledHandedOutSlow(block, pool, nbytes);
    }
    _Py_memtrack.last_block = (uintptr_t)block;
    /* Free, it held nothing the walk counts: the change can be noted
       after. */
    assert(!_PyMemTrack_IsData((uintptr_t)block));
    ((uintptr_t *)block)[1] = 0;
    _PyMemTrack_Count(_Py_SIZE_ROUND_UP(
        nbytes, (size_t)1 << _PyObmalloc_GRANULE_SHIFT));
    if (!_PyMemTrack_PoolChanged(pool)) {
        return _PyMemTrack_NoteHandOut(block);
    }
    return block;
}

/* ...and by all of them when they free a block (or a name's tally
   loses bytes). */
static inline void
_PyMemTrack_Uncount(size_t size)
{
    if (_PyMemTrack_AbovePeak()) {
        _PyMemTrack_NotePeak();
    }
    _Py_memtrack.bytes -= (Py_ssize_t)size;
}

/* pymalloc frees a block of a pool, which these return.  (So pymalloc
   keeps no more across a call than the block.)  The first notes the
   block's change, the second that and gives back an anonymous block's
   mark, the third notes the peak. */
extern struct pool_header *_PyMemTrack_NoteFree(void *block);
extern struct pool_header *_PyMemTrack_NoteFreeInPool(void *block);
extern struct pool_header *_PyMemTrack_NotePeakAt(void *block);

/* The peak raised to the total, if below it, before a block's free. */
static inline struct pool_header *
_PyMemTrack_PeakNotedAt(void *block, struct pool_header *pool)
{
    if (_PyMemTrack_AbovePeak()) {
        pool = _PyMemTrack_NotePeakAt(block);
    }
    return pool;
}

/* Its bytes leave the total, which the peak is raised to first. */
static inline struct pool_header *
_PyMemTrack_PooledUncount(void *block, struct pool_header *pool)
{
    pool = _PyMemTrack_PeakNotedAt(block, pool);
    _Py_memtrack.bytes -= (Py_ssize_t)_PyMemTrack_PoolBlockSize(pool);
    return pool;
}

static inline struct pool_header *
_PyMemTrack_PooledFreed(void *block, struct pool_header *pool)
{
    pool = _PyMemTrack_PooledUncount(block, pool);
    if (_PyMemTrack_PoolWatchedOrMarked(pool)) {
        pool = _PyMemTrack_NoteFreeInPool(block);
    }
    ((uintptr_t *)block)[1] = _PyMemTrack_FREED;
    return pool;
}

/* ...and one that its claim gives back, with the claim's mark.  Its notes
   (the peak, the pool's change) come first, where it has any: out of line,
   so that a free without them makes no call before pymalloc's last. */
static inline int
_PyMemTrack_ClaimedFreeNotes(struct pool_header *pool)
{
    return _PyMemTrack_AbovePeak() || !_PyMemTrack_PoolChanged(pool);
}

static inline struct pool_header *
_PyMemTrack_NoteClaimedFree(void *block, struct pool_header *pool)
{
    pool = _PyMemTrack_PeakNotedAt(block, pool);
    if (!_PyMemTrack_PoolChanged(pool)) {
        pool = _PyMemTrack_NoteFree(block);
    }
    return pool;
}

static inline void
_PyMemTrack_PooledClaimedFreed(void *block, struct pool_header *pool)
{
    assert(!_PyMemTrack_AbovePeak());
    _Py_memtrack.bytes -= (Py_ssize_t)_PyMemTrack_PoolBlockSize(pool);
    _PyMemTrack_ClearMark(pool, (uintptr_t)block);
    ((uintptr_t *)block)[1] = _PyMemTrack_FREED;
}

/* The functions beneath every domain (obmalloc.c's _PyMem_Raw*): malloc()
   and the others, counting what they hand out.  The context tells the
   raw domain's own blocks (_PyMemTrack_RAW_CTX, the raw domain's default
   allocator's) from those of the mem and object domains (with
   PYTHONMALLOC=malloc, or pymalloc's large requests, which it passes to the
   raw domain through the _PyMemTrack_Fallback* functions). */
extern char _PyMemTrack_raw_ctx;
#define _PyMemTrack_RAW_CTX ((void *)&_PyMemTrack_raw_ctx)
extern void *_PyMemTrack_BaseMalloc(void *ctx, size_t size);
extern void *_PyMemTrack_BaseCalloc(void *ctx, size_t nelem, size_t elsize);
extern void *_PyMemTrack_BaseRealloc(void *ctx, void *ptr, size_t size);
extern void _PyMemTrack_BaseFree(void *ctx, void *ptr);

/* PyMem_Raw*() for pymalloc's large requests, whose blocks belong to the
   object domain all the same.  (A call each: a flag set around the raw
   domain's call in obmalloc.c costs pymalloc's fast paths a register.) */
extern void *_PyMemTrack_FallbackMalloc(size_t size);
extern void *_PyMemTrack_FallbackCalloc(size_t nelem, size_t elsize);
extern void *_PyMemTrack_FallbackRealloc(void *ptr, size_t size);
extern void _PyMemTrack_FallbackFree(void *ptr);

/* A domain's allocator was set, with debug hooks (1) or without (0); or
   a wrapper, such as tracemalloc's, which keeps the layout of what it
   wraps. */
extern void _PyMemTrack_DebugHooks(PyMemAllocatorDomain domain, int hooks);
extern void _PyMemTrack_WrapperSet(PyMemAllocatorDomain domain,
                                   void *(*malloc)(void *ctx, size_t size));

/* Threads' frame data stacks, from the arena allocator (pystate.c). */
extern void _PyMemTrack_FrameStack(Py_ssize_t delta);

/* What the allocator reserved for a block of the mem or object domain; 0
   for NULL and for one the accounting does not count.  The second is for
   a block being claimed, which holds data: a pooled one is marked so. */
PyAPI_FUNC(size_t) _PyMem_ReservedSize(const void *ptr);
extern size_t _PyMemTrack_ClaimedSize(void *ptr);

/* An object is made: its block is an object's.  Out of line, for an
   object made elsewhere than in the block handed out last; and for one
   outside the pools, in the block the domain handed out. */
extern void _PyMemTrack_NewObjectSlow(PyObject *op);
extern void _PyMemTrack_NewLargeObject(void *block, PyObject *op);

/* Where the block pymalloc would have handed out for op starts: before the
   object by what its type puts there, and by the debug hooks' pad. */
static inline uintptr_t
_PyMemTrack_ObjectBlock(PyObject *op)
{
    return ((uintptr_t)op - _PyType_PreHeaderSize(Py_TYPE(op))
            - _Py_memtrack.hooks_pad);
}

static inline void
_PyMemTrack_NewObject(PyObject *op)
{
    /* The usual case: made in the block pymalloc handed out last, which
       stays unmarked.  An object found at the block's start needs no look
       at its type (an int, a str: most objects made): an object whose
       type puts a header before it cannot start there, as the header
       would then lie outside the block.  Nor does an object that gc_alloc()
       or _PyType_AllocNoTrack() named in its block's place.  With debug
       hooks, there is no block handed out last here (see
       _PyMemTrack_HooksHandedOut()). */
    uintptr_t last = _Py_memtrack.last_block;
    if ((uintptr_t)op == last
        || (uintptr_t)op - _PyType_PreHeaderSize(Py_TYPE(op)) == last)
    {
        _Py_memtrack.last_block = 0;
    }
    else {
        _PyMemTrack_NewObjectSlow(op);
    }
}

/* The block at `block` was just allocated for the object op, which its
   type's pre-header puts after the block's start (gc_alloc() and
   _PyType_AllocNoTrack()): if pymalloc handed it out last, op names it
   until _Py_NewReference(), which then finds the object there without a
   look at its type.  Called before _PyObject_GC_Link(), so that the block
   need not be kept across that call; the collection that call may start
   names the block by its start again (see
   _PyMemTrack_CollectionStarting()).  Nothing else between the two
   allocates or walks.  (last_block is a block start in
   its pool's layout of now, or an object named in the block just handed
   out: a pool is set up for another size only to hand out a block, whose
   hand-out replaces last_block, and an arena given back clears it.  Only
   inside that hand-out is it a block of the pool's last life, freed, which
   _PyMemTrack_PooledHandedOutSlow() so leaves unmarked.) */
static inline void
_PyMemTrack_NameObjectInBlock(void *block, PyObject *op)
{
    if ((uintptr_t)block == _Py_memtrack.last_block) {
        _Py_memtrack.last_block = (uintptr_t)op;
    }
}

/* _PyObject_GC_Link() starts a collection, which may allocate and walk,
   and so mark the block handed out last as data until its object is made
   (see _PyMemTrack_Unmark()): at its start, where the walk reads, not
   where the object is named in its place. */
extern void _PyMemTrack_CollectionStarting(void);

/* _Py_NewReference() for an object taken from a free list, whose block
   needs nothing: it was never freed, and is still an object's.  The
   generic path would find that out, but only after asking pymalloc
   whether the object is in a pool. */
extern void _Py_NewReferenceFromFreeList(PyObject *op);

/* The start of the block in pymalloc's pools that address p lies in, with
   the block's size in *size; 0 for an address outside the pools' blocks. */
extern uintptr_t _PyObject_PooledBlock(uintptr_t p, size_t *size);

/* Below this are the numbers of all the pools there can be now. */
extern size_t _PyMemTrack_PoolNumbers(void);

/* For sys.type_memory_usage(): visit each pool that has blocks allocated,
   with the span of its blocks that were ever handed out (each allocated,
   or stamped as freed), their size, and its state; and count the blocks
   in the pools.  The second visits one pool by its number (see
   _PyMemTrack_PoolNumber()), and clears its state if the pool is set up;
   it returns the blocks allocated there (0 for no pool, unvisited). */
typedef void (*_PyMemTrack_poolfunc)(uintptr_t first, uintptr_t end,
                                     size_t size, unsigned int state,
                                     void *arg);
extern Py_ssize_t _PyMemTrack_VisitPools(_PyMemTrack_poolfunc visit,
                                         void *arg);
extern Py_ssize_t _PyMemTrack_VisitPool(size_t number,
                                        _PyMemTrack_poolfunc visit,
                                        void *arg);

/* object.__class__ is about to be assigned. */
extern void _PyMemTrack_AssigningClass(PyObject *op);

/* A type is ready, or freed. */
extern void _PyMemTrack_AddType(PyTypeObject *type);
extern void _PyMemTrack_ForgetType(PyTypeObject *type);

/* A block of the mem or object domain that an object of `owner` owns.
   These are exported for the array module, which uses the inline
   functions below too. */
PyAPI_FUNC(void) _PyMemTrack_ClaimBlock(PyTypeObject *owner, void *ptr);
extern void _PyMemTrack_MoveBlock(PyTypeObject *from, PyTypeObject *to,
                                  void *ptr);
/* A claimed block of the mem or object domain is about to be freed or
   moved by the domain, whose free gives back only anonymous marks: its
   claim's mark is taken off.  Its start if pooled, else 0. */
extern uintptr_t _PyMemTrack_ClaimEnding(void *ptr);

/* pymalloc hands out a block for data that t claims (obmalloc.c's
   _PyMemTrack_ClaimedAlloc()).  It is marked as data at once: the block
   handed out last, which may yet become an object's, stays so.  Its
   change is noted after, where the pool is watched
   (_PyMemTrack_NoteHandOut(): a block that was free has nothing to look
   at), so that the call can be pymalloc's last. */
static inline void
_PyMemTrack_PooledClaimed(void *block, struct pool_header *pool,
                          _Py_memtally *t)
{
    assert(pool == _PyMemTrack_PoolOf((uintptr_t)block));
    size_t size = _PyMemTrack_PoolBlockSize(pool);
    assert(!_PyMemTrack_IsData((uintptr_t)block));
    _PyMemTrack_SetMark(pool, (uintptr_t)block);
    _PyMemTrack_Count(size);
    _PyMemTrack_Claim(t, (Py_ssize_t)size);
}

/* A block of the mem or object domain for an object of `owner`, claimed by
   t, the owner's tally (or by the tally made for it if t is NULL); zeroed
   if asked.  nbytes is at most PY_SSIZE_T_MAX: the callers below check,
   where the sizes are often constants. */
PyAPI_FUNC(void *) _PyMemTrack_ClaimedAlloc(PyMemAllocatorDomain domain,
                                            PyTypeObject *owner,
                                            _Py_memtally *t, size_t nbytes,
                                            int zeroed);

/* Free a block that t (if not NULL) claims, and give back to t what the
   allocator had reserved for it. */
PyAPI_FUNC(void) _PyMemTrack_ClaimedFree(PyMemAllocatorDomain domain,
                                         _Py_memtally *t, void *ptr);

/* Buffers an object owns, from the mem domain, counted under `owner`. */
static inline void *
_PyMem_OwnedMalloc(PyTypeObject *owner, size_t size)
{
    if (size > (size_t)PY_SSIZE_T_MAX) {
        return NULL;
    }
    return _PyMemTrack_ClaimedAlloc(PYMEM_DOMAIN_MEM, owner,
                                    _PyMemTrack_TallyOf(owner), size, 0);
}

static inline void *
_PyMem_OwnedCalloc(PyTypeObject *owner, size_t nelem, size_t elsize)
{
    if (elsize != 0 && nelem > (size_t)PY_SSIZE_T_MAX / elsize) {
        return NULL;
    }
    return _PyMemTrack_ClaimedAlloc(PYMEM_DOMAIN_MEM, owner,
                                    _PyMemTrack_TallyOf(owner),
                                    nelem * elsize, 1);
}

PyAPI_FUNC(void *) _PyMem_OwnedRealloc(PyTypeObject *owner, void *ptr,
                                        size_t size);

static inline void
_PyMem_OwnedFree(PyTypeObject *owner, void *ptr)
{
    _PyMemTrack_ClaimedFree(PYMEM_DOMAIN_MEM, _PyMemTrack_TallyOf(owner), ptr);
}

/* The same, from the object domain. */
static inline void *
_PyObject_OwnedMalloc(PyTypeObject *owner, size_t size)
{
    if (size > (size_t)PY_SSIZE_T_MAX) {
        return NULL;
    }
    return _PyMemTrack_ClaimedAlloc(PYMEM_DOMAIN_OBJ, owner,
                                    _PyMemTrack_TallyOf(owner), size, 0);
}

extern void *_PyObject_OwnedRealloc(PyTypeObject *owner, void *ptr,
                                    size_t size);

static inline void
_PyObject_OwnedFree(PyTypeObject *owner, void *ptr)
{
    _PyMemTrack_ClaimedFree(PYMEM_DOMAIN_OBJ, _PyMemTrack_TallyOf(owner), ptr);
}

/* For the heap scanner: call visit on each object made in a block of the
   mem or object domain (not one made in static memory, or in memory of
   its own), with the GIL held, until it returns nonzero; its last return.
   visit may allocate only from the raw domain, and must free no object:
   the pools and the table of large blocks are read as it goes. */
PyAPI_FUNC(int) _PyMemTrack_VisitObjects(
    int (*visit)(PyObject *op, void *arg), void *arg);

/* For the heap scanner, which sizes each object with the blocks it owns:
   how to find those of `type`'s objects, for a type whose blocks no core
   type's layout tells of (a module's).  Subclasses made later inherit
   it. */
PyAPI_FUNC(void) _PyMemTrack_SetOwnedBytes(PyTypeObject *type,
                                           _PyMemTrack_OwnedBytesFunc func);

/* The function set for `type` or inherited, or NULL. */
static inline _PyMemTrack_OwnedBytesFunc
_PyMemTrack_OwnedBytesOf(PyTypeObject *type)
{
    _Py_memtally *t = _PyMemTrack_TableTally(type);
    return t != NULL ? t->owned_bytes : NULL;
}

/* sys.total_memory_used(), for the profilers too. */
PyAPI_FUNC(Py_ssize_t) _PyMemTrack_TotalBytes(void);

/* The tags of sys.type_memory_usage() that hold the most bytes, largest
   first, types of one name summed: at most n of them, into top; how many,
   or -1 without memory (no exception set).  For the sampling
   profiler, which reads them at a check point of the eval loop: with the
   GIL held, and no Python object made.  A name stays valid while the GIL
   is held. */
typedef struct {
    const char *name;
    Py_ssize_t bytes;
} _PyMemTrack_TagBytes;
PyAPI_FUNC(Py_ssize_t) _PyMemTrack_TopTags(_PyMemTrack_TagBytes *top,
                                           Py_ssize_t n);

/* Add sys.total_memory_used() and the other sys functions to sys. */
extern int _PyMemTrack_AddSysFunctions(PyObject *sysmod);

#else

#  define _Py_NewReferenceFromFreeList(op) _Py_NewReference(op)
#  define _PyMemTrack_AddSysFunctions(sysmod) 0
#  define _PyMemTrack_ClaimBlock(owner, ptr) ((void)0)
#  define _PyMemTrack_MoveBlock(from, to, ptr) ((void)0)
#  define _PyMem_OwnedMalloc(owner, size) PyMem_Malloc(size)
#  define _PyMem_OwnedCalloc(owner, nelem, elsize) PyMem_Calloc(nelem, elsize)
#  define _PyMem_OwnedRealloc(owner, ptr, size) PyMem_Realloc(ptr, size)
#  define _PyMem_OwnedFree(owner, ptr) PyMem_Free(ptr)
#  define _PyObject_OwnedMalloc(owner, size) PyObject_Malloc(size)
#  define _PyObject_OwnedRealloc(owner, ptr, size) PyObject_Realloc(ptr, size)
#  define _PyObject_OwnedFree(owner, ptr) PyObject_Free(ptr)

#endif  /* Py_TRACK_MEMORY */

/* PyMem_NEW() and PyMem_RESIZE() for buffers an object owns. */
#define _PyMem_OwnedNew(owner, type, n) \
    ((size_t)(n) > PY_SSIZE_T_MAX / sizeof(type) ? NULL \
     : (type *)_PyMem_OwnedMalloc((owner), (n) * sizeof(type)))
#define _PyMem_OwnedResize(owner, p, type, n) \
    ((p) = ((size_t)(n) > PY_SSIZE_T_MAX / sizeof(type) ? NULL \
            : (type *)_PyMem_OwnedRealloc((owner), (p), (n) * sizeof(type))))

#ifdef __cplusplus
}
#endif
#endif  /* !Py_INTERNAL_MEMTRACK_H */
