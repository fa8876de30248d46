"""Frozen plain-data classes that are cheap to define.

`dataclasses` generates each class's methods with exec() and imports `inspect`; across the
schema, the plan and the result that cost ~15 ms of every `corral run` start. A Record
gets the same behaviour that corral uses (keyword or positional construction, defaults,
immutability, equality, hashing, repr, `fields()`, `replace()`) from one base class:

    class Scratch(Record):
        rule: str
        size: int = 0

Fields are the class's annotations in order, inherited fields first; a field with a
class-level value has that default. A mutable default must be given as a factory:
`Default(list)`.
"""

from __future__ import annotations


class Default:
    __slots__ = ("factory",)

    def __init__(self, factory) -> None:
        self.factory = factory


_MISSING = object()


class Record:
    __slots__ = ()
    _fields: tuple[str, ...] = ()
    _defaults: dict = {}
    _mutable = False

    def __init_subclass__(cls, mutable: bool = False, **kw) -> None:
        super().__init_subclass__(**kw)
        ns = cls.__dict__   # (one mapping proxy: ~40 classes are made at every start)
        own = [n for n in ns.get("__annotations__", ()) if not n.startswith("_")]
        defaults = dict(cls._defaults)
        for name in own:
            if name in ns:
                defaults[name] = ns[name]
        fields = cls._fields
        if fields:
            fields = tuple(f for f in fields if f not in own)
        cls._fields = cls.__match_args__ = fields + tuple(own)
        cls._defaults = defaults
        cls._mutable = mutable or cls._mutable

    def __init__(self, *args, **kw) -> None:
        fields = self._fields
        put = object.__setattr__
        if args:   # (most records are made with keywords: no zip, no slice)
            if len(args) > len(fields):
                raise TypeError(f"{type(self).__name__} takes {len(fields)} fields")
            for name, value in zip(fields, args):
                if name in kw:
                    raise TypeError(f"{type(self).__name__}: {name} given twice")
                put(self, name, value)
            fields = fields[len(args):]
        defaults = self._defaults
        for name in fields:
            value = kw.pop(name, _MISSING)
            if value is _MISSING:
                value = defaults.get(name, _MISSING)
                if value is _MISSING:
                    raise TypeError(f"{type(self).__name__}: missing field {name!r}")
                if isinstance(value, Default):
                    value = value.factory()
            put(self, name, value)
        if kw:
            raise TypeError(f"{type(self).__name__}: unknown field {next(iter(kw))!r}")

    def __setattr__(self, name, value) -> None:
        if not self._mutable:
            raise AttributeError(f"{type(self).__name__} is frozen")
        object.__setattr__(self, name, value)

    def _values(self) -> tuple:
        return tuple(getattr(self, f) for f in self._fields)

    def __eq__(self, other) -> bool:
        if type(other) is not type(self):
            return NotImplemented
        return self._values() == other._values()

    def __hash__(self) -> int:
        return hash((type(self), self._values()))

    def __repr__(self) -> str:
        inner = ", ".join(f"{f}={getattr(self, f)!r}" for f in self._fields)
        return f"{type(self).__name__}({inner})"

    def replace(self, **changes):
        values = {f: getattr(self, f) for f in self._fields}
        values.update(changes)
        return type(self)(**values)

    def to_dict(self) -> dict:
        """Nested plain data: records become dicts, tuples and lists stay sequences."""
        return {f: _plain(getattr(self, f)) for f in self._fields}


def _plain(v):
    if isinstance(v, Record):
        return v.to_dict()
    if isinstance(v, list):
        return [_plain(x) for x in v]
    if isinstance(v, tuple):
        return [_plain(x) for x in v]
    if isinstance(v, dict):
        return {k: _plain(x) for k, x in v.items()}
    return v


def fields(cls_or_obj) -> tuple[str, ...]:
    return cls_or_obj._fields
