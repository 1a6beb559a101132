"""``@frozen``: a frozen dataclass, defined in a little more than half the time.

``@dataclass(frozen=True)`` compiles six methods for each class, one ``exec``
each: ``__init__``, ``__repr__``, ``__eq__``, ``__hash__``, ``__setattr__``
and ``__delattr__``. On Python 3.11 that is 0.5-0.7 ms a class, and a sweep
defines some 35 such classes before its first run can start: about a tenth
of the time from ``gts run`` to the first run (README, "Dispatch").

``@frozen`` has ``dataclass`` compile only ``__init__``, ``__repr__`` and
``__eq__``; the other three are the same three functions for every class:

* assigning to an instance raises ``dataclasses.FrozenInstanceError``, as on a
  frozen dataclass, except the first assignment of each field, which is
  ``__init__``'s (a ``field(init=False)`` without a default is the one field
  something else could set, once); deleting raises it too;
* the hash is that of the fields a frozen dataclass hashes (``compare``, or
  ``hash=True``), so equal instances hash alike, as before.

Everything else is ``dataclass``'s own (fields, ``replace``, ``asdict``,
``repr``, pickling and copying, which fill ``__dict__`` directly), and type
checkers are told (``dataclass_transform``) that the classes are frozen, so
an assignment is an error there as well. Classes with ``__slots__`` keep
``@dataclass(frozen=True, slots=True)``.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any, TypeVar

if TYPE_CHECKING:
    from typing_extensions import dataclass_transform  # typing's own from Python 3.11
else:

    def dataclass_transform(**_: Any) -> Any:  # what it says is for type checkers only
        return lambda decorator: decorator


__all__ = ["frozen"]

_T = TypeVar("_T")


def _set(self: Any, name: str, value: Any) -> None:
    if name in self.__dict__ or name not in self.__dataclass_fields__:
        raise dataclasses.FrozenInstanceError(f"cannot assign to field {name!r}")
    object.__setattr__(self, name, value)


def _delete(self: Any, name: str) -> None:
    raise dataclasses.FrozenInstanceError(f"cannot delete field {name!r}")


def _hash(self: Any) -> int:
    return hash(tuple([getattr(self, name) for name in self._hashed_fields]))


@dataclass_transform(frozen_default=True, field_specifiers=(dataclasses.field, dataclasses.Field))
def frozen(cls: type[_T]) -> type[_T]:
    """``@dataclass(frozen=True)``, as far as any code of ours can tell (see the module's notes)."""
    made: Any = dataclasses.dataclass(cls)  # (Any: mypy knows no assignment to a class's methods)
    made.__setattr__, made.__delattr__, made.__hash__ = _set, _delete, _hash
    made._hashed_fields = tuple(f.name for f in dataclasses.fields(made) if (f.compare if f.hash is None else f.hash))
    return made
