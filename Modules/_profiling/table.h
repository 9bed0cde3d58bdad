/* The profilers' hash tables: open addressing (linear probing) over int32
   indexes into an array of the caller's, stored plus one so that zero is
   an empty slot.  The caller hashes and compares its own entries; the
   table only keeps their indexes.

   Memory comes from the raw domain, unless the includer names other
   functions (the sampling profiler: see sampling.c). */

#ifndef SIGHTGLASS_PROFILING_TABLE_H
#define SIGHTGLASS_PROFILING_TABLE_H

#include "Python.h"

#ifndef TABLE_CALLOC
#  define TABLE_CALLOC PyMem_RawCalloc
#  define TABLE_FREE PyMem_RawFree
#endif

typedef struct {
    int32_t *slots;
    uint32_t mask;
    uint32_t used;
} IndexTable;

/* A hash of a pointer and up to 64 more bits (multiplicative hashing,
   with splitmix64's constants). */
static inline uint32_t
table_hash(const void *pointer, uint64_t more)
{
    uint64_t x = ((uint64_t)(uintptr_t)pointer >> 4)
                 ^ (more * 0x9E3779B97F4A7C15ull);
    x *= 0xBF58476D1CE4E5B9ull;
    return (uint32_t)(x >> 32);
}

/* Makes room for one more entry, keeping the table at most `quarters`
   quarters full; `hash_of` gives the hash of an index.  0, or -1 when out
   of memory. */
static int
table_reserve(IndexTable *table, int quarters, void *owner,
              uint32_t (*hash_of)(void *, int32_t))
{
    if (table->slots != NULL
        && ((uint64_t)table->used + 1) * 4
           <= ((uint64_t)table->mask + 1) * quarters)
    {
        return 0;
    }
    if (table->mask >= UINT32_MAX / 4) {
        return -1;
    }
    uint32_t size = table->slots == NULL ? 64 : (table->mask + 1) * 2;
    int32_t *slots = TABLE_CALLOC(size, sizeof(int32_t));
    if (slots == NULL) {
        return -1;
    }
    for (uint32_t i = 0; table->slots != NULL && i <= table->mask; i++) {
        int32_t entry = table->slots[i];
        if (entry != 0) {
            uint32_t j = hash_of(owner, entry - 1) & (size - 1);
            while (slots[j] != 0) {
                j = (j + 1) & (size - 1);
            }
            slots[j] = entry;
        }
    }
    TABLE_FREE(table->slots);
    table->slots = slots;
    table->mask = size - 1;
    return 0;
}

/* The index, among those of `hash`, that `matches` says has `key`, or -1.
   Inlined where it is called, with its `matches`. */
static inline int32_t
table_find(IndexTable *table, uint32_t hash, void *owner, const void *key,
           int (*matches)(void *, int32_t, const void *))
{
    if (table->slots == NULL) {
        return -1;
    }
    for (uint32_t i = hash & table->mask; ; i = (i + 1) & table->mask) {
        int32_t entry = table->slots[i];
        if (entry == 0) {
            return -1;
        }
        if (matches(owner, entry - 1, key)) {
            return entry - 1;
        }
    }
}

/* Adds `index` of `hash`, where table_reserve() made room. */
static void
table_add(IndexTable *table, uint32_t hash, int32_t index)
{
    uint32_t i = hash & table->mask;
    while (table->slots[i] != 0) {
        i = (i + 1) & table->mask;
    }
    table->slots[i] = index + 1;
    table->used++;
}

static void
table_clear(IndexTable *table)
{
    TABLE_FREE(table->slots);
    table->slots = NULL;
    table->mask = 0;
    table->used = 0;
}

#endif  /* !SIGHTGLASS_PROFILING_TABLE_H */
