"""The edit journal: what a pass changed in the IR, so that a pass that fails half-way can be undone.

While a journal is open, the first change a pass makes to an IR object (a node, a value, a graph, the name
registry) saves that object's state as it was: every field, with its lists and dicts copied. Objects made
while the journal is open are not saved (nothing that existed before refers to them once the others are
restored). ``rollback`` puts every saved state back, which leaves the model exactly as it was when the
journal opened: an object the pass never changed needs nothing, and every one it changed is restored whole.

Changes are seen at three doors, so a pass needs no code of its own to be undoable:

- attribute assignment (``value.shape = ...``, ``node.op_type = ...``): while passes run (``hooks``) the IR
  classes get a ``__setattr__`` that saves the object first when a journal is open; outside a run they have
  none, so reading and writing IR objects costs nothing extra (loading, saving, verification);
- the IR's own mutators (``Node.set_input``, ``Graph.add_node``, ...), which change lists and dicts in place
  and call ``touch`` first;
- ``metadata`` and ``attributes`` dicts, which are ``TrackedDict``s that save themselves before a write (the
  IR makes them so; a plain dict a pass assigns to one of those fields becomes one).

The model's own fields (metadata, opset imports, functions) are saved when the journal opens: they are few.
Values inside attributes and initializer arrays are immutable by contract (arrays are read-only) and are
restored by reference. One journal is open at a time in a process (the engine runs one model per process),
except inside a *savepoint* (``Journal(model, savepoint=True)``): a journal opened while one is open nests in
it, and whatever the inner one saves the savepoint saves too (unless it already has, or made the object), so
rolling the savepoint back undoes a whole run of passes, each of which had a journal of its own. Auto mixed
precision builds the placement of one model many times so (``worker.engine.pinned_builds``).
"""
from __future__ import annotations

import contextlib
import copy
from typing import Any, Iterable

_active: "Journal | None" = None

#: Classes whose instances are saved on attribute assignment while a journal is open.
_JOURNALED: list[type] = []


def journaled(cls: type) -> type:
    """Class decorator: instances are saved by the open journal before an attribute is assigned.

    The class provides ``_journal_state() -> tuple`` and ``_journal_restore(state)``.
    """
    _JOURNALED.append(cls)
    return cls


def touch(obj: Any) -> None:
    """Save ``obj`` in the open journal before it changes (a no-op without one, or after the first call)."""
    journal = _active
    if journal is not None and obj is not None:  # Journal.save, its first test inlined (a hot path)
        key = id(obj)
        if key not in journal._saved and key not in journal.new:
            journal.save(obj)


def created(obj: Any) -> None:
    """``obj`` was just made: the open journal need not save it."""
    journal = _active
    if journal is not None:
        journal.new[id(obj)] = obj


#: Fields that hold TrackedDicts: a plain dict assigned to one is made one.
_TRACKED_FIELDS = frozenset({"metadata", "attributes"})


#: Immutable types whose equal values are interchangeable: writing an equal one changes nothing.
_PLAIN = frozenset({int, str, tuple, bool, float})
_MISSING = object()


def _saving_setattr(self, name: str, value: Any) -> None:
    journal = _active
    if journal is not None:  # Journal.save, inlined: this runs on every attribute write of a pass
        key = id(self)
        if key not in journal._saved and key not in journal.new:
            old = getattr(self, name, _MISSING)
            if old is value or (type(value) in _PLAIN and type(old) is type(value) and old == value):
                return  # type inference writes every value's type again each round: most change nothing
            journal.save(self)
    if name in _TRACKED_FIELDS and type(value) is not TrackedDict:
        value = tracked(value)
    object.__setattr__(self, name, value)


_hooked = 0


@contextlib.contextmanager
def hooks():
    """Keep the saving ``__setattr__`` on the IR classes for a whole run of passes (re-entrant).

    Adding or removing a class attribute resets what Python has learnt about the class (its method cache and
    the specialized attribute accesses of hot code), so a pass manager installs the hooks once per run rather
    than once per pass; between journals the hook only checks that none is open.
    """
    global _hooked
    if _hooked == 0:
        for cls in _JOURNALED:
            cls.__setattr__ = _saving_setattr
    _hooked += 1
    try:
        yield
    finally:
        _hooked -= 1
        if _hooked == 0:
            for cls in _JOURNALED:
                if "__setattr__" in cls.__dict__:
                    del cls.__setattr__


class Journal:
    """The undo log of one pass run; open it with ``with journal:`` (or ``open``/``close``)."""

    def __init__(self, model: Any = None, *, savepoint: bool = False) -> None:
        self.model = model
        #: Journals may open inside this one (each pass of a run in a savepoint opens its own).
        self.savepoint = savepoint
        #: The savepoint this journal is open in, or None.
        self.parent: "Journal | None" = None
        self._saved: dict[int, tuple[Any, tuple]] = {}
        #: Objects made while open, by id (kept alive so an id is never reused within the journal).
        self.new: dict[int, Any] = {}
        self._model_state: dict[str, Any] | None = None
        #: The last node the pass changed (the trace names it when the pass fails and nothing better is known).
        self.last_node: Any = None

    # --- recording -------------------------------------------------------------------------------------
    def save(self, obj: Any) -> None:
        key = id(obj)
        if key in self._saved or key in self.new:
            return
        self._saved[key] = (obj, obj._journal_state())
        if getattr(obj, "_is_node", False):
            self.last_node = obj
        if self.parent is not None:  # the state before this journal is the state before the savepoint too
            self.parent.save(obj)

    @property
    def changed(self) -> int:
        """How many existing objects the pass changed so far."""
        return len(self._saved)

    # --- opening and closing ---------------------------------------------------------------------------
    def open(self) -> "Journal":
        global _active
        if _active is not None and not _active.savepoint:
            raise RuntimeError("an edit journal is already open")
        self.parent = _active
        if self.model is not None:
            self._model_state = _model_state(self.model)
        self._hooks = hooks()
        self._hooks.__enter__()
        _active = self
        return self

    def close(self) -> None:
        global _active
        if _active is not self:
            return
        _active = self.parent
        if self.parent is not None:  # what was made in here did not exist when the savepoint opened
            self.parent.new.update(self.new)
        self._hooks.__exit__(None, None, None)

    def __enter__(self) -> "Journal":
        return self.open()

    def __exit__(self, *exc) -> None:
        self.close()

    # --- undoing ---------------------------------------------------------------------------------------
    def rollback(self) -> None:
        """Put every changed object back as it was when the journal opened (closes the journal first)."""
        self.close()
        for obj, state in reversed(list(self._saved.values())):
            obj._journal_restore(state)
        if self.model is not None and self._model_state is not None:
            for name, value in self._model_state.items():
                setattr(self.model, name, value)
        self._saved.clear()
        self.new.clear()


def _model_state(model: Any) -> dict[str, Any]:
    """The model's own fields, containers copied one level (the graph is journaled object by object)."""
    state = {}
    for name, value in vars(model).items():
        if name == "graph":
            continue
        state[name] = copy.copy(value) if isinstance(value, (dict, list, set)) else value
    return state


def is_open() -> bool:
    return _active is not None


class TrackedDict(dict):
    """A dict that saves itself in the open journal before any change (node, value and graph metadata, node
    attributes): a pass writes into it directly, so its owner never sees the change. Reads are plain dict
    reads, and making one costs what making a dict does."""

    __slots__ = ()

    def _journal_state(self) -> dict:
        return dict(self)

    def _journal_restore(self, state: dict) -> None:
        dict.clear(self)
        dict.update(self, state)

    def __reduce_ex__(self, protocol):  # pickles (and copies) as a plain dict
        return dict, (dict(self),)

    def _touch(self) -> None:
        if _active is not None:
            _active.save(self)

    def __setitem__(self, key, value) -> None:
        self._touch()
        dict.__setitem__(self, key, value)

    def __delitem__(self, key) -> None:
        self._touch()
        dict.__delitem__(self, key)

    def pop(self, *args):
        self._touch()
        return dict.pop(self, *args)

    def popitem(self):
        self._touch()
        return dict.popitem(self)

    def setdefault(self, key, default=None):
        if key not in self:
            self._touch()
        return dict.setdefault(self, key, default)

    def update(self, *args, **kwargs) -> None:
        self._touch()
        dict.update(self, *args, **kwargs)

    def clear(self) -> None:
        self._touch()
        dict.clear(self)

    def __ior__(self, other):
        self._touch()
        return dict.__ior__(self, other)


def tracked(data: Any) -> TrackedDict:
    """A TrackedDict holding a copy of ``data`` (assigning one node's metadata to another never shares it)."""
    found = TrackedDict()
    if data:
        dict.update(found, data)
    return found
