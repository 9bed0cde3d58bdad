"""profiling.heap: what holds the memory, by type and by path.

snapshot() walks the object graph from the roots (the frames of every
thread, sys.modules, builtins and the objects given) in C, and returns a
Snapshot: a record per object with its size, type and referents.  From it
come a summary by type, the dominator tree and retained sizes, shortest
paths from a root ("why is this alive?"), referrers, the diff of two
snapshots, and Chrome DevTools' .heapsnapshot format.

What is counted and how is ruled by Rules: four tables tried in order, by
object, by exact type, by type and its subclasses ("instance"), and by
type excluding its bases ("type"), composed along the MRO.
"""

import csv
import io
import json
import os
import weakref
from collections import namedtuple

import _heap

__all__ = ["Ignored", "Virtual", "Rule", "Rules", "Snapshot", "Node",
           "TypeRow", "DiffRow", "snapshot"]


class Ignored:
    """A marker class: instances of its subclasses count for nothing and
    refer to nothing (the default rules say so)."""

    __slots__ = ()


class Virtual:
    """A record for memory that is no Python object: a name (its type in
    the snapshot), a size in bytes and the objects it refers to."""

    __slots__ = ("name", "size", "children")

    def __init__(self, name, size=0, children=()):
        if not isinstance(name, str):
            raise TypeError(f"name must be a str, not {type(name).__name__}")
        if not isinstance(size, int) or size < 0:
            raise ValueError(f"size must be an int >= 0, not {size!r}")
        self.name = name
        self.size = size
        self.children = tuple(children)

    def __repr__(self):
        return f"Virtual({self.name!r}, {self.size})"


class Rule(namedtuple("Rule", "size children", defaults=(None, None))):
    """How to count an object.

    size: None (the default: sys.getsizeof's answer on a plain build, the
    allocator's bytes on a --with-memory-tracking build), an int, or a
    callable(obj) returning an int.  children: None (what the type's
    tp_traverse visits), () (none), or a callable(obj) returning an
    iterable of objects.  A field left None falls through to the next
    table, then to the default."""

    __slots__ = ()

    def __new__(cls, size=None, children=None):
        if not (size is None or callable(size)
                or (type(size) is int and size >= 0)):
            raise TypeError(f"size must be None, an int >= 0 or a callable, "
                            f"not {size!r}")
        if not (children is None or callable(children) or children == ()):
            raise TypeError(f"children must be None, () or a callable, "
                            f"not {children!r}")
        if children is not None and not callable(children):
            children = ()
        return super().__new__(cls, size, children)


def _type_name(t):
    return f"{t.__module__}.{t.__qualname__}"


class _Table(dict):
    """A rule table keyed by types or type names ("builtins.dict")."""

    def __init__(self, rules, what):
        super().__init__()
        self._rules = rules
        self._what = what

    def _key(self, key):
        if isinstance(key, type):
            return key
        if isinstance(key, str):
            return key
        raise TypeError(f"a {self._what} rule's key must be a type or a "
                        f"type's name, not {type(key).__name__}")

    def __setitem__(self, key, rule):
        if not isinstance(rule, Rule):
            raise TypeError(f"a rule must be a Rule, not "
                            f"{type(rule).__name__}")
        super().__setitem__(self._key(key), rule)
        self._rules._changed()

    def __delitem__(self, key):
        super().__delitem__(self._key(key))
        self._rules._changed()

    def rule_for(self, t):
        return self.get(t) or self.get(_type_name(t))


class _ObjectTable(dict):
    """Rules by object: keys are ids, or the objects (kept alive here so
    that their ids stay theirs)."""

    def __init__(self):
        super().__init__()
        self._kept = {}

    def __setitem__(self, key, rule):
        if not isinstance(rule, Rule):
            raise TypeError(f"a rule must be a Rule, not "
                            f"{type(rule).__name__}")
        if type(key) is not int:
            self._kept[id(key)] = key
            key = id(key)
        super().__setitem__(key, rule)

    def __delitem__(self, key):
        if type(key) is not int:
            key = id(key)
        super().__delitem__(key)
        self._kept.pop(key, None)


class Rules:
    """The four rule tables, tried in order for each object:

    - object: by object (an id or the object itself);
    - wholetype: by exact type (a type, or its "module.qualname");
    - instance: by type and its subclasses;
    - type: by type excluding its bases: the rules of the classes of an
      object's MRO compose, the nearest class's fields first.

    The composed rule of each type is cached, and computed again when the
    tables or the type's MRO change.  instance[Ignored] is set: size 0,
    no children."""

    def __init__(self):
        self.object = _ObjectTable()
        self.wholetype = _Table(self, "wholetype")
        self.instance = _Table(self, "instance")
        self.type = _Table(self, "type")
        self._cache = weakref.WeakKeyDictionary()
        self.instance[Ignored] = Rule(0, ())

    def _changed(self):
        self._cache.clear()

    def rule_for_type(self, t):
        """The rule composed for objects of type t, or None for the
        defaults."""
        # Weakly keyed, and checked by the ids of the MRO: the cache keeps
        # no type alive.
        mro = tuple(map(id, t.__mro__))
        cached = self._cache.get(t)
        if cached is not None and cached[0] == mro:
            return cached[1]
        size = children = None
        chain = [self.wholetype.rule_for(t)]
        chain += [self.instance.rule_for(base) for base in t.__mro__]
        chain += [self.type.rule_for(base) for base in t.__mro__]
        for rule in chain:
            if rule is None:
                continue
            if size is None:
                size = rule.size
            if children is None:
                children = rule.children
            if size is not None and children is not None:
                break
        result = (None if size is None and children is None
                  else (size, children))
        self._cache[t] = (mro, result)
        return result

    def _object_rules(self):
        return {key: (rule.size, rule.children)
                for key, rule in dict.items(self.object)}


default_rules = Rules()

Node = namedtuple("Node", "index id type size address")
Node.__doc__ = """A record: its index in the snapshot, its id (stable from
one snapshot to the next), its type's name, its size in bytes, and the
object's address (None for a virtual record)."""

TypeRow = namedtuple("TypeRow", "type count size retained")
DiffRow = namedtuple("DiffRow", "type new_count new_size gone_count "
                                "gone_size")


def snapshot(roots=None, rules=None, *, previous=None, progress=False):
    """Walk the heap and return a Snapshot.

    roots: more objects to walk from, besides the frames of every thread,
    sys.modules and builtins.  rules: a Rules (by default
    profiling.heap.default_rules).  previous: the snapshot whose ids this
    one takes over (by default the one taken last).  progress: report on
    stderr while scanning."""
    if rules is None:
        rules = default_rules
    elif not isinstance(rules, Rules):
        raise TypeError(f"rules must be a Rules, not "
                        f"{type(rules).__name__}")
    if previous is not None and not isinstance(previous, Snapshot):
        raise TypeError(f"previous must be a Snapshot, not "
                        f"{type(previous).__name__}")
    roots = [] if roots is None else list(roots)
    data = _heap.scan(roots, object_rules=rules._object_rules() or None,
                      type_rule=rules.rule_for_type, virtual_type=Virtual,
                      previous=None if previous is None else previous._data,
                      progress=progress)
    return Snapshot(data)


class Snapshot:
    """The records of one scan.  Objects are looked up by identity: an
    object must be alive, and be the one scanned at its address."""

    def __init__(self, data):
        self._data = data

    def __len__(self):
        return len(self._data)

    def __repr__(self):
        info = self._data.info()
        return (f"<profiling.heap.Snapshot: {info['objects']} objects, "
                f"{info['bytes']} bytes>")

    def info(self):
        """How the scan went: records, objects and their bytes, edges,
        dicts folded into their owners, unreachable objects and bytes
        (garbage the collector has not freed yet), objects held from C,
        seconds, pid and the snapshot's own bytes."""
        return self._data.info()

    def reconcile(self):
        """On a --with-memory-tracking build, sys.total_memory_used() when
        the scan ended, split: the bytes of the objects reached, of the
        tracked objects not reached (garbage, or hidden by rules), of the
        snapshot itself, and the rest, held outside objects (buffers not
        attributed to an object, the interpreter's own tables, frames'
        stacks, allocations of C code).  None on a plain build."""
        info = self.info()
        total = info["total_memory_used"]
        if total is None:
            return None
        parts = {"objects": info["bytes"],
                 "unreachable": info["unreachable_bytes"],
                 "snapshot": info["scanner_bytes"]}
        return {"total": total, **parts,
                "outside_objects": total - sum(parts.values())}

    def node(self, index):
        """The Node of a record by index (0 is the root)."""
        return Node(index, *self._data.record(index))

    def index(self, obj):
        """The index of an object's record; KeyError if not scanned."""
        index = self._data.find(id(obj))
        if index < 0:
            raise KeyError(f"{type(obj).__name__} object at {id(obj):#x} "
                           f"is not in the snapshot")
        return index

    def _node_of(self, obj):
        if isinstance(obj, Node):
            return obj.index
        return self.index(obj)

    def summary(self, key="retained"):
        """A TypeRow per type: count, own bytes, retained bytes (of the
        objects of the type that no object of the type dominates), sorted
        by key (descending)."""
        rows = [TypeRow(*row) for row in self._data.summary()]
        rows.sort(key=lambda r: (-getattr(r, key), r.type))
        return rows

    def size(self, obj):
        """An object's own size, in bytes."""
        return self.node(self._node_of(obj)).size

    def retained_size(self, obj):
        """The bytes an object keeps alive: its own and those of the
        objects it dominates."""
        return self._data.retained(self._node_of(obj))

    def dominator(self, obj):
        """The Node that dominates an object immediately."""
        return self.node(self._data.dominator(self._node_of(obj)))

    def children(self, obj):
        """The Nodes an object refers to."""
        return [self.node(i) for i in self._data.children(self._node_of(obj))]

    def referrers(self, obj):
        """The Nodes that refer to an object, nearest a root first."""
        return [self.node(i)
                for i in self._data.referrers(self._node_of(obj))]

    def path(self, obj):
        """The Nodes on a shortest path from the root to an object."""
        return [self.node(i) for i in self._data.path(self._node_of(obj))]

    def why(self, obj):
        """Why an object is alive: a shortest path from the root, a line a
        step, each with what the step is to the one before (a dict's key,
        an attribute's or a variable's name, or a position)."""
        path = self.path(obj)
        lines = [path[0].type]
        for parent, node in zip(path, path[1:]):
            name = self._data.edge_name(parent.index, node.index)
            label = f".{name}" if isinstance(name, str) else f"[{name}]"
            lines.append(f"  {label} -> {node.type} ({node.size} bytes, "
                         f"id {node.id})")
        return "\n".join(lines)

    def diff(self, older):
        """DiffRows per type, objects new in this snapshot and gone since
        the older one (matched by id), by new bytes."""
        if not isinstance(older, Snapshot):
            raise TypeError(f"can only diff a Snapshot, not "
                            f"{type(older).__name__}")
        new, gone = self._data.diff(older._data)
        rows = [DiffRow(name, *new.get(name, (0, 0)),
                        *gone.get(name, (0, 0)))
                for name in new.keys() | gone.keys()]
        rows.sort(key=lambda r: (r.gone_size - r.new_size, r.type))
        return rows

    def write_heapsnapshot(self, file):
        """Write Chrome DevTools' .heapsnapshot format to a path."""
        self._data.write_heapsnapshot(os.fspath(file))

    def write_summary(self, file, format="json"):
        """Write the summary by type as "json" or "csv" to a path."""
        rows = self.summary()
        if format == "json":
            text = json.dumps({"info": self.info(),
                               "types": [r._asdict() for r in rows]},
                              indent=1)
        elif format == "csv":
            out = io.StringIO()
            writer = csv.writer(out)
            writer.writerow(TypeRow._fields)
            writer.writerows(rows)
            text = out.getvalue()
        else:
            raise ValueError(f"format must be 'json' or 'csv', not "
                             f"{format!r}")
        with open(file, "w", encoding="utf-8", newline="") as f:
            f.write(text)

    def print_summary(self, top=20, file=None):
        """Print the top types by retained bytes."""
        info = self.info()
        print(f"{info['objects']} objects, {info['bytes']} bytes "
              f"({info['seconds'] * 1000:.1f} ms)", file=file)
        print(f"{'count':>10} {'own':>12} {'retained':>12}  type", file=file)
        for row in self.summary()[:top]:
            print(f"{row.count:>10} {row.size:>12} {row.retained:>12}  "
                  f"{row.type}", file=file)

