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
   _Py_NewReference() only marks where an object starts, in a bitmap in the
   header of its pymalloc pool (or, for the few objects outside the pools,
   in a table), and sys.type_memory_usage() walks the marks and reads each
   object's type then.  So the hot paths never touch a type, neither a
   __class__ assignment nor a free list needs bookkeeping, and a block
   counts as an object's exactly as long as it is allocated.  Buffers an
   object owns (list items, dict tables, ...) are fewer: their owners claim
   them for their type's tally.  The anonymous tag is what no one has
   marked or claimed.

   The marks are kept lazily, so that an int made and dropped in a loop
   costs little more than its two trips through pymalloc.  A free leaves the
   map alone and stamps the block instead; a walk skips stamped blocks.  A
   block handed out again usually gets an object where its last one
   started, and finds the mark already there.  Otherwise the map is put
   right by whoever comes next: _Py_NewReference() rewrites the block's
   marks, and if no object is made in it, its owner's claim, the next
   allocation or the walk clears them.  So the marks of every allocated
   block but the one handed out last are exact, and no block's head ever
   has more than one mark. */

#ifdef Py_TRACK_MEMORY

#include "pycore_atomic.h"        // _Py_atomic_address

/* A note on layout.  Fields that one function writes are never
   neighbours: GCC would combine two such stores into one 16-byte vector
   store, and on the AMD machines we measure on, a word load cannot take
   its value from a vector store still in flight.  Each such load then
   waits for the store to reach the cache (measured: a fifth of the time
   of an int-heavy loop). */

/* What a type's objects own, or what a name given to the tracked-malloc
   API holds; and, while sys reads them, the type's objects.  A type's
   tally hangs from its tp_cache, which CPython 3.11 leaves unused. */
typedef struct _Py_memtally {
    Py_ssize_t bytes;
    Py_ssize_t blocks;
    Py_ssize_t object_bytes;
    Py_ssize_t objects;
    PyTypeObject *type;             /* NULL for a name */
    char *name;                     /* a name's own copy */
    struct _Py_memtally *prev, *next;
} _Py_memtally;

/* What the mem and object domains hold, and what the allocator tells the
   accounting: used with the GIL held only. */
struct _Py_memtrack_locked {
    Py_ssize_t bytes;
    /* Above this, the peak may have to move. */
    _Py_atomic_address peak_watermark;
    /* The block pymalloc handed out last, until an object is made in it.
       Its marks are from its earlier life. */
    uintptr_t last_block;
};
PyAPI_DATA(struct _Py_memtrack_locked) _Py_memtrack;

/* pymalloc's pools, as the object marks see them (obmalloc.c checks that
   they agree): 16 KiB, aligned, of 16-byte granules.  The header ends with
   a map of a bit for each granule; the map's first byte would only cover
   the header itself, and is left out. */
#define _PyMemTrack_POOL_SIZE (1 << 14)
#define _PyMemTrack_POOL_MASK ((uintptr_t)_PyMemTrack_POOL_SIZE - 1)
#define _PyMemTrack_GRANULE_SHIFT 4
#define _PyMemTrack_SZIDX_OFFSET 36
#define _PyMemTrack_MAP_OFFSET 48
#define _PyMemTrack_MAP_BYTES 128
/* An object starts within this many granules of its block (its head):
   after the debug hooks' pad, the GC header and the managed dict's two
   pointers. */
#define _PyMemTrack_HEAD_GRANULES 4
#define _PyMemTrack_HEAD_BYTES \
    (_PyMemTrack_HEAD_GRANULES << _PyMemTrack_GRANULE_SHIFT)

/* What pymalloc's free writes into a block's second word.  No block that
   holds an object has it there: the word is the object's type, the GC
   header's prev link (a pointer, or a count shifted by two, with two flag
   bits), the managed dict, or the debug hooks' pad; and the stamp is above
   every address and count. */
#define _PyMemTrack_FREED ((uintptr_t)-5)

/* Where the map holds the bit of p's granule: the bit's byte, and its
   place there.  A block's head lies in the two bytes from its start's. */
static inline uint8_t *
_PyMemTrack_MapByte(uintptr_t p, unsigned int *bit)
{
    *bit = (p >> _PyMemTrack_GRANULE_SHIFT) % 8;
    return (uint8_t *)((p & ~_PyMemTrack_POOL_MASK)
                       + _PyMemTrack_MAP_OFFSET - 1
                       + ((p & _PyMemTrack_POOL_MASK)
                          >> (_PyMemTrack_GRANULE_SHIFT + 3)));
}

/* Whether an object is marked as starting at p. */
static inline int
_PyMemTrack_Marked(uintptr_t p)
{
    unsigned int bit;
    return (*_PyMemTrack_MapByte(p, &bit) >> bit) & 1;
}

/* The block size of a size class: pymalloc's INDEX2SIZE(szidx). */
static inline size_t
_PyMemTrack_ClassSize(unsigned int szidx)
{
    return ((size_t)szidx + 1) << _PyMemTrack_GRANULE_SHIFT;
}

/* How many granules the head of a block of size class szidx has. */
static inline unsigned int
_PyMemTrack_HeadGranules(unsigned int szidx)
{
    return (szidx < _PyMemTrack_HEAD_GRANULES
            ? szidx + 1 : _PyMemTrack_HEAD_GRANULES);
}

/* The size class of a block in a pool, from its pool's header. */
static inline unsigned int
_PyMemTrack_PooledClass(uintptr_t block)
{
    unsigned int szidx;
    memcpy(&szidx, (const void *)((block & ~_PyMemTrack_POOL_MASK)
                                  + _PyMemTrack_SZIDX_OFFSET),
           sizeof(szidx));
    return szidx;
}

/* The blocks whose heads were marked last, and the object each one's head
   marks (0 for none), by where the block lies in its pool: a block handed
   out again is mostly one of these, so _Py_NewReference() can see that its
   mark is right without reading the map.  Blocks and objects are kept
   apart so that no two of the words one function stores are neighbours
   (see the note on layout above). */
#define _PyMemTrack_RECENT 128
struct _Py_memtrack_recent {
    uintptr_t block[_PyMemTrack_RECENT];
    uintptr_t object[_PyMemTrack_RECENT];
};
PyAPI_DATA(struct _Py_memtrack_recent) _Py_memtrack_recent;

static inline size_t
_PyMemTrack_RecentSlot(uintptr_t block)
{
    return (block >> _PyMemTrack_GRANULE_SHIFT) % _PyMemTrack_RECENT;
}

/* The head of a block marks op (0: none), as the table will tell. */
static inline void
_PyMemTrack_Remember(uintptr_t block, uintptr_t op)
{
    size_t slot = _PyMemTrack_RecentSlot(block);
    _Py_memtrack_recent.block[slot] = block;
    _Py_memtrack_recent.object[slot] = op;
}

/* Write the head of a block, of so many granules: `marks` has the bit of
   the granule, counted from the block's start, where its object starts, or
   none. */
static inline void
_PyMemTrack_WriteHead(uintptr_t block, unsigned int granules,
                      unsigned int marks)
{
    unsigned int bit;
    uint8_t *byte = _PyMemTrack_MapByte(block, &bit);
    uint16_t pair;
    memcpy(&pair, byte, sizeof(pair));
    pair &= (uint16_t)~(((1u << granules) - 1) << bit);
    pair |= (uint16_t)(marks << bit);
    memcpy(byte, &pair, sizeof(pair));
}

/* Mark the head of a block, of so many granules, with one object, op. */
static inline void
_PyMemTrack_MarkHead(uintptr_t block, unsigned int granules, uintptr_t op)
{
    _PyMemTrack_WriteHead(block, granules,
                          1u << ((op - block) >> _PyMemTrack_GRANULE_SHIFT));
    _PyMemTrack_Remember(block, op);
}

/* A pool is set up for a size class: the marks left are for another. */
static inline void
_PyMemTrack_ClearPool(uintptr_t pool)
{
    memset((void *)(pool + _PyMemTrack_MAP_OFFSET), 0,
           _PyMemTrack_MAP_BYTES);
    for (size_t i = 0; i < _PyMemTrack_RECENT; i++) {
        if ((_Py_memtrack_recent.block[i] & ~_PyMemTrack_POOL_MASK)
            == pool)
        {
            _Py_memtrack_recent.object[i] = 0;
        }
    }
}

/* No object was made in the block handed out last, of size class szidx:
   clear its head.  Mostly nothing marks it (it held no object before
   either), and then the map is left alone; so is the table, which tells
   of no mark the map does not have. */
static inline void
_PyMemTrack_ForgetBlock(uintptr_t block, unsigned int szidx)
{
    unsigned int granules = _PyMemTrack_HeadGranules(szidx);
    unsigned int bit;
    uint16_t pair;
    memcpy(&pair, _PyMemTrack_MapByte(block, &bit), sizeof(pair));
    if ((pair >> bit) & ((1u << granules) - 1)) {
        _PyMemTrack_WriteHead(block, granules, 0);
        _PyMemTrack_Remember(block, 0);
    }
    _Py_memtrack.last_block = 0;
}

static inline void
_PyMemTrack_ForgetLastBlock(void)
{
    uintptr_t last = _Py_memtrack.last_block;
    if (last != 0) {
        _PyMemTrack_ForgetBlock(last, _PyMemTrack_PooledClass(last));
    }
}

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

/* Count a block handed out; whether the peak may have to move. */
static inline int
_PyMemTrack_CountPassesWatermark(size_t size)
{
    _Py_memtrack.bytes += (Py_ssize_t)size;
    return ((size_t)_Py_memtrack.bytes
            > _Py_atomic_load_relaxed(&_Py_memtrack.peak_watermark));
}

/* Called by every allocator of the mem and object domains for a block it
   hands out... */
static inline void
_PyMemTrack_Count(size_t size)
{
    if (_PyMemTrack_CountPassesWatermark(size)) {
        _PyMemTrack_NotePeak();
    }
}

/* ...by pymalloc, for a block it serves a request of nbytes with, and
   which hands out what this returns: the block.  (So pymalloc keeps no
   more across a call than the request it already keeps.) */
extern void *_PyMemTrack_NotePeakFor(void *block);
/* The same, once the block handed out before, in which no object was
   made, is forgotten: out of line, so that the usual case keeps no more
   registers than pymalloc's own. */
extern void *_PyMemTrack_ForgetThenAlloc(void *block, size_t nbytes);

static inline void *
_PyMemTrack_Alloc(void *block, size_t nbytes)
{
    if (_Py_memtrack.last_block != 0) {
        return _PyMemTrack_ForgetThenAlloc(block, nbytes);
    }
    _Py_memtrack.last_block = (uintptr_t)block;
    if (_PyMemTrack_CountPassesWatermark(_Py_SIZE_ROUND_UP(
            nbytes, (size_t)1 << _PyMemTrack_GRANULE_SHIFT)))
    {
        return _PyMemTrack_NotePeakFor(block);
    }
    return block;
}

/* ...and by all of them when they free a block. */
static inline void
_PyMemTrack_Free(size_t size)
{
    _Py_memtrack.bytes -= (Py_ssize_t)size;
}

/* pymalloc frees a block of size class szidx: whatever object started in
   it is gone, though its mark stays. */
static inline void
_PyMemTrack_FreePooled(void *block, unsigned int szidx)
{
    _PyMemTrack_Free(_PyMemTrack_ClassSize(szidx));
    ((uintptr_t *)block)[1] = _PyMemTrack_FREED;
}

/* Blocks of the mem and object domains that pymalloc does not serve, as
   the domain hands them out (inside any debug hooks). */
extern void _PyMemTrack_AllocLarge(void *block, size_t size);
extern void _PyMemTrack_FreeLarge(void *block, size_t size);
/* What malloc() reserved for such a block; 0 for one not counted. */
extern size_t _PyMemTrack_LargeSize(void *block);

extern void _PyMemTrack_AllocRaw(size_t size);
extern void _PyMemTrack_FreeRaw(size_t size);

/* Threads' frame data stacks, from the arena allocator (pystate.c). */
extern void _PyMemTrack_FrameStack(Py_ssize_t delta);

/* What the allocator reserved for a block of the mem or object domain; 0
   for one the accounting does not count. */
extern size_t _PyMem_ReservedSize(void *ptr);

/* Objects: mark where one starts.  Marking twice is harmless, so a
   resized object is simply marked again. */
extern void _PyMemTrack_NewObjectSlow(PyObject *op);
extern void _PyMemTrack_NewLargeObject(void *block, PyObject *op);

static inline void
_PyMemTrack_NewObject(PyObject *op)
{
    /* The usual case: an object made in the block pymalloc handed out
       last, where the block's last object started too, and that block was
       marked recently. */
    uintptr_t last = _Py_memtrack.last_block;
    size_t slot = _PyMemTrack_RecentSlot(last);
    if (_Py_memtrack_recent.object[slot] == (uintptr_t)op
        && _Py_memtrack_recent.block[slot] == last)
    {
        assert(_PyMemTrack_Marked((uintptr_t)op));
        _Py_memtrack.last_block = 0;
    }
    else {
        _PyMemTrack_NewObjectSlow(op);
    }
}

/* _Py_NewReference() for an object taken from a free list, which needs no
   mark: its block was never freed, so the mark of its first life stands.
   The generic path would find that out, but only after asking pymalloc
   whether the object is in a pool. */
extern void _Py_NewReferenceFromFreeList(PyObject *op);

/* For sys.type_memory_usage(): visit every object in the pools with the
   size of its block, and count the blocks in the pools. */
typedef void (*_PyMemTrack_visitfunc)(PyObject *op, size_t size, void *arg);
extern Py_ssize_t _PyMemTrack_VisitPooled(_PyMemTrack_visitfunc visit,
                                          void *arg);

/* A type is ready, or freed. */
extern void _PyMemTrack_AddType(PyTypeObject *type);
extern void _PyMemTrack_ForgetType(PyTypeObject *type);

/* A block of the mem or object domain that an object of `owner` owns.
   These are exported for the array module, which uses the inline
   functions below too. */
PyAPI_FUNC(void) _PyMemTrack_ClaimBlock(PyTypeObject *owner, void *ptr);
extern void _PyMemTrack_MoveBlock(PyTypeObject *from, PyTypeObject *to,
                                  void *ptr);

/* A block just allocated for an object of `owner`, if the allocator gave
   one.  The usual case, a block pymalloc has just handed out to a type
   that already has a tally, is done here. */
static inline void *
_PyMemTrack_ClaimNew(PyTypeObject *owner, void *ptr)
{
    _Py_memtally *t = (_Py_memtally *)owner->tp_cache;
    if ((uintptr_t)ptr == _Py_memtrack.last_block && ptr != NULL
        && t != NULL)
    {
        unsigned int szidx = _PyMemTrack_PooledClass((uintptr_t)ptr);
        _PyMemTrack_Claim(t, (Py_ssize_t)_PyMemTrack_ClassSize(szidx));
        /* No object is made in a buffer: its head can be put right now,
           while its pool's header is at hand. */
        _PyMemTrack_ForgetBlock((uintptr_t)ptr, szidx);
    }
    else if (ptr != NULL) {
        _PyMemTrack_ClaimBlock(owner, ptr);
    }
    return ptr;
}

/* Free a block that t (if not NULL) claims.  Whichever allocator frees
   it takes what it had reserved off the count, and t gives back as much;
   so the free of every other block has nothing to look up. */
static inline void
_PyMemTrack_FreeClaimed(_Py_memtally *t, void *ptr, void (*release)(void *))
{
    Py_ssize_t before = _Py_memtrack.bytes;
    release(ptr);
    Py_ssize_t freed = before - _Py_memtrack.bytes;
    if (t != NULL && freed > 0) {
        _PyMemTrack_Unclaim(t, freed);
    }
}

/* Buffers an object owns, from the mem domain, counted under `owner`. */
static inline void *
_PyMem_OwnedMalloc(PyTypeObject *owner, size_t size)
{
    return _PyMemTrack_ClaimNew(owner, PyMem_Malloc(size));
}

static inline void *
_PyMem_OwnedCalloc(PyTypeObject *owner, size_t nelem, size_t elsize)
{
    return _PyMemTrack_ClaimNew(owner, PyMem_Calloc(nelem, elsize));
}

PyAPI_FUNC(void *) _PyMem_OwnedRealloc(PyTypeObject *owner, void *ptr,
                                        size_t size);

static inline void
_PyMem_OwnedFree(PyTypeObject *owner, void *ptr)
{
    _PyMemTrack_FreeClaimed((_Py_memtally *)owner->tp_cache, ptr,
                            PyMem_Free);
}

/* The same, from the object domain. */
static inline void *
_PyObject_OwnedMalloc(PyTypeObject *owner, size_t size)
{
    return _PyMemTrack_ClaimNew(owner, PyObject_Malloc(size));
}

extern void *_PyObject_OwnedRealloc(PyTypeObject *owner, void *ptr,
                                    size_t size);

static inline void
_PyObject_OwnedFree(PyTypeObject *owner, void *ptr)
{
    _PyMemTrack_FreeClaimed((_Py_memtally *)owner->tp_cache, ptr,
                            PyObject_Free);
}

/* For sys: totals, peak, and the tags as a dict. */
extern Py_ssize_t _PyMemTrack_TotalBytes(void);
extern Py_ssize_t _PyMemTrack_TotalBlocks(void);
extern Py_ssize_t _PyMemTrack_PeakBytes(void);
extern void _PyMemTrack_ResetPeak(void);
extern PyObject *_PyMemTrack_Usage(int blocks, int by_type);

#else

#  define _Py_NewReferenceFromFreeList(op) _Py_NewReference(op)
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

#ifdef __cplusplus
}
#endif
#endif  /* !Py_INTERNAL_MEMTRACK_H */
