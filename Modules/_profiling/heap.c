/* The heap scanner behind profiling.heap: the _heap module.

   A scan walks the object graph breadth first from its roots, through
   tp_traverse, and makes one record per object: its address, size and
   type, and the indexes of the records of its children.  The records are
   the queue: a record is processed (its type's rule looked up, its size
   taken, its children found and recorded if new) when the walk reaches
   it, so the edges of the records lie in their order, each record's from
   its first_edge to the next one's (a compressed sparse row), and no C
   recursion is needed.  An open addressing table finds a record by
   address.  Nothing is allocated in the object domains per object: a
   record is 16 bytes, an edge 4, a table slot 4, all from the raw domain.

   While it scans, the scanner holds a reference to every object it
   recorded, so that no object it still has to visit is freed if a rule
   runs Python code (which may let other threads run); the references go
   at the end.  The collector is disabled meanwhile.

   Roots are record 0, "(roots)": sys.modules, the frames of every thread
   (as records of their own, as is each thread), the caller's roots, the
   builtins' dict, and "(held from C)": once the walk from the others is
   done, the objects the collector tracks that were not reached are
   checked as the collector does, by subtracting from their reference
   counts the references they hold among themselves.  Those with
   references left are held from outside, by C code; the walk goes on from
   them.  What is left is garbage: counted, not recorded.

   A snapshot keeps its records, edges and table, a name for each type,
   and an id for each record that stays the same from one snapshot to
   the next while the object lives: a record takes the id of the record
   at its address in the snapshot before, when that one was of the same
   type.  Dominators, retained sizes and predecessors are computed when
   first asked for. */

#ifndef Py_BUILD_CORE_BUILTIN
#  define Py_BUILD_CORE_MODULE 1
#endif

#include "Python.h"
#include "pycore_code.h"          // _PyCode_CODE()
#include "pycore_dict.h"          // PyDictKeysObject
#include "pycore_frame.h"         // _PyInterpreterFrame
#include "pycore_gc.h"            // PyGC_Head
#include "pycore_interp.h"        // PyInterpreterState.gc
#include "pycore_memtrack.h"      // _PyMem_ReservedSize()
#include "pycore_moduleobject.h"  // PyModuleObject
#include "pycore_monitoring.h"    // _PyMonitoring_CodeDataBytes()
#include "pycore_object.h"        // _PyType_PreHeaderSize()
#include "pycore_obmalloc_pool.h" // _PyObmalloc_GRANULE_SHIFT
#include "pycore_pystate.h"       // _PyThreadState_GET()
#include "table.h"

#include <stdio.h>
#include <time.h>
#include <unistd.h>

/* A record's type word: the index of its type's name, and whether the
   record stands for no object (a thread, a frame, a group of roots). */
#define VIRTUAL_FLAG (1u << 31)
#define TYPE_INDEX(word) ((word) & ~VIRTUAL_FLAG)

/* 16 bytes, as the records are most of a snapshot's memory.  The address
   in two parts keeps the record 4-byte aligned: user-space addresses fit
   48 bits (x86-64, and arm64 unless a program asks mmap() for more).  A
   size of 64 KiB or more, which few objects have, is kept in
   `big_sizes`. */
typedef struct {
    uint32_t address_low;   /* the object's address; a virtual record's */
    uint16_t address_high;  /* index in `virtuals` */
    uint16_t size;
    uint32_t type;
    uint32_t first_edge;
} Record;

#define ADDRESS_BITS 48
#define BIG_SIZE UINT16_MAX

typedef struct {
    uint32_t record;
    uint64_t size;
} BigSize;

/* What an object is to the one that refers to it (a dict's key, a
   variable's name), for the edges that have a name. */
typedef struct {
    uint32_t edge;
    uint32_t name;      /* in edge_names */
} NamedEdge;

static inline uintptr_t
record_address(const Record *r)
{
    return (uintptr_t)(((uint64_t)r->address_high << 32) | r->address_low);
}

/* The children of a virtual record: `count` items from `first`. */
typedef struct {
    uint32_t first;
    uint32_t count;
} Virtual;

/* An item of a virtual record: an object (a reference held), or another
   virtual record, as its index shifted left and tagged with 1. */
typedef uintptr_t Item;
#define ITEM_OF_RECORD(index) (((uintptr_t)(index) << 1) | 1)

/* The table also finds the objects folded into their owner's record (an
   instance's __dict__): those are the entries from ALIAS_BASE on. */
#define ALIAS_BASE (1 << 30)
#define MAX_RECORDS ALIAS_BASE

typedef struct {
    uintptr_t address;
    int32_t record;
} Alias;

/* How an object's size is taken by default (sys.getsizeof's answer,
   computed here for the types whose __sizeof__ we know). */
enum {
    SIZER_OBJECT,       /* object.__sizeof__ */
    SIZER_LIST,
    SIZER_DICT,
    SIZER_SET,
    SIZER_STR,
    SIZER_INT,
    SIZER_BYTEARRAY,
    SIZER_CALL,         /* a __sizeof__ of its own: called */
    SIZERS
};

/* The names of the edges from the root and from frames. */
enum {
    NAME_SYS_MODULES, NAME_BUILTINS, NAME_FUNCTION, NAME_CODE, NAME_GLOBALS,
    NAME_FRAME_BUILTINS, NAME_LOCALS, NAME_FRAME_OBJECT, NAMES
};
static const char *const name_texts[NAMES] = {
    [NAME_SYS_MODULES] = "sys.modules",
    [NAME_BUILTINS] = "builtins",
    [NAME_FUNCTION] = "f_func",
    [NAME_CODE] = "f_code",
    [NAME_GLOBALS] = "f_globals",
    [NAME_FRAME_BUILTINS] = "f_builtins",
    [NAME_LOCALS] = "f_locals",
    [NAME_FRAME_OBJECT] = "frame",
};
static PyObject *names[NAMES];

/* Each sizer's __sizeof__ method, read from the type it is defined by. */
static PyCFunction known_sizeof[SIZER_CALL];

/* How a type's objects are sized: one of the above, and on a tracking
   build how to find the blocks they own if a module's type says. */
typedef struct {
    int kind;
#ifdef Py_TRACK_MEMORY
    _PyMemTrack_OwnedBytesFunc owned_bytes;
#endif
} Sizer;

typedef struct {
    PyObject *key;          /* the type, or a virtual record's name */
    PyObject *name;
    PyObject *rule;         /* (size, children), or NULL: the defaults */
    Sizer sizer;
} TypeEntry;

typedef struct {
    uintptr_t address;
    PyObject *rule;
} ObjectRule;

typedef struct {
    PyObject_HEAD
    Record *records;
    uint32_t nrecords;
    uint32_t records_capacity;
    int32_t *edges;
    uint32_t nedges;
    uint32_t edges_capacity;
    uint32_t *ids;
    /* Records (and aliases) by address. */
    int32_t *lookup;
    uint32_t lookup_slots;
    uint32_t lookup_used;
    size_t peak_bytes;          /* what the scan held at its end */
    int64_t total_memory;       /* sys.total_memory_used() then, or -1 */
    Alias *aliases;
    uint32_t naliases;
    uint32_t aliases_capacity;
    /* By record, in order. */
    BigSize *big_sizes;
    uint32_t nbig_sizes;
    uint32_t big_sizes_capacity;
    /* By edge, in order. */
    NamedEdge *named_edges;
    uint32_t nnamed_edges;
    uint32_t named_edges_capacity;
    PyObject *edge_names;       /* list of str */
    PyObject *type_names;       /* list of str */
    uintptr_t *type_addresses;  /* the type's address; 0 for a name */
    uint32_t type_addresses_capacity;
    long pid;
    double seconds;
    uint64_t unreachable_objects;
    uint64_t unreachable_bytes;
    uint32_t held_from_c;
    /* Computed when first asked for. */
    uint32_t *pred_start;       /* nrecords + 1 */
    int32_t *preds;
    int32_t *idom;
    uint64_t *retained;
} SnapshotObject;

/* The snapshot taken last, whose ids the next one takes over (cleared
   when it goes), and the next id to give: odd, as DevTools' object ids
   are. */
static SnapshotObject *last_snapshot;
static uint32_t next_id = 1;
/* The thread whose scan runs, if any: a rule may not start another, and
   other threads wait for it to end. */
static PyThreadState *scanning;
static PyThread_type_lock scan_lock;

/* The objects recorded and folded so far, as a bit for each grain of
   memory an object can start at, by 1 MiB region: no two objects start
   on one grain, and most objects are in few regions.  The walk asks it
   before the table: most objects it meets are new, and the set says so
   from far less memory than the table's probes read.  The search for
   objects not reached asks it of most objects. */
#define REGION_SHIFT 20
#define REGION_BITS ((size_t)1 << (REGION_SHIFT - _PyObmalloc_GRANULE_SHIFT))

typedef struct {
    uintptr_t region;               /* address >> REGION_SHIFT */
    uint64_t *bits;
} Region;

typedef struct {
    Region *regions;
    uint32_t count;
    uint32_t capacity;
    IndexTable table;               /* of regions, by region */
} RecordedSet;

typedef struct {
    PyObject *op;
    PyObject *name;
} Kid;
#define KIDS_KEPT 4096

typedef struct {
    PyObject *name;
    uint32_t index;
} NameCache;

typedef struct {
    SnapshotObject *snap;
    /* Types by address (or name), with their rules. */
    TypeEntry *types;
    uint32_t ntypes;
    uint32_t types_capacity;
    IndexTable type_table;
    PyObject *names_to_types;   /* dict: virtual names to indexes */
    PyObject *edge_name_indexes;    /* dict: edge names to indexes */
    NameCache name_cache[256];
    PyTypeObject *last_type;
    uint32_t last_type_index;
    /* Sorted by address. */
    ObjectRule *object_rules;
    Py_ssize_t nobject_rules;
    PyObject *type_rule;
    PyTypeObject *virtual_type;
    Virtual *virtuals;
    uint32_t nvirtuals;
    uint32_t virtuals_capacity;
    Item *items;
    PyObject **item_names;      /* borrowed */
    uint32_t nitems;
    uint32_t items_capacity;
    /* Whether the children of the object being processed go straight to
       its edges: all but an object with a __dict__, whose dict is looked
       for among them (to fold it), and whose attributes are named once
       they are all known. */
    int direct;
    /* Else its children, and what each is to it (a str, borrowed; or
       NULL). */
    Kid *kids;
    uint32_t nkids;
    uint32_t kids_capacity;
    /* The records whose children a rule gave: the references their
       tp_traverse visits still explain reference counts. */
    int32_t *ruled;
    uint32_t nruled;
    uint32_t ruled_capacity;
    RecordedSet recorded;
    int progress;
    int failed;
} Scan;


/* Growing arrays */

/* Makes room for one more element; 0, or -1 when out of memory. */
static int
grow(void **array, uint32_t *capacity, uint32_t used, size_t size)
{
    if (used < *capacity) {
        return 0;
    }
    /* By a quarter: the slack of the big arrays counts in the scan's
       memory, and a large block grows in place (mremap()). */
    uint64_t wanted = *capacity ? (uint64_t)*capacity + *capacity / 4 : 256;
    if (wanted > UINT32_MAX || wanted * size > PY_SSIZE_T_MAX) {
        return -1;
    }
    void *grown = PyMem_RawRealloc(*array, (size_t)wanted * size);
    if (grown == NULL) {
        return -1;
    }
    *array = grown;
    *capacity = (uint32_t)wanted;
    return 0;
}


/* Sizes */

static uint64_t
record_size(SnapshotObject *snap, uint32_t index)
{
    uint32_t size = snap->records[index].size;
    if (size != BIG_SIZE) {
        return size;
    }
    uint32_t low = 0, high = snap->nbig_sizes;
    while (low < high) {
        uint32_t mid = (low + high) / 2;
        if (snap->big_sizes[mid].record < index) {
            low = mid + 1;
        }
        else {
            high = mid;
        }
    }
    assert(low < snap->nbig_sizes && snap->big_sizes[low].record == index);
    return snap->big_sizes[low].size;
}

/* Sets the size of a record, the records in order; -1 if out of memory. */
static int
set_size(SnapshotObject *snap, uint32_t index, uint64_t size)
{
    if (size < BIG_SIZE) {
        snap->records[index].size = (uint16_t)size;
        return 0;
    }
    assert(snap->nbig_sizes == 0
           || snap->big_sizes[snap->nbig_sizes - 1].record < index);
    if (grow((void **)&snap->big_sizes, &snap->big_sizes_capacity,
             snap->nbig_sizes, sizeof(BigSize)) < 0)
    {
        return -1;
    }
    snap->big_sizes[snap->nbig_sizes++] = (BigSize){index, size};
    snap->records[index].size = BIG_SIZE;
    return 0;
}


/* The address table */

static uintptr_t
entry_address(SnapshotObject *snap, int32_t entry)
{
    return entry >= ALIAS_BASE ? snap->aliases[entry - ALIAS_BASE].address
                               : record_address(&snap->records[entry]);
}

static uint32_t
hash_of_entry(void *owner, int32_t entry)
{
    return table_hash((void *)entry_address(owner, entry), 0);
}

static int
entry_matches(void *owner, int32_t entry, const void *address)
{
    SnapshotObject *snap = owner;
    /* Only objects' records and aliases are in the table. */
    assert(entry >= ALIAS_BASE
           || !(snap->records[entry].type & VIRTUAL_FLAG));
    return entry_address(snap, entry) == (uintptr_t)address;
}

static inline uint32_t
lookup_start(SnapshotObject *snap, uint32_t hash)
{
    return (uint32_t)(((uint64_t)hash * snap->lookup_slots) >> 32);
}

/* The table's entry for `address`, or -1. */
static int32_t
lookup_find(SnapshotObject *snap, uintptr_t address, uint32_t hash)
{
    if (snap->lookup == NULL) {
        return -1;
    }
    for (uint32_t i = lookup_start(snap, hash); ;
         i = i + 1 == snap->lookup_slots ? 0 : i + 1)
    {
        int32_t slot = snap->lookup[i];
        if (slot == 0) {
            return -1;
        }
        if (entry_matches(snap, slot - 1, (void *)address)) {
            return slot - 1;
        }
    }
}

/* Loops that look up many addresses fetch the table's slot for each some
   lookups ahead: the table is bigger than the caches, and its lines are
   then on their way while earlier lookups are answered. */
#define LOOKAHEAD 16

#if defined(__GNUC__) || defined(__clang__)
#  define PREFETCH(address) __builtin_prefetch(address)
#else
#  define PREFETCH(address) ((void)(address))
#endif

/* The slot where the lookup of `address` starts. */
static inline void
prefetch_slot(SnapshotObject *snap, uintptr_t address)
{
    if (snap->lookup != NULL) {
        PREFETCH(&snap->lookup[lookup_start(
            snap, table_hash((void *)address, 0))]);
    }
}

/* The record of the object at `address`, or -1. */
static int32_t
find_record(SnapshotObject *snap, uintptr_t address)
{
    int32_t entry = lookup_find(snap, address,
                                table_hash((void *)address, 0));
    return entry >= ALIAS_BASE ? snap->aliases[entry - ALIAS_BASE].record
                               : entry;
}

static void
lookup_add(SnapshotObject *snap, int32_t entry, uint32_t hash)
{
    uint32_t i = lookup_start(snap, hash);
    while (snap->lookup[i] != 0) {
        i = i + 1 == snap->lookup_slots ? 0 : i + 1;
    }
    snap->lookup[i] = entry + 1;
    snap->lookup_used++;
}

/* Makes the table `slots` long and fills it again from the records and
   aliases.  Its size is no power of two: the start of a probe is found
   by multiplying the hash (Lemire's reduction), so that the table is as
   full as wished, whatever the count.  -1 when out of memory. */
static int
lookup_resize(SnapshotObject *snap, uint64_t slots)
{
    if (slots > UINT32_MAX) {
        return -1;
    }
    /* Rebuilt from the records: the old table goes first, so that the
       two are never held at once. */
    PyMem_RawFree(snap->lookup);
    snap->lookup = PyMem_RawCalloc((size_t)slots, sizeof(int32_t));
    snap->lookup_slots = snap->lookup != NULL ? (uint32_t)slots : 0;
    snap->lookup_used = 0;
    if (snap->lookup == NULL) {
        return -1;
    }
    for (uint32_t i = 0; i < snap->nrecords; i++) {
        if (i + LOOKAHEAD < snap->nrecords) {
            prefetch_slot(snap,
                          record_address(&snap->records[i + LOOKAHEAD]));
        }
        if (!(snap->records[i].type & VIRTUAL_FLAG)) {
            lookup_add(snap, (int32_t)i, hash_of_entry(snap, (int32_t)i));
        }
    }
    for (uint32_t i = 0; i < snap->naliases; i++) {
        int32_t entry = ALIAS_BASE + (int32_t)i;
        lookup_add(snap, entry, hash_of_entry(snap, entry));
    }
    return 0;
}

/* Room for one more entry while scanning: the table is at most 3/4 full
   (new objects are misses, whose probes grow fast past that), and grows
   to half full.  -1 when out of memory. */
static int
lookup_reserve(SnapshotObject *snap)
{
    uint64_t needed = (uint64_t)snap->lookup_used + 1;
    if (snap->lookup != NULL && needed * 4 <= (uint64_t)snap->lookup_slots * 3)
    {
        return 0;
    }
    return lookup_resize(snap, Py_MAX(needed * 2, 1024));
}

/* Once the scan is done: the arrays cut to their contents, and the
   table made 7/8 full (lookups are few now).  -1 if out of memory. */
static int
compact(SnapshotObject *snap)
{
    snap->peak_bytes = (size_t)snap->records_capacity * sizeof(Record)
                       + (size_t)snap->edges_capacity * sizeof(int32_t)
                       + (size_t)snap->named_edges_capacity
                         * sizeof(NamedEdge)
                       + (size_t)snap->lookup_slots * sizeof(int32_t)
                       + (size_t)snap->aliases_capacity * sizeof(Alias);
    Record *records = PyMem_RawRealloc(
        snap->records, ((size_t)snap->nrecords + 1) * sizeof(Record));
    int32_t *edges = PyMem_RawRealloc(
        snap->edges, ((size_t)snap->nedges + 1) * sizeof(int32_t));
    if (records != NULL) {
        snap->records = records;
        snap->records_capacity = snap->nrecords + 1;
    }
    if (edges != NULL) {
        snap->edges = edges;
        snap->edges_capacity = snap->nedges + 1;
    }
    NamedEdge *named = PyMem_RawRealloc(
        snap->named_edges, ((size_t)snap->nnamed_edges + 1)
                           * sizeof(NamedEdge));
    if (named != NULL) {
        snap->named_edges = named;
        snap->named_edges_capacity = snap->nnamed_edges + 1;
    }
    uint64_t entries = snap->lookup_used;
    return lookup_resize(snap, entries + entries / 7 + 1);
}


/* Types and rules */

/* "module.qualname" for a type, without running Python code. */
static PyObject *
type_name(PyTypeObject *type)
{
    if (!(type->tp_flags & Py_TPFLAGS_HEAPTYPE)) {
        const char *dot = strrchr(type->tp_name, '.');
        return dot != NULL ? PyUnicode_FromString(type->tp_name)
                           : PyUnicode_FromFormat("builtins.%s",
                                                  type->tp_name);
    }
    PyHeapTypeObject *heap = (PyHeapTypeObject *)type;
    PyObject *module = NULL;
    if (type->tp_dict != NULL) {
        module = PyDict_GetItemWithError(type->tp_dict, &_Py_ID(__module__));
        if (module == NULL && PyErr_Occurred()) {
            return NULL;
        }
    }
    if (module != NULL && PyUnicode_Check(module)) {
        return PyUnicode_FromFormat("%U.%U", module, heap->ht_qualname);
    }
    return Py_NewRef(heap->ht_qualname);
}

static int
sizer_kind(PyTypeObject *type)
{
    PyObject *method = _PyType_Lookup(type, &_Py_ID(__sizeof__));
    /* A sizer reads the object as its type's layout: only for a subtype
       of the type whose method it stands for (as the method itself is
       only called for one), not for a class that borrowed the method. */
    if (method != NULL && Py_IS_TYPE(method, &PyMethodDescr_Type)
        && PyType_IsSubtype(type, PyDescr_TYPE(method)))
    {
        PyCFunction function =
            ((PyMethodDescrObject *)method)->d_method->ml_meth;
        for (int kind = 0; kind < SIZER_CALL; kind++) {
            if (function == known_sizeof[kind]) {
                return kind;
            }
        }
    }
    return SIZER_CALL;
}

static Sizer
sizer_of(PyTypeObject *type)
{
    return (Sizer){
        .kind = sizer_kind(type),
#ifdef Py_TRACK_MEMORY
        .owned_bytes = _PyMemTrack_OwnedBytesOf(type),
#endif
    };
}

/* Checks a rule as the Python layer makes it: (size, children), size
   None, an int >= 0 or a callable; children None, () or a callable. */
static int
check_rule(PyObject *rule, PyObject *what)
{
    if (!PyTuple_CheckExact(rule) || PyTuple_GET_SIZE(rule) != 2) {
        PyErr_Format(PyExc_TypeError,
                     "the rule for %R must be a (size, children) tuple, "
                     "not %R", what, rule);
        return -1;
    }
    PyObject *size = PyTuple_GET_ITEM(rule, 0);
    PyObject *children = PyTuple_GET_ITEM(rule, 1);
    if (!(size == Py_None || PyCallable_Check(size)
          || (PyLong_CheckExact(size) && _PyLong_Sign(size) >= 0)))
    {
        PyErr_Format(PyExc_TypeError,
                     "the size in the rule for %R must be None, an int >= 0 "
                     "or a callable, not %R", what, size);
        return -1;
    }
    if (!(children == Py_None || PyCallable_Check(children)
          || (PyTuple_CheckExact(children)
              && PyTuple_GET_SIZE(children) == 0)))
    {
        PyErr_Format(PyExc_TypeError,
                     "the children in the rule for %R must be None, () or a "
                     "callable, not %R", what, children);
        return -1;
    }
    return 0;
}

static uint32_t
hash_of_type(void *owner, int32_t index)
{
    return table_hash(((Scan *)owner)->types[index].key, 0);
}

static int
type_matches(void *owner, int32_t index, const void *key)
{
    return ((Scan *)owner)->types[index].key == key;
}

/* Adds a type entry; its index, or -1 on error.  Steals `name`. */
static int32_t
add_type(Scan *scan, PyObject *key, PyObject *name, uintptr_t address)
{
    SnapshotObject *snap = scan->snap;
    if (name == NULL
        || grow((void **)&scan->types, &scan->types_capacity, scan->ntypes,
                sizeof(TypeEntry)) < 0
        || PyList_Append(snap->type_names, name) < 0)
    {
        Py_XDECREF(name);
        if (!PyErr_Occurred()) {
            PyErr_NoMemory();
        }
        return -1;
    }
    if (grow((void **)&snap->type_addresses, &snap->type_addresses_capacity,
             scan->ntypes, sizeof(uintptr_t)) < 0)
    {
        Py_DECREF(name);
        PyErr_NoMemory();
        return -1;
    }
    snap->type_addresses[scan->ntypes] = address;
    scan->types[scan->ntypes] = (TypeEntry){
        .key = Py_NewRef(key), .name = name, .rule = NULL,
        .sizer = {.kind = SIZER_OBJECT}};
    return (int32_t)scan->ntypes++;
}

/* The index of an object's type, its entry made (and its rule asked
   for) the first time. */
static int32_t
type_index(Scan *scan, PyTypeObject *type)
{
    if (type == scan->last_type) {
        return (int32_t)scan->last_type_index;
    }
    uint32_t hash = table_hash(type, 0);
    int32_t index = table_find(&scan->type_table, hash, scan, type,
                               type_matches);
    if (index < 0) {
        if (table_reserve(&scan->type_table, 2, scan, hash_of_type) < 0) {
            PyErr_NoMemory();
            return -1;
        }
        index = add_type(scan, (PyObject *)type, type_name(type),
                         (uintptr_t)type);
        if (index < 0) {
            return -1;
        }
        table_add(&scan->type_table, hash, index);
        TypeEntry *entry = &scan->types[index];
        entry->sizer = sizer_of(type);
        if (scan->type_rule != Py_None) {
            PyObject *rule = PyObject_CallOneArg(scan->type_rule,
                                                 (PyObject *)type);
            if (rule == NULL) {
                return -1;
            }
            if (rule != Py_None && check_rule(rule, (PyObject *)type) < 0) {
                Py_DECREF(rule);
                return -1;
            }
            entry = &scan->types[index];
            if (rule == Py_None) {
                Py_DECREF(rule);
            }
            else {
                entry->rule = rule;
            }
        }
    }
    scan->last_type = type;
    scan->last_type_index = (uint32_t)index;
    return index;
}

/* The index of a virtual record's type, by its name. */
static int32_t
named_type(Scan *scan, PyObject *name)
{
    PyObject *known = PyDict_GetItemWithError(scan->names_to_types, name);
    if (known != NULL) {
        return (int32_t)PyLong_AsLong(known);
    }
    if (PyErr_Occurred()) {
        return -1;
    }
    int32_t index = add_type(scan, name, Py_NewRef(name), 0);
    if (index < 0) {
        return -1;
    }
    PyObject *number = PyLong_FromLong(index);
    if (number == NULL
        || PyDict_SetItem(scan->names_to_types, name, number) < 0)
    {
        Py_XDECREF(number);
        return -1;
    }
    Py_DECREF(number);
    return index;
}

static int32_t
named_type_str(Scan *scan, const char *name)
{
    PyObject *text = PyUnicode_FromString(name);
    if (text == NULL) {
        return -1;
    }
    int32_t index = named_type(scan, text);
    Py_DECREF(text);
    return index;
}

static PyObject *
object_rule(Scan *scan, PyObject *op)
{
    Py_ssize_t low = 0, high = scan->nobject_rules;
    while (low < high) {
        Py_ssize_t mid = (low + high) / 2;
        if (scan->object_rules[mid].address < (uintptr_t)op) {
            low = mid + 1;
        }
        else {
            high = mid;
        }
    }
    if (low < scan->nobject_rules
        && scan->object_rules[low].address == (uintptr_t)op)
    {
        return scan->object_rules[low].rule;
    }
    return NULL;
}


/* The recorded set */

static uint32_t
region_hash(uintptr_t region)
{
    return table_hash((void *)(region << REGION_SHIFT), 0);
}

static uint32_t
hash_of_region(void *owner, int32_t index)
{
    return region_hash(((RecordedSet *)owner)->regions[index].region);
}

static int
region_matches(void *owner, int32_t index, const void *key)
{
    return ((RecordedSet *)owner)->regions[index].region == (uintptr_t)key;
}

/* The bit of `address` in its region's bitmap. */
static size_t
region_bit(uintptr_t address)
{
    return (address & (((uintptr_t)1 << REGION_SHIFT) - 1))
           >> _PyObmalloc_GRANULE_SHIFT;
}

static int
recorded_set_add(RecordedSet *set, uintptr_t address)
{
    uintptr_t region = address >> REGION_SHIFT;
    uint32_t hash = region_hash(region);
    int32_t index = table_find(&set->table, hash, set, (const void *)region,
                               region_matches);
    if (index < 0) {
        uint64_t *bits = PyMem_RawCalloc(REGION_BITS / 64, sizeof(uint64_t));
        if (bits == NULL
            || grow((void **)&set->regions, &set->capacity, set->count,
                    sizeof(Region)) < 0
            || table_reserve(&set->table, 2, set, hash_of_region) < 0)
        {
            PyMem_RawFree(bits);
            return -1;
        }
        index = (int32_t)set->count++;
        set->regions[index] = (Region){region, bits};
        table_add(&set->table, hash, index);
    }
    size_t bit = region_bit(address);
    set->regions[index].bits[bit / 64] |= (uint64_t)1 << (bit % 64);
    return 0;
}

static int
recorded_set_has(RecordedSet *set, uintptr_t address)
{
    uintptr_t region = address >> REGION_SHIFT;
    int32_t index = table_find(&set->table, region_hash(region), set,
                               (const void *)region, region_matches);
    size_t bit = region_bit(address);
    return index >= 0
           && (set->regions[index].bits[bit / 64] >> (bit % 64)) & 1;
}

static void
recorded_set_clear(RecordedSet *set)
{
    for (uint32_t i = 0; i < set->count; i++) {
        PyMem_RawFree(set->regions[i].bits);
    }
    PyMem_RawFree(set->regions);
    table_clear(&set->table);
    *set = (RecordedSet){0};
}


/* Records and edges */

/* A new record; its index, or -1 when out of memory (or with an
   exception set). */
static int32_t
new_record(Scan *scan, uintptr_t address, uint32_t type)
{
    SnapshotObject *snap = scan->snap;
    if ((uint64_t)address >> ADDRESS_BITS != 0) {
        PyErr_Format(PyExc_OverflowError,
                     "the object at %p is beyond the first 2**%d bytes of "
                     "the address space, which a snapshot can record",
                     (void *)address, ADDRESS_BITS);
        return -1;
    }
    if (snap->nrecords >= MAX_RECORDS
        || grow((void **)&snap->records, &snap->records_capacity,
                snap->nrecords, sizeof(Record)) < 0)
    {
        return -1;
    }
    snap->records[snap->nrecords] = (Record){
        .address_low = (uint32_t)address,
        .address_high = (uint16_t)((uint64_t)address >> 32),
        .size = 0, .type = type, .first_edge = 0};
    return (int32_t)snap->nrecords++;
}

static int
add_edge(Scan *scan, int32_t target)
{
    SnapshotObject *snap = scan->snap;
    if (grow((void **)&snap->edges, &snap->edges_capacity, snap->nedges,
             sizeof(int32_t)) < 0)
    {
        return -1;
    }
    snap->edges[snap->nedges++] = target;
    return 0;
}

/* Names the edge added last. */
static int
name_edge(Scan *scan, PyObject *name)
{
    SnapshotObject *snap = scan->snap;
    /* Names are mostly the same few str objects (attribute names): a
       direct-mapped cache by address before the dict. */
    NameCache *cached = &scan->name_cache[table_hash(name, 0)
                                          % Py_ARRAY_LENGTH(scan->name_cache)];
    PyObject *known = NULL;
    long index;
    if (cached->name == name) {
        index = (long)cached->index;
    }
    else if ((known = PyDict_GetItemWithError(scan->edge_name_indexes,
                                              name)) != NULL)
    {
        index = PyLong_AsLong(known);
    }
    else if (PyErr_Occurred()) {
        return -1;
    }
    else {
        index = (long)PyList_GET_SIZE(snap->edge_names);
        PyObject *number = PyLong_FromLong(index);
        if (number == NULL
            || PyDict_SetItem(scan->edge_name_indexes, name, number) < 0
            || PyList_Append(snap->edge_names, name) < 0)
        {
            Py_XDECREF(number);
            return -1;
        }
        Py_DECREF(number);
    }
    /* A name is a key or a variable name of an object the scan holds
       (or one of `names`): its address stays its until the scan ends. */
    cached->name = name;
    cached->index = (uint32_t)index;
    if (grow((void **)&snap->named_edges, &snap->named_edges_capacity,
             snap->nnamed_edges, sizeof(NamedEdge)) < 0)
    {
        PyErr_NoMemory();
        return -1;
    }
    snap->named_edges[snap->nnamed_edges++] = (NamedEdge){
        snap->nedges - 1, (uint32_t)index};
    return 0;
}

/* The record of `op`, made (and a reference to `op` taken) if new. */
static int32_t
record_of(Scan *scan, PyObject *op)
{
    SnapshotObject *snap = scan->snap;
    uint32_t hash = table_hash(op, 0);
    if (recorded_set_has(&scan->recorded, (uintptr_t)op)) {
        int32_t found = lookup_find(snap, (uintptr_t)op, hash);
        assert(found >= 0);
        return found >= ALIAS_BASE ? snap->aliases[found - ALIAS_BASE].record
                                   : found;
    }
    if (lookup_reserve(snap) < 0
        || recorded_set_add(&scan->recorded, (uintptr_t)op) < 0)
    {
        return -1;
    }
    int32_t index = new_record(scan, (uintptr_t)op, 0);
    if (index < 0) {
        return -1;
    }
    lookup_add(snap, index, hash);
    Py_INCREF(op);
    return index;
}

/* An edge to `op`'s record. */
static int
add_child(Scan *scan, PyObject *op)
{
    int32_t target = record_of(scan, op);
    return target < 0 ? -1 : add_edge(scan, target);
}

/* A virtual record of type `type`, with no items yet. */
static int32_t
new_virtual(Scan *scan, int32_t type, uint64_t size)
{
    if (type < 0
        || grow((void **)&scan->virtuals, &scan->virtuals_capacity,
                scan->nvirtuals, sizeof(Virtual)) < 0)
    {
        return -1;
    }
    int32_t index = new_record(scan, scan->nvirtuals,
                               (uint32_t)type | VIRTUAL_FLAG);
    if (index < 0) {
        return -1;
    }
    if (set_size(scan->snap, (uint32_t)index, size) < 0) {
        return -1;
    }
    scan->virtuals[scan->nvirtuals++] = (Virtual){scan->nitems, 0};
    return index;
}

/* Adds an item to a virtual record, with its name or NULL: each one's
   items are added together, one record after the other. */
static int
add_named_item(Scan *scan, int32_t record, Item item, PyObject *name)
{
    Virtual *virtual = &scan->virtuals[record_address(
        &scan->snap->records[record])];
    if (virtual->count == 0) {
        virtual->first = scan->nitems;
    }
    assert(virtual->first + virtual->count == scan->nitems);
    uint32_t capacity = scan->items_capacity;
    if (grow((void **)&scan->items, &capacity, scan->nitems,
             sizeof(Item)) < 0
        || grow((void **)&scan->item_names, &scan->items_capacity,
                scan->nitems, sizeof(PyObject *)) < 0)
    {
        return -1;
    }
    if (!(item & 1)) {
        Py_INCREF((PyObject *)item);
    }
    scan->item_names[scan->nitems] = name;
    scan->items[scan->nitems++] = item;
    virtual->count++;
    return 0;
}

static int
add_item(Scan *scan, int32_t record, Item item)
{
    return add_named_item(scan, record, item, NULL);
}

static int
add_object_item(Scan *scan, int32_t record, PyObject *op)
{
    return op == NULL ? 0 : add_item(scan, record, (Item)op);
}

static int
add_named_object(Scan *scan, int32_t record, PyObject *op, PyObject *name)
{
    return op == NULL ? 0 : add_named_item(scan, record, (Item)op, name);
}


/* Children */

static int
collect_named(Scan *scan, PyObject *op, PyObject *name)
{
    if (op == NULL) {
        return 0;
    }
    if (scan->direct) {
        /* Adding a record runs no Python code: the container (mid
           tp_traverse) cannot change. */
        if (add_child(scan, op) < 0
            || (name != NULL && name_edge(scan, name) < 0))
        {
            scan->failed = 1;
            return -1;
        }
        return 0;
    }
    if (grow((void **)&scan->kids, &scan->kids_capacity, scan->nkids,
             sizeof(Kid)) < 0)
    {
        scan->failed = 1;
        return -1;
    }
    scan->kids[scan->nkids++] = (Kid){op, name};
    return 0;
}

static int
collect_kid(PyObject *op, void *arg)
{
    return collect_named(arg, op, NULL);
}

/* A dict's keys, and its values named by their keys when those are str:
   what its tp_traverse visits, with the names. */
static void
collect_dict(Scan *scan, PyObject *dict)
{
    Py_ssize_t pos = 0;
    PyObject *key, *value;
    while (PyDict_Next(dict, &pos, &key, &value)) {
        if (collect_kid(key, scan) < 0
            || collect_named(scan, value,
                             PyUnicode_CheckExact(key) ? key : NULL) < 0)
        {
            return;
        }
    }
}

/* What a code object refers to: code objects have no tp_traverse. */
static void
collect_code(Scan *scan, PyCodeObject *code)
{
    PyObject *fields[] = {
        code->co_consts, code->co_names, code->co_exceptiontable,
        code->co_localsplusnames, code->co_localspluskinds,
        code->co_filename, code->co_name, code->co_qualname,
        code->co_linetable, code->_co_code,
    };
    for (size_t i = 0; i < Py_ARRAY_LENGTH(fields); i++) {
        if (collect_kid(fields[i], scan) < 0) {
            return;
        }
    }
}

/* Names the children that are an instance's attributes kept in its
   values array (no dict made yet): by the keys its type shares. */
static void
name_attributes(Scan *scan, PyObject *op)
{
    PyTypeObject *type = Py_TYPE(op);
    if (!(type->tp_flags & Py_TPFLAGS_MANAGED_DICT)
        || *_PyObject_ManagedDictPointer(op) != NULL)
    {
        return;
    }
    PyDictValues *values = *_PyObject_ValuesPointer(op);
    PyDictKeysObject *keys = ((PyHeapTypeObject *)type)->ht_cached_keys;
    if (values == NULL || keys == NULL
        || keys->dk_kind == DICT_KEYS_GENERAL)
    {
        return;
    }
    PyDictUnicodeEntry *entries = DK_UNICODE_ENTRIES(keys);
    for (Py_ssize_t i = 0; i < keys->dk_nentries; i++) {
        PyObject *value = values->values[i];
        if (value == NULL) {
            continue;
        }
        for (uint32_t k = 0; k < scan->nkids; k++) {
            if (scan->kids[k].op == value && scan->kids[k].name == NULL) {
                scan->kids[k].name = entries[i].me_key;
                break;
            }
        }
    }
}

/* The children of an object by default: what tp_traverse visits. */
static void
collect_default(Scan *scan, PyObject *op)
{
    PyTypeObject *type = Py_TYPE(op);
    if (PyDict_CheckExact(op)) {
        collect_dict(scan, op);
    }
    else if (_PyObject_IS_GC(op)) {
        if (type->tp_traverse != NULL) {
            type->tp_traverse(op, collect_kid, scan);
            name_attributes(scan, op);
        }
    }
    else if (PyCode_Check(op)) {
        collect_code(scan, (PyCodeObject *)op);
    }
    else if (PyType_Check(op)) {
        /* A static type, which the collector does not see. */
        PyTypeObject *static_type = (PyTypeObject *)op;
        collect_kid(static_type->tp_dict, scan);
        collect_kid(static_type->tp_mro, scan);
        collect_kid(static_type->tp_bases, scan);
    }
}

/* An object's instance dict, if it has one now. */
static PyObject *
instance_dict(PyObject *op)
{
    PyTypeObject *type = Py_TYPE(op);
    if (type->tp_flags & Py_TPFLAGS_MANAGED_DICT) {
        return *_PyObject_ManagedDictPointer(op);
    }
    Py_ssize_t offset = type->tp_dictoffset;
    if (offset == 0) {
        return NULL;
    }
    if (offset < 0) {
        Py_ssize_t items = Py_SIZE(op);
        offset += (Py_ssize_t)_PyObject_VAR_SIZE(type, Py_ABS(items));
    }
    return *(PyObject **)((char *)op + offset);
}


/* Sizes */

#ifdef Py_TRACK_MEMORY
/* A values array: its block starts before it by the prefix it records. */
static uint64_t
owned_values(PyDictValues *values)
{
    if (values == NULL) {
        return 0;
    }
    uint8_t *start = (uint8_t *)values;
    return _PyMem_ReservedSize(start - start[-1]);
}

/* A str's characters kept apart from it (a legacy string's), its UTF-8
   copy and its wide-character copy, each where it is not the
   characters themselves. */
static uint64_t
owned_by_str(PyObject *op)
{
    void *data = PyUnicode_IS_READY(op) ? PyUnicode_DATA(op) : NULL;
    uint64_t size = 0;
    if (!PyUnicode_IS_COMPACT(op)) {
        size += _PyMem_ReservedSize(((PyUnicodeObject *)op)->data.any);
    }
    if (!PyUnicode_IS_COMPACT_ASCII(op)) {
        char *utf8 = ((PyCompactUnicodeObject *)op)->utf8;
        if (utf8 != data) {
            size += _PyMem_ReservedSize(utf8);
        }
    }
    wchar_t *wstr = ((PyASCIIObject *)op)->wstr;
    if (wstr != data) {
        size += _PyMem_ReservedSize(wstr);
    }
    return size;
}

/* What the allocator reserved for an object and the blocks it owns: the
   core types' known here, a module's type's through the function it
   set. */
static uint64_t
tracked_size(PyObject *op, Sizer sizer)
{
    PyTypeObject *type = Py_TYPE(op);
    uint64_t size = _PyMem_ReservedSize(
        (char *)op - _PyType_PreHeaderSize(type));
    if (size == 0) {
        return 0;       /* a static object */
    }
    switch (sizer.kind) {
    case SIZER_LIST:
        size += _PyMem_ReservedSize(((PyListObject *)op)->ob_item);
        break;
    case SIZER_DICT: {
        PyDictObject *dict = (PyDictObject *)op;
        if (dict->ma_keys->dk_refcnt == 1) {
            size += _PyMem_ReservedSize(dict->ma_keys);
        }
        size += owned_values(dict->ma_values);
        break;
    }
    case SIZER_SET:
        if (((PySetObject *)op)->table != ((PySetObject *)op)->smalltable) {
            size += _PyMem_ReservedSize(((PySetObject *)op)->table);
        }
        break;
    case SIZER_STR:
        size += owned_by_str(op);
        break;
    case SIZER_BYTEARRAY:
        size += _PyMem_ReservedSize(((PyByteArrayObject *)op)->ob_bytes);
        break;
    }
    if (PyType_Check(op)) {
        PyHeapTypeObject *heap = (PyHeapTypeObject *)op;
        if (heap->ht_type.tp_flags & Py_TPFLAGS_HEAPTYPE) {
            /* The keys its instances share, which type.__sizeof__
               counts, and its docstring and name in C. */
            size += _PyMem_ReservedSize(heap->ht_cached_keys)
                    + _PyMem_ReservedSize(heap->ht_type.tp_doc)
                    + _PyMem_ReservedSize(heap->_ht_tpname);
        }
    }
    else if (PyCode_Check(op)) {
        PyCodeObject *code = (PyCodeObject *)op;
        size += _PyMem_ReservedSize(code->_co_linearray)
                + _PyMem_ReservedSize(code->co_extra)
                + _PyMonitoring_CodeDataBytes(code);
    }
    else if (PyModule_Check(op)) {
        size += _PyMem_ReservedSize(((PyModuleObject *)op)->md_state);
    }
    if (type->tp_flags & Py_TPFLAGS_MANAGED_DICT) {
        size += owned_values(*_PyObject_ValuesPointer(op));
    }
    if (sizer.owned_bytes != NULL) {
        size += sizer.owned_bytes(op);
    }
    return size;
}
#else
/* sys.getsizeof(op), without calling the __sizeof__ methods we know;
   -1 with an exception set when another one raises. */
static int64_t
getsizeof(PyObject *op, int sizer)
{
    PyTypeObject *type = Py_TYPE(op);
    int64_t size = type->tp_basicsize;
    switch (sizer) {
    case SIZER_OBJECT:
        if (type->tp_itemsize > 0) {
            size += Py_SIZE(op) * type->tp_itemsize;
        }
        break;
    case SIZER_LIST:
        size += ((PyListObject *)op)->allocated * (int64_t)sizeof(void *);
        break;
    case SIZER_DICT:
        size = _PyDict_SizeOf((PyDictObject *)op);
        break;
    case SIZER_SET:
        if (((PySetObject *)op)->table != ((PySetObject *)op)->smalltable) {
            size += (((PySetObject *)op)->mask + 1)
                    * (int64_t)sizeof(setentry);
        }
        break;
    case SIZER_STR: {
        PyASCIIObject *ascii = (PyASCIIObject *)op;
        if (!ascii->state.compact || ascii->wstr != NULL) {
            goto call;
        }
        Py_ssize_t length = PyUnicode_GET_LENGTH(op);
        if (ascii->state.ascii) {
            size = sizeof(PyASCIIObject) + length + 1;
        }
        else {
            PyCompactUnicodeObject *compact = (PyCompactUnicodeObject *)op;
            size = sizeof(PyCompactUnicodeObject)
                   + (length + 1) * PyUnicode_KIND(op);
            if (compact->utf8 != NULL) {
                size += compact->utf8_length + 1;
            }
        }
        break;
    }
    case SIZER_INT:
        size = offsetof(PyLongObject, ob_digit)
               + Py_MAX(Py_ABS(Py_SIZE(op)), 1) * (int64_t)sizeof(digit);
        break;
    case SIZER_BYTEARRAY:
        size += ((PyByteArrayObject *)op)->ob_alloc;
        break;
    default:
    call: {
        size_t called = _PySys_GetSizeOf(op);
        if (called == (size_t)-1) {
            return -1;
        }
        return (int64_t)called;
    }
    }
    return size + (int64_t)_PyType_PreHeaderSize(type);
}
#endif

static int64_t
default_size(PyObject *op, Sizer sizer)
{
#ifdef Py_TRACK_MEMORY
    return (int64_t)tracked_size(op, sizer);
#else
    return getsizeof(op, sizer.kind);
#endif
}

/* What a size rule says of `op`: -1 with an exception on error. */
static int64_t
rule_size(PyObject *rule_size_, PyObject *op)
{
    PyObject *value = PyLong_CheckExact(rule_size_)
                      ? Py_NewRef(rule_size_)
                      : PyObject_CallOneArg(rule_size_, op);
    if (value == NULL) {
        return -1;
    }
    if (!PyLong_Check(value) || _PyLong_Sign(value) < 0) {
        PyErr_Format(PyExc_ValueError,
                     "a size rule must give an int >= 0, not %R (for a %.200s "
                     "object)", value, Py_TYPE(op)->tp_name);
        Py_DECREF(value);
        return -1;
    }
    int64_t size = PyLong_AsLongLong(value);
    Py_DECREF(value);
    return size;
}


/* Processing a record */

/* Adds the children a rule gives: an iterable of objects. */
static int
collect_from_rule(Scan *scan, PyObject *children, PyObject *op,
                  PyObject **keep)
{
    PyObject *result = PyObject_CallOneArg(children, op);
    if (result == NULL) {
        return -1;
    }
    *keep = PySequence_Fast(result, "a children rule must give an iterable");
    Py_DECREF(result);
    if (*keep == NULL) {
        return -1;
    }
    Py_ssize_t n = PySequence_Fast_GET_SIZE(*keep);
    PyObject **items = PySequence_Fast_ITEMS(*keep);
    for (Py_ssize_t i = 0; i < n; i++) {
        if (collect_kid(items[i], scan) < 0) {
            if (!PyErr_Occurred()) {
                PyErr_NoMemory();
            }
            return -1;
        }
    }
    return 0;
}

/* Folds an object's own __dict__ into its record: the dict's size and
   children count as the owner's, and the dict is found as the owner. */
static int
fold_dict(Scan *scan, int32_t index, PyObject *op, int64_t *size)
{
    PyObject *dict = instance_dict(op);
    if (dict == NULL || !PyDict_CheckExact(dict)) {
        return 0;
    }
    uint32_t at;
    for (at = 0; at < scan->nkids && scan->kids[at].op != dict; at++) {
    }
    SnapshotObject *snap = scan->snap;
    if (at == scan->nkids
        || recorded_set_has(&scan->recorded, (uintptr_t)dict))
    {
        return 0;
    }
    scan->kids[at] = scan->kids[--scan->nkids];
    collect_default(scan, dict);
    *size += default_size(dict, (Sizer){.kind = SIZER_DICT});
    if (grow((void **)&snap->aliases, &snap->aliases_capacity,
             snap->naliases, sizeof(Alias)) < 0
        || snap->naliases >= ALIAS_BASE
        || lookup_reserve(snap) < 0
        || recorded_set_add(&scan->recorded, (uintptr_t)dict) < 0)
    {
        return -1;
    }
    snap->aliases[snap->naliases] = (Alias){(uintptr_t)dict, index};
    lookup_add(snap, ALIAS_BASE + (int32_t)snap->naliases++,
               table_hash(dict, 0));
    return 0;
}

/* A profiling.heap.Virtual object: its name, size and children are its
   attributes. */
static int
process_virtual_object(Scan *scan, int32_t index, PyObject *op,
                       PyObject **keep)
{
    PyObject *name = PyObject_GetAttrString(op, "name");
    if (name == NULL) {
        return -1;
    }
    if (!PyUnicode_Check(name)) {
        PyErr_Format(PyExc_TypeError, "a Virtual's name must be a str, "
                     "not %.200s", Py_TYPE(name)->tp_name);
        Py_DECREF(name);
        return -1;
    }
    int32_t type = named_type(scan, name);
    Py_DECREF(name);
    PyObject *size_attr = type < 0 ? NULL : PyObject_GetAttrString(op,
                                                                   "size");
    if (size_attr == NULL) {
        return -1;
    }
    int64_t size = PyLong_Check(size_attr) ? PyLong_AsLongLong(size_attr)
                                           : -1;
    Py_DECREF(size_attr);
    if (size < 0) {
        if (!PyErr_Occurred()) {
            PyErr_SetString(PyExc_ValueError,
                            "a Virtual's size must be an int >= 0");
        }
        return -1;
    }
    PyObject *children = PyObject_GetAttrString(op, "children");
    if (children == NULL) {
        return -1;
    }
    *keep = PySequence_Fast(children, "a Virtual's children must be an "
                                      "iterable");
    Py_DECREF(children);
    if (*keep == NULL) {
        return -1;
    }
    for (Py_ssize_t i = 0; i < PySequence_Fast_GET_SIZE(*keep); i++) {
        if (collect_kid(PySequence_Fast_ITEMS(*keep)[i], scan) < 0) {
            if (!PyErr_Occurred()) {
                PyErr_NoMemory();
            }
            return -1;
        }
    }
    scan->snap->records[index].type = (uint32_t)type;
    return set_size(scan->snap, (uint32_t)index, (uint64_t)size);
}

/* The children of a large container, once added: their array does not
   stay at that size while the records grow. */
static void
release_kids(Scan *scan)
{
    if (scan->kids_capacity > KIDS_KEPT) {
        PyMem_RawFree(scan->kids);
        scan->kids = NULL;
        scan->kids_capacity = 0;
    }
}

static int
process_object(Scan *scan, int32_t index, PyObject *op)
{
    PyObject *keep = NULL;
    int64_t size = 0;
    scan->nkids = 0;
    scan->direct = (Py_TYPE(op)->tp_dictoffset == 0
                    && !(Py_TYPE(op)->tp_flags & Py_TPFLAGS_MANAGED_DICT));
    if (scan->virtual_type != NULL && Py_IS_TYPE(op, scan->virtual_type)) {
        if (process_virtual_object(scan, index, op, &keep) < 0) {
            goto error;
        }
        goto add_kids;
    }
    int32_t type = type_index(scan, Py_TYPE(op));
    if (type < 0) {
        goto error;
    }
    TypeEntry *entry = &scan->types[type];
    PyObject *rule = scan->nobject_rules ? object_rule(scan, op) : NULL;
    if (rule == NULL) {
        rule = entry->rule;
    }
    PyObject *size_rule = rule ? PyTuple_GET_ITEM(rule, 0) : Py_None;
    PyObject *children_rule = rule ? PyTuple_GET_ITEM(rule, 1) : Py_None;
    if (size_rule == Py_None) {
        size = default_size(op, entry->sizer);
    }
    else {
        size = rule_size(size_rule, op);
    }
    if (size < 0) {
        goto error;
    }
    if (children_rule == Py_None) {
        collect_default(scan, op);
        if (!scan->failed && size_rule == Py_None
            && fold_dict(scan, index, op, &size) < 0)
        {
            PyErr_NoMemory();
            goto error;
        }
    }
    else {
        if (grow((void **)&scan->ruled, &scan->ruled_capacity, scan->nruled,
                 sizeof(int32_t)) < 0)
        {
            PyErr_NoMemory();
            goto error;
        }
        scan->ruled[scan->nruled++] = index;
        if (PyCallable_Check(children_rule)
            && collect_from_rule(scan, children_rule, op, &keep) < 0)
        {
            goto error;
        }
    }
    scan->snap->records[index].type = (uint32_t)type;
    if (set_size(scan->snap, (uint32_t)index, (uint64_t)size) < 0) {
        PyErr_NoMemory();
        goto error;
    }
add_kids:
    if (scan->failed) {
        if (!PyErr_Occurred()) {
            PyErr_NoMemory();
        }
        goto error;
    }
    for (uint32_t i = 0; i < scan->nkids && i < LOOKAHEAD; i++) {
        prefetch_slot(scan->snap, (uintptr_t)scan->kids[i].op);
    }
    for (uint32_t i = 0; i < scan->nkids; i++) {
        if (i + LOOKAHEAD < scan->nkids) {
            prefetch_slot(scan->snap,
                          (uintptr_t)scan->kids[i + LOOKAHEAD].op);
        }
        if (add_child(scan, scan->kids[i].op) < 0
            || (scan->kids[i].name != NULL
                && name_edge(scan, scan->kids[i].name) < 0))
        {
            if (!PyErr_Occurred()) {
                PyErr_NoMemory();
            }
            goto error;
        }
    }
    Py_XDECREF(keep);
    release_kids(scan);
    return 0;
error:
    Py_XDECREF(keep);
    release_kids(scan);
    return -1;
}

static int
process_virtual(Scan *scan, Record *record)
{
    Virtual virtual = scan->virtuals[record_address(record)];
    for (uint32_t i = 0; i < virtual.count; i++) {
        Item item = scan->items[virtual.first + i];
        PyObject *name = scan->item_names[virtual.first + i];
        int err = item & 1 ? add_edge(scan, (int32_t)(item >> 1))
                           : add_child(scan, (PyObject *)item);
        if (err < 0 || (name != NULL && name_edge(scan, name) < 0)) {
            if (!PyErr_Occurred()) {
                PyErr_NoMemory();
            }
            return -1;
        }
    }
    return 0;
}


/* Roots */

/* Calls `visit` for each frame of `tstate` that the roots show. */
#define FOR_EACH_FRAME(tstate, frame) \
    for (_PyInterpreterFrame *frame = (tstate)->cframe->current_frame; \
         frame != NULL; frame = frame->previous) \
        if (!_PyFrame_IsIncomplete(frame))

/* Record 0 and the virtual records under it: the root, each thread, each
   thread's frames.  Sets the index of the root's item that is to be
   "(held from C)", which is made last. */
static int
add_roots(Scan *scan, PyObject *roots, uint32_t *held_item)
{
    PyInterpreterState *interp = _PyInterpreterState_GET();
    if (new_virtual(scan, named_type_str(scan, "(roots)"), 0) != 0) {
        return -1;
    }
    /* sys.modules and the modules in it are recorded first, and so
       processed before the frames: module dicts fold into their modules
       before the frames reach them as globals. */
    int32_t modules = record_of(scan, interp->modules);
    if (modules < 0) {
        return -1;
    }
    if (PyDict_Check(interp->modules)) {
        Py_ssize_t pos = 0;
        PyObject *key, *module;
        while (PyDict_Next(interp->modules, &pos, &key, &module)) {
            if (record_of(scan, module) < 0) {
                return -1;
            }
        }
    }
    int32_t first_thread = (int32_t)scan->snap->nrecords;
    uint32_t nthreads = 0;
    for (PyThreadState *t = interp->threads.head; t != NULL; t = t->next) {
        char label[64];
        PyOS_snprintf(label, sizeof(label), "(thread %lu)", t->thread_id);
        if (new_virtual(scan, named_type_str(scan, label), 0) < 0) {
            return -1;
        }
        nthreads++;
    }
    for (PyThreadState *t = interp->threads.head; t != NULL; t = t->next) {
        FOR_EACH_FRAME(t, frame) {
            PyCodeObject *code = frame->f_code;
            PyObject *name = PyUnicode_FromFormat("(frame) %U",
                                                  code->co_qualname);
            if (name == NULL) {
                return -1;
            }
            int32_t type = named_type(scan, name);
            Py_DECREF(name);
            /* What the frame takes on its thread's stack. */
            uint64_t size = offsetof(_PyInterpreterFrame, localsplus)
                            + sizeof(PyObject *)
                              * ((uint64_t)code->co_nlocalsplus
                                 + code->co_stacksize);
            if (new_virtual(scan, type, size) < 0) {
                return -1;
            }
        }
    }
    if (add_named_item(scan, 0, ITEM_OF_RECORD(modules),
                       names[NAME_SYS_MODULES]) < 0)
    {
        return -1;
    }
    for (uint32_t i = 0; i < nthreads; i++) {
        if (add_item(scan, 0, ITEM_OF_RECORD(first_thread + i)) < 0) {
            return -1;
        }
    }
    Py_ssize_t n = PySequence_Fast_GET_SIZE(roots);
    for (Py_ssize_t i = 0; i < n; i++) {
        if (add_object_item(scan, 0,
                            PySequence_Fast_GET_ITEM(roots, i)) < 0)
        {
            return -1;
        }
    }
    if (add_named_object(scan, 0, interp->builtins,
                         names[NAME_BUILTINS]) < 0)
    {
        return -1;
    }
    *held_item = scan->nitems;
    if (add_item(scan, 0, ITEM_OF_RECORD(0)) < 0) {
        return -1;
    }
    int32_t thread = first_thread;
    int32_t frame_record = first_thread + (int32_t)nthreads;
    for (PyThreadState *t = interp->threads.head; t != NULL; t = t->next) {
        FOR_EACH_FRAME(t, frame) {
            if (add_item(scan, thread, ITEM_OF_RECORD(frame_record++)) < 0) {
                return -1;
            }
        }
        thread++;
    }
    frame_record = first_thread + (int32_t)nthreads;
    for (PyThreadState *t = interp->threads.head; t != NULL; t = t->next) {
        FOR_EACH_FRAME(t, frame) {
            int32_t r = frame_record++;
            PyObject *specials[] = {
                [NAME_FUNCTION] = (PyObject *)frame->f_func,
                [NAME_CODE] = (PyObject *)frame->f_code,
                [NAME_GLOBALS] = frame->f_globals,
                [NAME_FRAME_BUILTINS] = frame->f_builtins,
                [NAME_LOCALS] = frame->f_locals,
                [NAME_FRAME_OBJECT] = (PyObject *)frame->frame_obj,
            };
            for (int i = NAME_FUNCTION; i < NAMES; i++) {
                if (add_named_object(scan, r, specials[i], names[i]) < 0) {
                    return -1;
                }
            }
            PyObject *variables = frame->f_code->co_localsplusnames;
            for (int i = 0; i < frame->f_code->co_nlocalsplus; i++) {
                if (add_named_object(scan, r, frame->localsplus[i],
                                     PyTuple_GET_ITEM(variables, i)) < 0)
                {
                    return -1;
                }
            }
        }
    }
    return 0;
}


/* The walk */

static int
walk(Scan *scan, uint32_t from)
{
    SnapshotObject *snap = scan->snap;
    for (uint32_t i = from; i < snap->nrecords; i++) {
        snap->records[i].first_edge = snap->nedges;
        int err = snap->records[i].type & VIRTUAL_FLAG
                  ? process_virtual(scan, &snap->records[i])
                  : process_object(scan, (int32_t)i,
                                   (PyObject *)record_address(
                                       &snap->records[i]));
        if (err < 0) {
            return -1;
        }
        if (scan->progress && (i + 1) % (1 << 20) == 0) {
            fprintf(stderr, "\rprofiling.heap: %u objects scanned", i + 1);
            fflush(stderr);
        }
    }
    return 0;
}

#define FROM_GC(g) ((PyObject *)((PyGC_Head *)(g) + 1))

/* The objects the collector tracks, in the order of its lists. */
#define FOR_EACH_TRACKED(interp, op) \
    for (int gen_ = 0; gen_ <= NUM_GENERATIONS; gen_++) \
        for (PyGC_Head *head_ = gen_ < NUM_GENERATIONS \
                 ? &(interp)->gc.generations[gen_].head \
                 : &(interp)->gc.permanent_generation.head, \
             *g_ = _PyGCHead_NEXT(head_); g_ != head_; \
             g_ = _PyGCHead_NEXT(g_)) \
            for (PyObject *op = FROM_GC(g_); op != NULL; op = NULL)

typedef struct {
    PyObject **objects;
    uint32_t *refs;
    uint64_t *sizes;
    /* The scan's own objects, and what only they hold: neither held
       from C nor garbage.  Those to look into, while marking them. */
    uint8_t *own;
    int32_t *own_stack;
    uint32_t own_depth;
    uint32_t count;
    uint32_t capacity;
    IndexTable table;
    RecordedSet *recorded;          /* the scan's */
} Unreached;

static uint32_t
hash_of_unreached(void *owner, int32_t index)
{
    return table_hash(((Unreached *)owner)->objects[index], 0);
}

static int
unreached_matches(void *owner, int32_t index, const void *key)
{
    return ((Unreached *)owner)->objects[index] == key;
}

static int32_t
unreached_index(Unreached *u, PyObject *op)
{
    return table_find(&u->table, table_hash(op, 0), u, op,
                      unreached_matches);
}

/* Adds an object the walk did not reach, and holds it: C code may let go
   of it meanwhile (the method cache that _PyType_Lookup() refills holds
   names, say).  -1 when out of memory. */
static int
add_unreached(Unreached *u, PyObject *op)
{
    if (grow((void **)&u->objects, &u->capacity, u->count,
             sizeof(PyObject *)) < 0
        || table_reserve(&u->table, 2, u, hash_of_unreached) < 0)
    {
        return -1;
    }
    u->objects[u->count] = Py_NewRef(op);
    table_add(&u->table, table_hash(op, 0), (int32_t)u->count++);
    return 0;
}

/* Adds op if the walk did not reach it; -1 when out of memory. */
static int
add_if_unreached(Unreached *u, PyObject *op)
{
    if (recorded_set_has(u->recorded, (uintptr_t)op)) {
        return 0;
    }
    return add_unreached(u, op);
}

#ifdef Py_TRACK_MEMORY
/* An object in the allocator's blocks that the collector does not track,
   and that the walk did not reach.  C code may be making it still (it
   does not run Python code then, but the walk may, in a rule or a
   __sizeof__), so only objects whole once made are taken: strings,
   numbers, bytes, and the tuples and dicts the collector untracked.  One
   with no reference is on a free list. */
static int
add_untracked(PyObject *op, void *arg)
{
    Unreached *u = arg;
    PyTypeObject *type = Py_TYPE(op);
    if (!(type == &PyUnicode_Type || type == &PyLong_Type
          || type == &PyFloat_Type || type == &PyComplex_Type
          || type == &PyBytes_Type
          || ((type == &PyTuple_Type || type == &PyDict_Type)
              && !_PyObject_GC_IS_TRACKED(op)))
        || Py_REFCNT(op) == 0)
    {
        return 0;
    }
    return add_if_unreached(u, op);
}
#endif

static int
count_ref(PyObject *op, void *arg)
{
    Unreached *u = arg;
    int32_t index = unreached_index(u, op);
    if (index >= 0) {
        u->refs[index]++;
    }
    return 0;
}

static int
mark_own_child(PyObject *op, void *arg)
{
    Unreached *u = arg;
    int32_t index = op != NULL ? unreached_index(u, op) : -1;
    if (index >= 0 && !u->own[index]) {
        /* Each is stacked once at most: the stack holds them all. */
        u->own[index] = 1;
        u->own_stack[u->own_depth++] = index;
    }
    return 0;
}

/* Marks op, if unreached, and what it holds that is unreached, without
   recursion. */
static void
mark_own(Unreached *u, PyObject *op)
{
    (void)mark_own_child(op, u);
    while (u->own_depth > 0) {
        PyObject *next = u->objects[u->own_stack[--u->own_depth]];
        if (_PyObject_IS_GC(next) && Py_TYPE(next)->tp_traverse != NULL) {
            Py_TYPE(next)->tp_traverse(next, mark_own_child, u);
        }
    }
}

/* Marks the objects that the scan made or keeps for itself, which the
   program does not hold. */
static void
mark_scan_objects(Scan *scan, Unreached *u)
{
    SnapshotObject *snap = scan->snap;
    PyObject *own[] = {
        snap->type_names, snap->edge_names,
        scan->names_to_types, scan->edge_name_indexes,
    };
    for (size_t i = 0; i < Py_ARRAY_LENGTH(own); i++) {
        mark_own(u, own[i]);
    }
    for (int i = 0; i < NAMES; i++) {
        mark_own(u, names[i]);
    }
    for (uint32_t i = 0; i < scan->ntypes; i++) {
        if (!PyType_Check(scan->types[i].key)) {
            mark_own(u, scan->types[i].key);
        }
        mark_own(u, scan->types[i].rule);
    }
    for (Py_ssize_t i = 0; i < scan->nobject_rules; i++) {
        mark_own(u, scan->object_rules[i].rule);
    }
}

/* Makes "(held from C)" and walks on from the objects under it: those
   that the walk did not reach, and whose reference counts the references
   among them (and from the objects whose children rules gave) do not
   explain.  They are those the collector tracks; on a tracking build,
   also the others the allocator's blocks hold.  Then counts what is
   still not reached: garbage, and what rules hid. */
static int
walk_held_from_c(Scan *scan, uint32_t held_edge)
{
    SnapshotObject *snap = scan->snap;
    PyInterpreterState *interp = _PyInterpreterState_GET();
    int32_t held = new_virtual(scan, named_type_str(scan, "(held from C)"),
                               0);
    if (held < 0) {
        return -1;
    }
    snap->edges[held_edge] = held;
    Unreached u = {.recorded = &scan->recorded};
    int err = -1;
    FOR_EACH_TRACKED(interp, op) {
        if (add_if_unreached(&u, op) < 0) {
            PyErr_NoMemory();
            goto done;
        }
    }
#ifdef Py_TRACK_MEMORY
    if (_PyMemTrack_VisitObjects(add_untracked, &u) < 0) {
        PyErr_NoMemory();
        goto done;
    }
#endif
    u.refs = PyMem_RawCalloc(u.count + 1, sizeof(uint32_t));
    u.own = PyMem_RawCalloc(u.count + 1, sizeof(uint8_t));
    u.own_stack = PyMem_RawMalloc((u.count + 1) * sizeof(int32_t));
    if (u.refs == NULL || u.own == NULL || u.own_stack == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    mark_scan_objects(scan, &u);
    for (uint32_t i = 0; i < u.count + scan->nruled; i++) {
        PyObject *op = i < u.count
            ? u.objects[i]
            : (PyObject *)record_address(
                  &snap->records[scan->ruled[i - u.count]]);
        if (_PyObject_IS_GC(op) && Py_TYPE(op)->tp_traverse != NULL) {
            Py_TYPE(op)->tp_traverse(op, count_ref, &u);
        }
    }
    /* Their sizes now, without running Python code: the walk may run
       rules, and then other threads, and those may change them. */
    u.sizes = PyMem_RawMalloc((u.count + 1) * sizeof(uint64_t));
    if (u.sizes == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    for (uint32_t i = 0; i < u.count; i++) {
        PyObject *op = u.objects[i];
        Sizer sizer = sizer_of(Py_TYPE(op));
#ifndef Py_TRACK_MEMORY
        /* A __sizeof__ of its own is Python code. */
        if (sizer.kind == SIZER_CALL) {
            u.sizes[i] = (uint64_t)Py_TYPE(op)->tp_basicsize
                         + _PyType_PreHeaderSize(Py_TYPE(op));
            continue;
        }
#endif
        u.sizes[i] = (uint64_t)default_size(op, sizer);
    }
    for (uint32_t i = 0; i < u.count; i++) {
        /* Less the reference this holds. */
        if (!u.own[i]
            && (uint64_t)Py_REFCNT(u.objects[i]) - 1 > u.refs[i])
        {
            if (add_item(scan, held, (Item)u.objects[i]) < 0) {
                PyErr_NoMemory();
                goto done;
            }
            snap->held_from_c++;
        }
    }
    if (walk(scan, (uint32_t)held) < 0) {
        goto done;
    }
    for (uint32_t i = 0; i < u.count; i++) {
        if (!u.own[i] && find_record(snap, (uintptr_t)u.objects[i]) < 0) {
            snap->unreachable_objects++;
            snap->unreachable_bytes += u.sizes[i];
        }
    }
    err = 0;
done:
    /* What C code let go of meanwhile goes now. */
    for (uint32_t i = 0; i < u.count; i++) {
        Py_DECREF(u.objects[i]);
    }
    PyMem_RawFree(u.objects);
    PyMem_RawFree(u.refs);
    PyMem_RawFree(u.sizes);
    PyMem_RawFree(u.own);
    PyMem_RawFree(u.own_stack);
    table_clear(&u.table);
    return err;
}

/* Whether type `t` of `snap` is type `previous_type` of the snapshot
   before, remembered for the last one asked: most types are asked about
   the same one again and again. */
typedef struct {
    uint32_t previous_type_plus_one;
    int same;
} TypeMatch;

static int
same_type(SnapshotObject *snap, SnapshotObject *previous, TypeMatch *matches,
          uint32_t t, uint32_t previous_type)
{
    TypeMatch *m = &matches[t];
    if (m->previous_type_plus_one != previous_type + 1) {
        m->previous_type_plus_one = previous_type + 1;
        m->same = (previous->type_addresses[previous_type]
                       == snap->type_addresses[t]
                   && PyUnicode_Compare(
                          PyList_GET_ITEM(previous->type_names,
                                          previous_type),
                          PyList_GET_ITEM(snap->type_names, t)) == 0);
    }
    return m->same;
}

/* Each record takes the id of the record of the same type at its address
   in `previous`, or a new one.  -1 when out of memory.

   A heap walked again is mostly walked in the same order: the record
   after the last one matched is tried first, which reads `previous` in
   order; only when it is not the one is the table asked. */
static int
assign_ids(SnapshotObject *snap, SnapshotObject *previous)
{
    TypeMatch *matches = NULL;
    if (previous != NULL) {
        matches = PyMem_RawCalloc(
            (size_t)PyList_GET_SIZE(snap->type_names) + 1, sizeof(TypeMatch));
        if (matches == NULL) {
            return -1;
        }
    }
    uint32_t next = 0;
    for (uint32_t i = 0; i < snap->nrecords; i++) {
        Record *r = &snap->records[i];
        int32_t old = -1;
        if (previous != NULL && !(r->type & VIRTUAL_FLAG)) {
            Record *o = &previous->records[next];
            old = next < previous->nrecords && !(o->type & VIRTUAL_FLAG)
                  && record_address(o) == record_address(r)
                  ? (int32_t)next
                  : find_record(previous, record_address(r));
        }
        if (old >= 0) {
            Record *o = &previous->records[old];
            next = (uint32_t)old + 1;
            if (record_address(o) == record_address(r)
                && same_type(snap, previous, matches, TYPE_INDEX(r->type),
                             TYPE_INDEX(o->type)))
            {
                snap->ids[i] = previous->ids[old];
                continue;
            }
        }
        snap->ids[i] = next_id;
        next_id += 2;
    }
    PyMem_RawFree(matches);
    return 0;
}

/* Sizes the arrays for a heap like the one `previous` saw, with a
   sixteenth more: a scan that grows them by a quarter holds an eighth
   more than it needs on average, and the arrays are most of its
   memory. */
static int
presize(SnapshotObject *snap, SnapshotObject *previous)
{
    uint64_t records = (uint64_t)previous->nrecords * 17 / 16;
    uint64_t edges = (uint64_t)previous->nedges * 17 / 16;
    uint64_t named = (uint64_t)previous->nnamed_edges * 17 / 16;
    if (records >= MAX_RECORDS || edges >= UINT32_MAX
        || named >= UINT32_MAX)
    {
        return 0;
    }
    snap->records = PyMem_RawMalloc((size_t)records * sizeof(Record));
    snap->edges = PyMem_RawMalloc((size_t)edges * sizeof(int32_t));
    snap->named_edges = PyMem_RawMalloc((size_t)named * sizeof(NamedEdge));
    if (snap->records == NULL || snap->edges == NULL
        || snap->named_edges == NULL
        || lookup_resize(snap, (records + previous->naliases) * 4 / 3 + 1)
           < 0)
    {
        return -1;
    }
    snap->records_capacity = (uint32_t)records;
    snap->edges_capacity = (uint32_t)edges;
    snap->named_edges_capacity = (uint32_t)named;
    return 0;
}

/* Lets go of what a scan holds. */
static void
release_scan(Scan *scan)
{
    SnapshotObject *snap = scan->snap;
    for (uint32_t i = 0; snap != NULL && i < snap->nrecords; i++) {
        if (!(snap->records[i].type & VIRTUAL_FLAG)) {
            Py_DECREF((PyObject *)record_address(&snap->records[i]));
        }
    }
    for (uint32_t i = 0; i < scan->nitems; i++) {
        if (!(scan->items[i] & 1)) {
            Py_DECREF((PyObject *)scan->items[i]);
        }
    }
    for (uint32_t i = 0; i < scan->ntypes; i++) {
        Py_DECREF(scan->types[i].key);
        Py_DECREF(scan->types[i].name);
        Py_XDECREF(scan->types[i].rule);
    }
    PyMem_RawFree(scan->types);
    table_clear(&scan->type_table);
    recorded_set_clear(&scan->recorded);
    Py_XDECREF(scan->names_to_types);
    for (Py_ssize_t i = 0; i < scan->nobject_rules; i++) {
        Py_DECREF(scan->object_rules[i].rule);
    }
    PyMem_RawFree(scan->object_rules);
    PyMem_RawFree(scan->virtuals);
    PyMem_RawFree(scan->items);
    PyMem_RawFree(scan->item_names);
    Py_XDECREF(scan->edge_name_indexes);
    PyMem_RawFree(scan->kids);
    PyMem_RawFree(scan->ruled);
}

static int
compare_object_rules(const void *a, const void *b)
{
    uintptr_t x = ((const ObjectRule *)a)->address;
    uintptr_t y = ((const ObjectRule *)b)->address;
    return x < y ? -1 : x > y;
}

static int
read_object_rules(Scan *scan, PyObject *rules)
{
    if (rules == Py_None) {
        return 0;
    }
    if (!PyDict_Check(rules)) {
        PyErr_Format(PyExc_TypeError, "object_rules must be a dict, not "
                     "%.200s", Py_TYPE(rules)->tp_name);
        return -1;
    }
    Py_ssize_t n = PyDict_GET_SIZE(rules);
    scan->object_rules = PyMem_RawMalloc((n + 1) * sizeof(ObjectRule));
    if (scan->object_rules == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    Py_ssize_t pos = 0;
    PyObject *key, *rule;
    while (PyDict_Next(rules, &pos, &key, &rule)) {
        if (!PyLong_Check(key)) {
            PyErr_Format(PyExc_TypeError, "object_rules' keys must be ids "
                         "(ints), not %.200s", Py_TYPE(key)->tp_name);
            return -1;
        }
        uintptr_t address = (uintptr_t)PyLong_AsVoidPtr(key);
        if (PyErr_Occurred() || check_rule(rule, key) < 0) {
            return -1;
        }
        scan->object_rules[scan->nobject_rules++] = (ObjectRule){
            address, Py_NewRef(rule)};
    }
    qsort(scan->object_rules, (size_t)scan->nobject_rules,
          sizeof(ObjectRule), compare_object_rules);
    return 0;
}


/* The Snapshot type */

static void
free_analysis(SnapshotObject *self)
{
    PyMem_RawFree(self->pred_start);
    PyMem_RawFree(self->preds);
    PyMem_RawFree(self->idom);
    PyMem_RawFree(self->retained);
    self->pred_start = NULL;
    self->preds = NULL;
    self->idom = NULL;
    self->retained = NULL;
}

static void
snapshot_dealloc(SnapshotObject *self)
{
    PyTypeObject *type = Py_TYPE(self);
    PyObject_GC_UnTrack(self);
    if (last_snapshot == self) {
        last_snapshot = NULL;
    }
    PyMem_RawFree(self->records);
    PyMem_RawFree(self->edges);
    PyMem_RawFree(self->ids);
    PyMem_RawFree(self->aliases);
    PyMem_RawFree(self->big_sizes);
    PyMem_RawFree(self->named_edges);
    Py_XDECREF(self->edge_names);
    PyMem_RawFree(self->type_addresses);
    PyMem_RawFree(self->lookup);
    free_analysis(self);
    Py_XDECREF(self->type_names);
    type->tp_free(self);
    Py_DECREF(type);
}

static int
snapshot_traverse(SnapshotObject *self, visitproc visit, void *arg)
{
    Py_VISIT(Py_TYPE(self));
    return 0;
}

static Py_ssize_t
snapshot_length(SnapshotObject *self)
{
    return self->nrecords;
}

static uint32_t
edges_end(SnapshotObject *self, uint32_t index)
{
    return index + 1 < self->nrecords ? self->records[index + 1].first_edge
                                      : self->nedges;
}

static int
check_index(SnapshotObject *self, Py_ssize_t index)
{
    if (index < 0 || index >= self->nrecords) {
        PyErr_SetString(PyExc_IndexError, "no such record");
        return -1;
    }
    return 0;
}

/* Predecessors, as edges are: pred_start[i] to pred_start[i + 1]. */
static int
compute_preds(SnapshotObject *self)
{
    if (self->preds != NULL) {
        return 0;
    }
    uint32_t n = self->nrecords;
    self->pred_start = PyMem_RawCalloc((size_t)n + 1, sizeof(uint32_t));
    self->preds = PyMem_RawMalloc(((size_t)self->nedges + 1)
                                  * sizeof(int32_t));
    uint32_t *fill = PyMem_RawMalloc(((size_t)n + 1) * sizeof(uint32_t));
    if (self->pred_start == NULL || self->preds == NULL || fill == NULL) {
        PyMem_RawFree(fill);
        free_analysis(self);
        PyErr_NoMemory();
        return -1;
    }
    for (uint32_t e = 0; e < self->nedges; e++) {
        self->pred_start[self->edges[e] + 1]++;
    }
    for (uint32_t i = 0; i < n; i++) {
        self->pred_start[i + 1] += self->pred_start[i];
    }
    memcpy(fill, self->pred_start, (size_t)n * sizeof(uint32_t));
    /* In the order of the records, so that a record's first predecessor
       is the one the walk reached it from: the end of a shortest path. */
    for (uint32_t i = 0; i < n; i++) {
        for (uint32_t e = self->records[i].first_edge; e < edges_end(self, i);
             e++)
        {
            self->preds[fill[self->edges[e]]++] = (int32_t)i;
        }
    }
    PyMem_RawFree(fill);
    return 0;
}

/* Dominators (Cooper, Harvey and Kennedy's iteration over the reverse
   postorder) and retained sizes. */
static int
compute_dominators(SnapshotObject *self)
{
    if (self->idom != NULL) {
        return 0;
    }
    if (compute_preds(self) < 0) {
        return -1;
    }
    uint32_t n = self->nrecords;
    int32_t *order = PyMem_RawMalloc((size_t)n * sizeof(int32_t));
    int32_t *number = PyMem_RawMalloc((size_t)n * sizeof(int32_t));
    uint32_t *stack = PyMem_RawMalloc((size_t)n * sizeof(uint32_t));
    uint32_t *cursor = PyMem_RawMalloc((size_t)n * sizeof(uint32_t));
    int32_t *idom = PyMem_RawMalloc((size_t)n * sizeof(int32_t));
    uint64_t *retained = PyMem_RawMalloc((size_t)n * sizeof(uint64_t));
    int err = -1;
    if (!order || !number || !stack || !cursor || !idom || !retained) {
        PyErr_NoMemory();
        goto done;
    }
    /* Postorder, depth first from the root, without recursion. */
    for (uint32_t i = 0; i < n; i++) {
        number[i] = -1;
    }
    uint32_t depth = 0, done_count = 0;
    stack[depth++] = 0;
    cursor[0] = self->records[0].first_edge;
    number[0] = -2;
    while (depth > 0) {
        uint32_t v = stack[depth - 1];
        if (cursor[depth - 1] < edges_end(self, v)) {
            int32_t w = self->edges[cursor[depth - 1]++];
            if (number[w] == -1) {
                number[w] = -2;
                stack[depth] = (uint32_t)w;
                cursor[depth] = self->records[w].first_edge;
                depth++;
            }
            continue;
        }
        depth--;
        order[done_count++] = (int32_t)v;
    }
    assert(done_count == n);
    /* Reverse postorder numbers: the root is 0. */
    for (uint32_t k = 0; k < done_count; k++) {
        number[order[k]] = (int32_t)(done_count - 1 - k);
    }
    /* idom by reverse postorder number, in `cursor`'s room. */
    int32_t *dom = (int32_t *)cursor;
    for (uint32_t i = 0; i < n; i++) {
        dom[i] = -1;
    }
    dom[0] = 0;
    int changed = 1;
    while (changed) {
        changed = 0;
        for (uint32_t k = 1; k < n; k++) {
            int32_t v = order[n - 1 - k];
            int32_t new_idom = -1;
            for (uint32_t p = self->pred_start[v]; p < self->pred_start[v + 1];
                 p++)
            {
                int32_t pred = number[self->preds[p]];
                if (dom[pred] < 0) {
                    continue;
                }
                if (new_idom < 0) {
                    new_idom = pred;
                    continue;
                }
                int32_t a = pred, b = new_idom;
                while (a != b) {
                    while (a > b) {
                        a = dom[a];
                    }
                    while (b > a) {
                        b = dom[b];
                    }
                }
                new_idom = a;
            }
            if (dom[k] != new_idom) {
                dom[k] = new_idom;
                changed = 1;
            }
        }
    }
    for (uint32_t k = 0; k < n; k++) {
        int32_t v = order[n - 1 - k];
        idom[v] = order[n - 1 - dom[k]];
        retained[v] = record_size(self, (uint32_t)v);
    }
    for (uint32_t k = n - 1; k > 0; k--) {
        int32_t v = order[n - 1 - k];
        retained[idom[v]] += retained[v];
    }
    self->idom = idom;
    self->retained = retained;
    idom = NULL;
    retained = NULL;
    err = 0;
done:
    PyMem_RawFree(order);
    PyMem_RawFree(number);
    PyMem_RawFree(stack);
    PyMem_RawFree(cursor);
    PyMem_RawFree(idom);
    PyMem_RawFree(retained);
    return err;
}

/*[clinic input]
module _heap
class _heap.Snapshot "SnapshotObject *" "&PyBaseObject_Type"
[clinic start generated code]*/
/*[clinic end generated code: output=da39a3ee5e6b4b0d input=e95656a12c27d734]*/

#include "clinic/heap.c.h"

/*[clinic input]
_heap.Snapshot.record

    index: Py_ssize_t
    /

A record: (id, type name, size, address or None when virtual).
[clinic start generated code]*/

static PyObject *
_heap_Snapshot_record_impl(SnapshotObject *self, Py_ssize_t index)
/*[clinic end generated code: output=257f03353c2ffa76 input=4c617fccc4be25a4]*/
{
    if (check_index(self, index) < 0) {
        return NULL;
    }
    Record *r = &self->records[index];
    PyObject *address = r->type & VIRTUAL_FLAG
                        ? Py_NewRef(Py_None)
                        : PyLong_FromVoidPtr((void *)record_address(r));
    if (address == NULL) {
        return NULL;
    }
    return Py_BuildValue("(kOKN)", (unsigned long)self->ids[index],
                         PyList_GET_ITEM(self->type_names,
                                         TYPE_INDEX(r->type)),
                         (unsigned long long)record_size(
                             self, (uint32_t)index), address);
}

/*[clinic input]
_heap.Snapshot.find

    address: object
    /

The index of the record of the object at address (an id), or -1.
[clinic start generated code]*/

static PyObject *
_heap_Snapshot_find(SnapshotObject *self, PyObject *address)
/*[clinic end generated code: output=a71266201dc91066 input=ce57506f5e1e2b95]*/
{
    void *pointer = PyLong_AsVoidPtr(address);
    if (pointer == NULL && PyErr_Occurred()) {
        return NULL;
    }
    return PyLong_FromLong(find_record(self, (uintptr_t)pointer));
}

static PyObject *
index_list(const int32_t *indexes, uint32_t count)
{
    PyObject *list = PyList_New(count);
    for (uint32_t i = 0; list != NULL && i < count; i++) {
        PyObject *item = PyLong_FromLong(indexes[i]);
        if (item == NULL) {
            Py_CLEAR(list);
            break;
        }
        PyList_SET_ITEM(list, i, item);
    }
    return list;
}

/*[clinic input]
_heap.Snapshot.children

    index: Py_ssize_t
    /

The indexes of the records a record refers to.
[clinic start generated code]*/

static PyObject *
_heap_Snapshot_children_impl(SnapshotObject *self, Py_ssize_t index)
/*[clinic end generated code: output=8748ec5ef6a6ab59 input=9d8fbf8b50bb3945]*/
{
    if (check_index(self, index) < 0) {
        return NULL;
    }
    uint32_t first = self->records[index].first_edge;
    return index_list(self->edges + first,
                      edges_end(self, (uint32_t)index) - first);
}

/*[clinic input]
_heap.Snapshot.edge_name

    index: Py_ssize_t
    child: Py_ssize_t
    /

What a record's child is to it: a name (str), a position (int), or None.

The name is a dict's key, an attribute's or a variable's name; the
position, the child's among the record's references otherwise.  None
when the child is not the record's.
[clinic start generated code]*/

static PyObject *
_heap_Snapshot_edge_name_impl(SnapshotObject *self, Py_ssize_t index,
                              Py_ssize_t child)
/*[clinic end generated code: output=d529a1f17167f1dc input=379e1d2a3e026cbe]*/
{
    if (check_index(self, index) < 0 || check_index(self, child) < 0) {
        return NULL;
    }
    uint32_t first = self->records[index].first_edge;
    for (uint32_t e = first; e < edges_end(self, (uint32_t)index); e++) {
        if (self->edges[e] != child) {
            continue;
        }
        uint32_t low = 0, high = self->nnamed_edges;
        while (low < high) {
            uint32_t mid = (low + high) / 2;
            if (self->named_edges[mid].edge < e) {
                low = mid + 1;
            }
            else {
                high = mid;
            }
        }
        if (low < self->nnamed_edges && self->named_edges[low].edge == e) {
            return Py_NewRef(PyList_GET_ITEM(self->edge_names,
                                             self->named_edges[low].name));
        }
        return PyLong_FromUnsignedLong(e - first);
    }
    Py_RETURN_NONE;
}

/*[clinic input]
_heap.Snapshot.referrers

    index: Py_ssize_t
    /

The indexes of the records that refer to a record, nearest root first.
[clinic start generated code]*/

static PyObject *
_heap_Snapshot_referrers_impl(SnapshotObject *self, Py_ssize_t index)
/*[clinic end generated code: output=fd1a4148daef92e5 input=c1b804cf4e8d299b]*/
{
    if (check_index(self, index) < 0 || compute_preds(self) < 0) {
        return NULL;
    }
    uint32_t first = self->pred_start[index];
    return index_list(self->preds + first,
                      self->pred_start[index + 1] - first);
}

/*[clinic input]
_heap.Snapshot.path

    index: Py_ssize_t
    /

The indexes of the records on a shortest path from the root.
[clinic start generated code]*/

static PyObject *
_heap_Snapshot_path_impl(SnapshotObject *self, Py_ssize_t index)
/*[clinic end generated code: output=fd897c343923dcae input=6ee66d5fa52cbe9b]*/
{
    if (check_index(self, index) < 0 || compute_preds(self) < 0) {
        return NULL;
    }
    PyObject *path = PyList_New(0);
    /* A record's first predecessor is the one the walk reached it from,
       one step nearer the root. */
    for (int32_t i = (int32_t)index; path != NULL; ) {
        PyObject *item = PyLong_FromLong(i);
        if (item == NULL || PyList_Append(path, item) < 0) {
            Py_XDECREF(item);
            Py_CLEAR(path);
            break;
        }
        Py_DECREF(item);
        if (i == 0) {
            break;
        }
        assert(self->pred_start[i] < self->pred_start[i + 1]);
        assert(self->preds[self->pred_start[i]] < i);
        i = self->preds[self->pred_start[i]];
    }
    if (path != NULL && PyList_Reverse(path) < 0) {
        Py_CLEAR(path);
    }
    return path;
}

/*[clinic input]
_heap.Snapshot.dominator

    index: Py_ssize_t
    /

The index of a record's immediate dominator (0's is 0).
[clinic start generated code]*/

static PyObject *
_heap_Snapshot_dominator_impl(SnapshotObject *self, Py_ssize_t index)
/*[clinic end generated code: output=65fb18212fadb414 input=7dfeea449546c90e]*/
{
    if (check_index(self, index) < 0 || compute_dominators(self) < 0) {
        return NULL;
    }
    return PyLong_FromLong(self->idom[index]);
}

/*[clinic input]
_heap.Snapshot.retained

    index: Py_ssize_t
    /

A record's own size and that of every record it dominates.
[clinic start generated code]*/

static PyObject *
_heap_Snapshot_retained_impl(SnapshotObject *self, Py_ssize_t index)
/*[clinic end generated code: output=d1ea0641d9d297c0 input=c424a01688c70c2d]*/
{
    if (check_index(self, index) < 0 || compute_dominators(self) < 0) {
        return NULL;
    }
    return PyLong_FromUnsignedLongLong(self->retained[index]);
}

/*[clinic input]
_heap.Snapshot.summary

A list of (type name, count, own bytes, retained bytes) per type.

A type's retained bytes are those of its records that no record of the
same type dominates: nested objects of a type are not counted twice.
[clinic start generated code]*/

static PyObject *
_heap_Snapshot_summary_impl(SnapshotObject *self)
/*[clinic end generated code: output=4629bf9140236854 input=98b4d82b83e74b96]*/
{
    if (compute_dominators(self) < 0) {
        return NULL;
    }
    uint32_t n = self->nrecords;
    Py_ssize_t ntypes = PyList_GET_SIZE(self->type_names);
    uint64_t *counts = PyMem_RawCalloc(ntypes * 3 + 1, sizeof(uint64_t));
    uint32_t *open = PyMem_RawCalloc(ntypes + 1, sizeof(uint32_t));
    /* The dominator tree as a compressed sparse row, then walked depth
       first: a record's retained size counts for its type when no record
       of its type is open above it. */
    uint32_t *start = PyMem_RawCalloc((size_t)n + 2, sizeof(uint32_t));
    int32_t *kids = PyMem_RawMalloc(((size_t)n + 1) * sizeof(int32_t));
    uint32_t *stack = PyMem_RawMalloc(((size_t)n + 1) * sizeof(uint32_t));
    uint32_t *cursor = PyMem_RawMalloc(((size_t)n + 1) * sizeof(uint32_t));
    PyObject *rows = NULL;
    if (!counts || !open || !start || !kids || !stack || !cursor) {
        PyErr_NoMemory();
        goto done;
    }
    for (uint32_t v = 1; v < n; v++) {
        start[self->idom[v] + 2]++;
    }
    for (uint32_t v = 0; v < n; v++) {
        start[v + 2] += start[v + 1];
    }
    for (uint32_t v = 1; v < n; v++) {
        kids[start[self->idom[v] + 1]++] = (int32_t)v;
    }
    /* start[v] .. start[v + 1] now hold v's children. */
    uint32_t depth = 0;
    stack[depth] = 0;
    cursor[depth++] = start[0];
    open[TYPE_INDEX(self->records[0].type)]++;
    while (depth > 0) {
        uint32_t v = stack[depth - 1];
        if (cursor[depth - 1] < start[v + 1]) {
            uint32_t w = (uint32_t)kids[cursor[depth - 1]++];
            uint32_t t = TYPE_INDEX(self->records[w].type);
            counts[3 * t]++;
            counts[3 * t + 1] += record_size(self, w);
            if (open[t] == 0) {
                counts[3 * t + 2] += self->retained[w];
            }
            open[t]++;
            stack[depth] = w;
            cursor[depth++] = start[w];
            continue;
        }
        open[TYPE_INDEX(self->records[v].type)]--;
        depth--;
    }
    rows = PyList_New(0);
    for (Py_ssize_t t = 0; rows != NULL && t < ntypes; t++) {
        if (counts[3 * t] == 0) {
            continue;
        }
        PyObject *row = Py_BuildValue(
            "(OKKK)", PyList_GET_ITEM(self->type_names, t),
            (unsigned long long)counts[3 * t],
            (unsigned long long)counts[3 * t + 1],
            (unsigned long long)counts[3 * t + 2]);
        if (row == NULL || PyList_Append(rows, row) < 0) {
            Py_XDECREF(row);
            Py_CLEAR(rows);
        }
        Py_XDECREF(row);
    }
done:
    PyMem_RawFree(counts);
    PyMem_RawFree(open);
    PyMem_RawFree(start);
    PyMem_RawFree(kids);
    PyMem_RawFree(stack);
    PyMem_RawFree(cursor);
    return rows;
}

typedef struct {
    uint32_t *ids;
    IndexTable table;
} IdTable;

static uint32_t
hash_of_id(void *owner, int32_t index)
{
    return table_hash(NULL, ((IdTable *)owner)->ids[index]);
}

static int
id_matches(void *owner, int32_t index, const void *key)
{
    return ((IdTable *)owner)->ids[index] == *(const uint32_t *)key;
}

/* Per type name of `snap`, the count and bytes of the records not marked
   in `matched`, into the dict `out` (name: [count, bytes]). */
static int
tally_unmatched(SnapshotObject *snap, const uint8_t *matched, PyObject *out)
{
    Py_ssize_t ntypes = PyList_GET_SIZE(snap->type_names);
    uint64_t *sums = PyMem_RawCalloc(2 * ntypes + 1, sizeof(uint64_t));
    if (sums == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    for (uint32_t i = 0; i < snap->nrecords; i++) {
        Record *r = &snap->records[i];
        if (!matched[i] && !(r->type & VIRTUAL_FLAG)) {
            sums[2 * TYPE_INDEX(r->type)]++;
            sums[2 * TYPE_INDEX(r->type) + 1] += record_size(snap, i);
        }
    }
    int err = 0;
    for (Py_ssize_t t = 0; t < ntypes && !err; t++) {
        if (sums[2 * t] == 0) {
            continue;
        }
        PyObject *name = PyList_GET_ITEM(snap->type_names, t);
        PyObject *row = PyDict_GetItemWithError(out, name);
        unsigned long long count = sums[2 * t], bytes = sums[2 * t + 1];
        if (row != NULL) {
            count += PyLong_AsUnsignedLongLong(PyTuple_GET_ITEM(row, 0));
            bytes += PyLong_AsUnsignedLongLong(PyTuple_GET_ITEM(row, 1));
        }
        else if (PyErr_Occurred()) {
            err = -1;
            break;
        }
        PyObject *sum = Py_BuildValue("(KK)", count, bytes);
        err = sum == NULL || PyDict_SetItem(out, name, sum) < 0 ? -1 : 0;
        Py_XDECREF(sum);
    }
    PyMem_RawFree(sums);
    return err;
}

/*[clinic input]
_heap.Snapshot.diff

    older as older_object: object
    /

What is new in this snapshot and gone since the older one.

Returns (new, gone): dicts of type name to (count, bytes).  Objects match
by id.
[clinic start generated code]*/

static PyObject *
_heap_Snapshot_diff(SnapshotObject *self, PyObject *older_object)
/*[clinic end generated code: output=5a0c2d1e39cce906 input=7612d612016a6a58]*/
{
    if (!Py_IS_TYPE(older_object, Py_TYPE(self))) {
        PyErr_Format(PyExc_TypeError, "can only diff a Snapshot, not "
                     "%.200s", Py_TYPE(older_object)->tp_name);
        return NULL;
    }
    SnapshotObject *older = (SnapshotObject *)older_object;
    if (older->pid != self->pid) {
        PyErr_SetString(PyExc_ValueError,
                        "the snapshots were taken in different processes: "
                        "their ids do not match");
        return NULL;
    }
    IdTable ids = {older->ids, {0}};
    uint8_t *matched_new = PyMem_RawCalloc(self->nrecords + 1, 1);
    uint8_t *matched_old = PyMem_RawCalloc(older->nrecords + 1, 1);
    PyObject *new = PyDict_New(), *gone = PyDict_New(), *result = NULL;
    if (matched_new == NULL || matched_old == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    if (new == NULL || gone == NULL) {
        goto done;
    }
    for (uint32_t i = 0; i < older->nrecords; i++) {
        if (table_reserve(&ids.table, 2, &ids, hash_of_id) < 0) {
            PyErr_NoMemory();
            goto done;
        }
        table_add(&ids.table, table_hash(NULL, older->ids[i]), (int32_t)i);
    }
    for (uint32_t i = 0; i < self->nrecords; i++) {
        int32_t j = table_find(&ids.table, table_hash(NULL, self->ids[i]),
                               &ids, &self->ids[i], id_matches);
        if (j >= 0) {
            matched_new[i] = matched_old[j] = 1;
        }
    }
    if (tally_unmatched(self, matched_new, new) == 0
        && tally_unmatched(older, matched_old, gone) == 0)
    {
        result = PyTuple_Pack(2, new, gone);
    }
done:
    table_clear(&ids.table);
    PyMem_RawFree(matched_new);
    PyMem_RawFree(matched_old);
    Py_XDECREF(new);
    Py_XDECREF(gone);
    return result;
}

/* Writing a .heapsnapshot, through a buffer. */

typedef struct {
    FILE *file;
    char buffer[1 << 16];
    size_t used;
    int failed;
} Writer;

static void
write_bytes(Writer *w, const char *data, size_t size)
{
    if (w->used + size > sizeof(w->buffer)) {
        if (fwrite(w->buffer, 1, w->used, w->file) != w->used) {
            w->failed = 1;
        }
        w->used = 0;
        if (size > sizeof(w->buffer)) {
            if (fwrite(data, 1, size, w->file) != size) {
                w->failed = 1;
            }
            return;
        }
    }
    memcpy(w->buffer + w->used, data, size);
    w->used += size;
}

static void
write_text(Writer *w, const char *text)
{
    write_bytes(w, text, strlen(text));
}

static void
write_number(Writer *w, uint64_t value, char after)
{
    char digits[24];
    int i = (int)sizeof(digits);
    digits[--i] = after;
    do {
        digits[--i] = (char)('0' + value % 10);
        value /= 10;
    } while (value);
    write_bytes(w, digits + i, sizeof(digits) - (size_t)i);
}

/* A JSON string, from a str. */
static int
write_string(Writer *w, PyObject *text)
{
    Py_ssize_t size;
    const char *utf8 = PyUnicode_AsUTF8AndSize(text, &size);
    if (utf8 == NULL) {
        return -1;
    }
    write_bytes(w, "\"", 1);
    for (Py_ssize_t i = 0; i < size; i++) {
        unsigned char c = (unsigned char)utf8[i];
        if (c == '"' || c == '\\') {
            char escaped[2] = {'\\', (char)c};
            write_bytes(w, escaped, 2);
        }
        else if (c < 0x20) {
            char escaped[8];
            PyOS_snprintf(escaped, sizeof(escaped), "\\u%04x", c);
            write_bytes(w, escaped, 6);
        }
        else {
            write_bytes(w, (const char *)&c, 1);
        }
    }
    write_bytes(w, "\"", 1);
    return 0;
}

/* DevTools' node and edge fields, and the types we use. */
#define NODE_FIELDS 7
enum {NODE_OBJECT = 3, NODE_SYNTHETIC = 9};
enum {EDGE_ELEMENT = 1, EDGE_PROPERTY = 2};

static const char heapsnapshot_meta[] =
    "{\"snapshot\":{\"meta\":{"
    "\"node_fields\":[\"type\",\"name\",\"id\",\"self_size\",\"edge_count\","
    "\"trace_node_id\",\"detachedness\"],"
    "\"node_types\":[[\"hidden\",\"array\",\"string\",\"object\",\"code\","
    "\"closure\",\"regexp\",\"number\",\"native\",\"synthetic\","
    "\"concatenated string\",\"sliced string\",\"symbol\",\"bigint\","
    "\"object shape\"],\"string\",\"number\",\"number\",\"number\","
    "\"number\",\"number\"],"
    "\"edge_fields\":[\"type\",\"name_or_index\",\"to_node\"],"
    "\"edge_types\":[[\"context\",\"element\",\"property\",\"internal\","
    "\"hidden\",\"shortcut\",\"weak\"],\"string_or_number\",\"node\"],"
    "\"trace_function_info_fields\":[\"function_id\",\"name\","
    "\"script_name\",\"script_id\",\"line\",\"column\"],"
    "\"trace_node_fields\":[\"id\",\"function_info_index\",\"count\","
    "\"size\",\"children\"],"
    "\"sample_fields\":[\"timestamp_us\",\"last_assigned_id\"],"
    "\"location_fields\":[\"object_index\",\"script_id\",\"line\","
    "\"column\"]},";

/*[clinic input]
_heap.Snapshot.write_heapsnapshot

    path: object
    /

Write the snapshot in the Chrome DevTools .heapsnapshot format.
[clinic start generated code]*/

static PyObject *
_heap_Snapshot_write_heapsnapshot(SnapshotObject *self, PyObject *path)
/*[clinic end generated code: output=5a11f87f415cfbe7 input=dc6fc780d3962432]*/
{
    PyObject *bytes_path;
    if (!PyUnicode_FSConverter(path, &bytes_path)) {
        return NULL;
    }
    Writer *w = PyMem_RawMalloc(sizeof(Writer));
    if (w == NULL) {
        Py_DECREF(bytes_path);
        return PyErr_NoMemory();
    }
    w->used = 0;
    w->failed = 0;
    Py_BEGIN_ALLOW_THREADS
    w->file = fopen(PyBytes_AS_STRING(bytes_path), "wb");
    Py_END_ALLOW_THREADS
    if (w->file == NULL) {
        PyErr_SetFromErrnoWithFilenameObject(PyExc_OSError, path);
        Py_DECREF(bytes_path);
        PyMem_RawFree(w);
        return NULL;
    }
    Py_DECREF(bytes_path);
    write_text(w, heapsnapshot_meta);
    write_text(w, "\"node_count\":");
    write_number(w, self->nrecords, ',');
    write_text(w, "\"edge_count\":");
    write_number(w, self->nedges, ',');
    write_text(w, "\"trace_function_count\":0},\n\"nodes\":[");
    for (uint32_t i = 0; i < self->nrecords; i++) {
        Record *r = &self->records[i];
        if (i) {
            write_bytes(w, ",", 1);
        }
        write_number(w, r->type & VIRTUAL_FLAG ? NODE_SYNTHETIC
                                               : NODE_OBJECT, ',');
        write_number(w, TYPE_INDEX(r->type), ',');
        write_number(w, self->ids[i], ',');
        write_number(w, record_size(self, i), ',');
        write_number(w, edges_end(self, i) - r->first_edge, ',');
        write_text(w, "0,0\n");
    }
    write_text(w, "],\n\"edges\":[");
    uint32_t named = 0;
    uint64_t ntypes = (uint64_t)PyList_GET_SIZE(self->type_names);
    for (uint32_t i = 0; i < self->nrecords; i++) {
        uint32_t first = self->records[i].first_edge;
        for (uint32_t e = first; e < edges_end(self, i); e++) {
            if (e) {
                write_bytes(w, ",", 1);
            }
            if (named < self->nnamed_edges
                && self->named_edges[named].edge == e)
            {
                write_number(w, EDGE_PROPERTY, ',');
                write_number(w, ntypes + self->named_edges[named++].name,
                             ',');
            }
            else {
                write_number(w, EDGE_ELEMENT, ',');
                write_number(w, e - first, ',');
            }
            write_number(w, (uint64_t)self->edges[e] * NODE_FIELDS, '\n');
        }
    }
    write_text(w, "],\n\"trace_function_infos\":[],\"trace_tree\":[],"
                  "\"samples\":[],\"locations\":[],\n\"strings\":[");
    int err = 0;
    PyObject *lists[] = {self->type_names, self->edge_names};
    for (int l = 0; l < 2 && !err; l++) {
        for (Py_ssize_t t = 0; t < PyList_GET_SIZE(lists[l]); t++) {
            if (l || t) {
                write_bytes(w, ",", 1);
            }
            if (write_string(w, PyList_GET_ITEM(lists[l], t)) < 0) {
                err = -1;
                break;
            }
        }
    }
    write_text(w, "]}\n");
    if (!err && w->used && fwrite(w->buffer, 1, w->used, w->file) != w->used)
    {
        w->failed = 1;
    }
    int closed = fclose(w->file);
    if (!err && (w->failed || closed != 0)) {
        PyErr_SetFromErrnoWithFilenameObject(PyExc_OSError, path);
        err = -1;
    }
    PyMem_RawFree(w);
    if (err) {
        return NULL;
    }
    Py_RETURN_NONE;
}

/*[clinic input]
_heap.Snapshot.info

How the scan went: a dict.
[clinic start generated code]*/

static PyObject *
_heap_Snapshot_info_impl(SnapshotObject *self)
/*[clinic end generated code: output=8d15562faf9976b4 input=6c6228247d8cedf8]*/
{
    uint64_t bytes = 0, objects = 0;
    for (uint32_t i = 0; i < self->nrecords; i++) {
        if (!(self->records[i].type & VIRTUAL_FLAG)) {
            bytes += record_size(self, i);
            objects++;
        }
    }
    size_t scratch = (size_t)self->records_capacity * sizeof(Record)
                     + (size_t)self->edges_capacity * sizeof(int32_t)
                     + (size_t)self->nrecords * sizeof(uint32_t)
                     + (size_t)self->lookup_slots * sizeof(int32_t)
                     + (size_t)self->aliases_capacity * sizeof(Alias)
                     + (size_t)self->big_sizes_capacity * sizeof(BigSize)
                     + (size_t)self->named_edges_capacity
                       * sizeof(NamedEdge);
    return Py_BuildValue(
        "{sIsKsKsIsIsKsKsIsdslsnsnsN}",
        "records", self->nrecords,
        "objects", (unsigned long long)objects,
        "bytes", (unsigned long long)bytes,
        "edges", self->nedges,
        "folded", self->naliases,
        "unreachable_objects", (unsigned long long)self->unreachable_objects,
        "unreachable_bytes", (unsigned long long)self->unreachable_bytes,
        "held_from_c", self->held_from_c,
        "seconds", self->seconds,
        "pid", self->pid,
        "scanner_bytes", (Py_ssize_t)scratch,
        "scan_peak_bytes", (Py_ssize_t)self->peak_bytes,
        "total_memory_used", self->total_memory < 0 ? Py_NewRef(Py_None)
                             : PyLong_FromLongLong(self->total_memory));
}

static PyMethodDef snapshot_methods[] = {
    _HEAP_SNAPSHOT_RECORD_METHODDEF
    _HEAP_SNAPSHOT_FIND_METHODDEF
    _HEAP_SNAPSHOT_CHILDREN_METHODDEF
    _HEAP_SNAPSHOT_EDGE_NAME_METHODDEF
    _HEAP_SNAPSHOT_REFERRERS_METHODDEF
    _HEAP_SNAPSHOT_PATH_METHODDEF
    _HEAP_SNAPSHOT_DOMINATOR_METHODDEF
    _HEAP_SNAPSHOT_RETAINED_METHODDEF
    _HEAP_SNAPSHOT_SUMMARY_METHODDEF
    _HEAP_SNAPSHOT_DIFF_METHODDEF
    _HEAP_SNAPSHOT_WRITE_HEAPSNAPSHOT_METHODDEF
    _HEAP_SNAPSHOT_INFO_METHODDEF
    {NULL, NULL}
};

static PyType_Slot snapshot_slots[] = {
    {Py_tp_doc,
     (void *)PyDoc_STR("A heap snapshot, as _heap.scan() takes it.")},
    {Py_tp_dealloc, snapshot_dealloc},
    {Py_tp_traverse, snapshot_traverse},
    {Py_tp_methods, snapshot_methods},
    {Py_sq_length, snapshot_length},
    {0, 0}
};

static PyType_Spec snapshot_spec = {
    .name = "_heap.Snapshot",
    .basicsize = sizeof(SnapshotObject),
    .flags = (Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC
              | Py_TPFLAGS_IMMUTABLETYPE | Py_TPFLAGS_DISALLOW_INSTANTIATION),
    .slots = snapshot_slots,
};


/* The module */

/* Wait, with the GIL released, while another thread is inside a
   collection: a finalizer it runs can let this thread go on, and the
   collector's lists are half sorted until it ends. */
static void
wait_for_collector(PyThreadState *tstate)
{
    while (tstate->interp->gc.collector != NULL) {
        assert(tstate->interp->gc.collector != tstate);
        Py_BEGIN_ALLOW_THREADS
        struct timespec pause = {.tv_nsec = 100000};
        nanosleep(&pause, NULL);
        Py_END_ALLOW_THREADS
    }
}

/*[clinic input]
_heap.scan

    roots: object
    *
    object_rules: object = None
    type_rule: object = None
    virtual_type: object = None
    previous: object = None
    progress: bool = False

Scan the heap from the default roots and `roots` (a sequence).

object_rules maps ids to rules; type_rule(type) gives a type's rule or
None.  A rule is (size, children): size None (the default), an int or a
callable(obj) giving one; children None (what tp_traverse visits), () or
a callable(obj) giving an iterable.  Objects of virtual_type stand for
memory that is no object: their name, size and children attributes say
what.  Records take the ids of the same objects in previous (by default
the snapshot taken last, if it is alive).  progress reports on stderr.
[clinic start generated code]*/

static PyObject *
_heap_scan_impl(PyObject *module, PyObject *roots, PyObject *object_rules,
                PyObject *type_rule, PyObject *virtual_type,
                PyObject *previous, int progress)
/*[clinic end generated code: output=69f17d40645e6589 input=2f1ff402f0b4316e]*/
{
    PyObject *snapshot_type = PyObject_GetAttrString(module, "Snapshot");
    if (snapshot_type == NULL) {
        return NULL;
    }
    if (previous != Py_None
        && !PyObject_TypeCheck(previous, (PyTypeObject *)snapshot_type))
    {
        PyErr_Format(PyExc_TypeError, "previous must be a Snapshot or None, "
                     "not %.200s", Py_TYPE(previous)->tp_name);
        Py_DECREF(snapshot_type);
        return NULL;
    }
    if (type_rule != Py_None && !PyCallable_Check(type_rule)) {
        PyErr_SetString(PyExc_TypeError, "type_rule must be callable");
        Py_DECREF(snapshot_type);
        return NULL;
    }
    if (virtual_type != Py_None && !PyType_Check(virtual_type)) {
        PyErr_SetString(PyExc_TypeError, "virtual_type must be a type");
        Py_DECREF(snapshot_type);
        return NULL;
    }
    PyThreadState *tstate = _PyThreadState_GET();
    if (scanning == tstate) {
        PyErr_SetString(PyExc_RuntimeError,
                        "a heap scan is running: a rule cannot take a "
                        "snapshot");
        Py_DECREF(snapshot_type);
        return NULL;
    }
    if (tstate->interp->gc.collector == tstate) {
        PyErr_SetString(PyExc_RuntimeError,
                        "a finalizer that the garbage collector runs cannot "
                        "take a snapshot");
        Py_DECREF(snapshot_type);
        return NULL;
    }
    PyObject *root_list = PySequence_Fast(roots, "roots must be a sequence");
    if (root_list == NULL) {
        Py_DECREF(snapshot_type);
        return NULL;
    }
    SnapshotObject *snap = PyObject_GC_New(SnapshotObject,
                                           (PyTypeObject *)snapshot_type);
    Py_DECREF(snapshot_type);
    if (snap == NULL) {
        Py_DECREF(root_list);
        return NULL;
    }
    /* A scan that runs in another thread (while its rules run Python
       code) ends first. */
    if (!PyThread_acquire_lock(scan_lock, NOWAIT_LOCK)) {
        Py_BEGIN_ALLOW_THREADS
        PyThread_acquire_lock(scan_lock, WAIT_LOCK);
        Py_END_ALLOW_THREADS
    }
    memset((char *)snap + sizeof(PyObject), 0,
           sizeof(SnapshotObject) - sizeof(PyObject));
    snap->pid = (long)getpid();
    snap->type_names = PyList_New(0);
    snap->edge_names = PyList_New(0);
    Scan scan = {.snap = snap, .type_rule = type_rule,
                 .virtual_type = virtual_type == Py_None
                                 ? NULL : (PyTypeObject *)virtual_type,
                 .progress = progress};
    scan.names_to_types = PyDict_New();
    scan.edge_name_indexes = PyDict_New();
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    wait_for_collector(tstate);
    scanning = tstate;
    int gc_was_enabled = PyGC_Disable();
    uint32_t held_edge = 0;
    SnapshotObject *prev = previous != Py_None ? (SnapshotObject *)previous
                                               : last_snapshot;
    if (prev != NULL && prev->pid != snap->pid) {
        prev = NULL;
    }
    /* Held: rules may run Python code, and other threads then, which
       may let it go. */
    Py_XINCREF(prev);
    int err = (snap->type_names == NULL
               || (prev != NULL && presize(snap, prev) < 0)
               || scan.names_to_types == NULL
               || snap->edge_names == NULL || scan.edge_name_indexes == NULL
               || read_object_rules(&scan, object_rules) < 0
               || add_roots(&scan, root_list, &held_edge) < 0
               || walk(&scan, 0) < 0
               || walk_held_from_c(&scan, held_edge) < 0);
    if (!err && compact(snap) < 0) {
        err = 1;
    }
    if (!err) {
        snap->ids = PyMem_RawMalloc(((size_t)snap->nrecords + 1)
                                    * sizeof(uint32_t));
        if (snap->ids == NULL || assign_ids(snap, prev) < 0) {
            PyErr_NoMemory();
            err = 1;
        }
    }
    if (err && !PyErr_Occurred()) {
        PyErr_NoMemory();
    }
    /* The references and rules go while the collector is still off, so
       that what they free is not collected under the scan. */
    PyObject *exc_type, *exc_value, *exc_tb;
    PyErr_Fetch(&exc_type, &exc_value, &exc_tb);
    release_scan(&scan);
    PyErr_Restore(exc_type, exc_value, exc_tb);
    if (gc_was_enabled) {
        PyGC_Enable();
    }
    scanning = NULL;
    PyThread_release_lock(scan_lock);
    Py_DECREF(root_list);
    if (progress) {
        fprintf(stderr, "\rprofiling.heap: %u objects scanned\n",
                snap->nrecords);
    }
    clock_gettime(CLOCK_MONOTONIC, &t1);
    snap->seconds = (double)(t1.tv_sec - t0.tv_sec)
                    + (double)(t1.tv_nsec - t0.tv_nsec) * 1e-9;
    Py_XDECREF(prev);
#ifdef Py_TRACK_MEMORY
    /* Once the scan's own arrays are gone: what is left of its memory is
       the snapshot's. */
    snap->total_memory = _PyMemTrack_TotalBytes();
#else
    snap->total_memory = -1;
#endif
    PyObject_GC_Track(snap);
    if (err) {
        Py_DECREF(snap);
        return NULL;
    }
    last_snapshot = snap;
    return (PyObject *)snap;
}

static PyObject *
method_of(PyTypeObject *type)
{
    return _PyType_Lookup(type, &_Py_ID(__sizeof__));
}

static int
heap_exec(PyObject *module)
{
    if (scan_lock == NULL) {
        scan_lock = PyThread_allocate_lock();
        if (scan_lock == NULL) {
            PyErr_NoMemory();
            return -1;
        }
    }
    for (int i = 0; i < NAMES; i++) {
        if (names[i] == NULL) {
            names[i] = PyUnicode_InternFromString(name_texts[i]);
            if (names[i] == NULL) {
                return -1;
            }
        }
    }
    PyTypeObject *sizers[SIZER_CALL] = {
        [SIZER_OBJECT] = &PyBaseObject_Type,
        [SIZER_LIST] = &PyList_Type,
        [SIZER_DICT] = &PyDict_Type,
        [SIZER_SET] = &PySet_Type,
        [SIZER_STR] = &PyUnicode_Type,
        [SIZER_INT] = &PyLong_Type,
        [SIZER_BYTEARRAY] = &PyByteArray_Type,
    };
    for (int i = 0; i < SIZER_CALL; i++) {
        PyObject *method = method_of(sizers[i]);
        if (method == NULL || !Py_IS_TYPE(method, &PyMethodDescr_Type)) {
            PyErr_Format(PyExc_SystemError, "%s.__sizeof__ is not a method",
                         sizers[i]->tp_name);
            return -1;
        }
        known_sizeof[i] = ((PyMethodDescrObject *)method)->d_method->ml_meth;
    }
    PyObject *type = PyType_FromModuleAndSpec(module, &snapshot_spec, NULL);
    if (type == NULL || PyModule_AddType(module, (PyTypeObject *)type) < 0) {
        Py_XDECREF(type);
        return -1;
    }
    Py_DECREF(type);
    return 0;
}

static PyModuleDef_Slot heap_slots[] = {
    {Py_mod_exec, heap_exec},
    {0, NULL}
};

static PyMethodDef heap_functions[] = {
    _HEAP_SCAN_METHODDEF
    {NULL, NULL}
};

static struct PyModuleDef heap_module = {
    PyModuleDef_HEAD_INIT,
    .m_name = "_heap",
    .m_doc = "The heap scanner of profiling.heap.",
    .m_size = 0,
    .m_methods = heap_functions,
    .m_slots = heap_slots,
};

PyMODINIT_FUNC
PyInit__heap(void)
{
    return PyModuleDef_Init(&heap_module);
}
