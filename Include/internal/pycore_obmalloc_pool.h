#ifndef Py_INTERNAL_OBMALLOC_POOL_H
#define Py_INTERNAL_OBMALLOC_POOL_H
#ifdef __cplusplus
extern "C" {
#endif

#ifndef Py_BUILD_CORE
#  error "this header requires Py_BUILD_CORE define"
#endif

/* pymalloc's pools, as obmalloc.c lays them out (it checks that these
   agree with its own settings) and as memory tracking (pycore_memtrack.h)
   reads them in place: a pool's size class, and the marks the tracking
   keeps in its header.  Arenas hold pools, and pools hold blocks in
   multiples of a granule. */
#if SIZEOF_VOID_P > 4
#  define _PyObmalloc_ARENA_BITS 20
#  define _PyObmalloc_POOL_BITS 14
#  define _PyObmalloc_GRANULE_SHIFT 4
#else
#  define _PyObmalloc_ARENA_BITS 18
#  define _PyObmalloc_POOL_BITS 12
#  define _PyObmalloc_GRANULE_SHIFT 3
#endif

struct pool_header {
    union {
        uint8_t *_padding;
        unsigned int count;
    } ref;                          /* blocks handed out */
    uint8_t *freeblock;             /* head of the free list */
    struct pool_header *nextpool;   /* next pool of the same size class */
    struct pool_header *prevpool;   /* previous one */
    unsigned int arenaindex;        /* the arena's index in arenas */
    unsigned int szidx;             /* size class of the blocks */
    unsigned int nextoffset;        /* offset of the first untouched block */
    unsigned int maxnextoffset;     /* the largest nextoffset can be */
#ifdef Py_TRACK_MEMORY
    /* A bit for each granule: whether the block starting there holds
       data.  No block starts in the granules the header covers: two of
       their bits say whether what the pool's blocks hold may have changed
       since the tracking's walk last looked into it (pycore_memtrack.h). */
    uint64_t memtrack_map[(1 << _PyObmalloc_POOL_BITS)
                          >> (_PyObmalloc_GRANULE_SHIFT + 6)];
#endif
};

#ifdef __cplusplus
}
#endif
#endif /* !Py_INTERNAL_OBMALLOC_POOL_H */
