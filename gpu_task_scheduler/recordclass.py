"""``Record``: the dataclass of gts's records, without importing ``dataclasses`` at a start.

A start (``gts run``, ``gts queue``, a ``GPUTaskScheduler``) defined a dozen
``@dataclass`` records before its first run: the options, a run's spec, its
paths and ledger row, the runner's protocol, the slots and their views, the
outcome and the summary. That cost 17 ms of an 80 ms start on a 2-core VM
(Python 3.11): 5.5 ms to import ``dataclasses`` (it imports ``inspect``, and
with it ``ast``, ``dis`` and ``tokenize``) and 0.4-2.3 ms a class for
``dataclass`` to generate six methods, each compiled from source.

A subclass of :class:`Record` is declared as a dataclass is (annotated fields,
defaults, :func:`field` for ``default_factory``, ``repr=False`` or
``compare=False``), frozen unless declared ``class X(Record, frozen=False)``,
and behaves as ``@dataclass(frozen=...)`` would have made it:

* ``__init__`` takes the fields in order, with their defaults; it is the one
  method compiled for each class, and it fills ``__dict__`` directly: a
  14-field ``RunOutcome`` is made in 0.66 us against a frozen dataclass's 1.54
  (the earlier ``@frozen`` attempt set fields through a Python ``__setattr__``
  and was reverted for costing every run 55 us);
* ``__repr__``, ``__eq__`` (same class, fields compared in order) and, for a
  frozen class, ``__hash__`` (of the compared fields) and the refusal to
  assign or delete (``dataclasses.FrozenInstanceError``) are shared by all
  classes; a mutable class is unhashable, as a dataclass with ``eq`` is;
* ``dataclasses.fields``, ``asdict``, ``replace`` and ``is_dataclass`` work on
  the class and its instances: ``__dataclass_fields__`` is built at its first
  read, by ``dataclasses`` itself, from the same declarations (code that
  never asks never imports ``dataclasses``); pickling and copying fill
  ``__dict__`` as for any class;
* ``_fields``, ``_asdict()`` (shallow) and ``_replace(**changes)`` are the
  same as a ``NamedTuple``'s, for gts's own code.

Type checkers see a dataclass (``dataclass_transform``), frozen by default.
A record class may derive from one other (``class Asha(Rule)``): the base's
fields come first, a field declared again keeps its place and takes its new
default, and both are frozen or neither, as ``dataclass`` requires. Mixing in
other bases is refused rather than half-done, as is a class that writes its own
``__init__``, ``__hash__``, ``__setattr__`` or ``__delattr__`` (``dataclass``
keeps some of those and replaces others; a record needs none).
"""

from __future__ import annotations

from collections.abc import Callable
from operator import attrgetter
from typing import TYPE_CHECKING, Any, ClassVar

if TYPE_CHECKING:
    from typing import Self, dataclass_transform
else:

    def dataclass_transform(**_: Any) -> Any:  # for type checkers only
        return lambda decorated: decorated


__all__ = ["Record", "field"]

_MISSING: Any = type("_Missing", (), {"__repr__": lambda self: "MISSING"})()


class _Field:
    __slots__ = ("default", "default_factory", "repr", "compare")

    def __init__(self, default: Any, default_factory: Any, repr: bool, compare: bool) -> None:
        if default is not _MISSING and default_factory is not _MISSING:
            raise ValueError("cannot specify both default and default_factory")
        self.default, self.default_factory, self.repr, self.compare = default, default_factory, repr, compare


def field(
    *,
    default: Any = _MISSING,
    default_factory: Callable[[], Any] = _MISSING,
    repr: bool = True,
    compare: bool = True,
) -> Any:
    """A field's options, as ``dataclasses.field``'s of the same names."""
    return _Field(default, default_factory, repr, compare)


def _is_class_var(annotation: Any) -> bool:
    text = annotation if isinstance(annotation, str) else getattr(annotation, "__name__", "")
    return text.startswith(("ClassVar", "typing.ClassVar"))


def _frozen_error(message: str) -> AttributeError:
    from dataclasses import FrozenInstanceError  # an error path: the import is paid only here

    return FrozenInstanceError(message)


def _refuse_assignment(self: Any, name: str, value: Any) -> None:
    raise _frozen_error(f"cannot assign to field {name!r}")


def _refuse_deletion(self: Any, name: str) -> None:
    raise _frozen_error(f"cannot delete field {name!r}")


def _hash(self: Any) -> int:
    return hash(self._compared(self))


class _DataclassFields:
    """``__dataclass_fields__`` at its first read: ``dataclasses`` builds the fields of a twin class."""

    def __get__(self, instance: Any, owner: Any) -> Any:
        import dataclasses

        specs = []
        for name, options in owner._field_options.items():
            kwargs: dict[str, Any] = {"repr": options.repr, "compare": options.compare}
            if options.default is not _MISSING:
                kwargs["default"] = options.default
            if options.default_factory is not _MISSING:
                kwargs["default_factory"] = options.default_factory
            specs.append((name, owner._field_types[name], dataclasses.field(**kwargs)))
        twin = dataclasses.make_dataclass(owner.__name__, specs, frozen=owner._frozen)
        fields = twin.__dataclass_fields__  # type: ignore[attr-defined]
        type.__setattr__(owner, "__dataclass_fields__", fields)
        type.__setattr__(owner, "__dataclass_params__", twin.__dataclass_params__)  # type: ignore[attr-defined]
        return fields


def _compile_init(cls: type, options: dict[str, _Field]) -> Callable[..., None]:
    """``__init__`` for ``cls``'s fields: the one method compiled per class. Its own names (the
    instance, its dict, the defaults) start with ``__record_``, which no field's name may."""
    scope: dict[str, Any] = {"__record_missing__": _MISSING}
    parameters, body = ["__record_self__"], []
    for name, option in options.items():
        if name.startswith("__record_"):
            raise TypeError(f"{cls.__qualname__}: a field's name may not start with '__record_' ({name!r})")
        if option.default is not _MISSING:
            scope[f"__record_default_{name}"] = option.default
            parameters.append(f"{name}=__record_default_{name}")
        elif option.default_factory is not _MISSING:
            scope[f"__record_factory_{name}"] = option.default_factory
            parameters.append(f"{name}=__record_missing__")
            body.append(f"    if {name} is __record_missing__: {name} = __record_factory_{name}()")
        elif "=" in parameters[-1]:
            raise TypeError(f"{cls.__qualname__}: non-default field {name!r} follows a field with a default")
        else:
            parameters.append(name)
    body.append("    __record_dict__ = __record_self__.__dict__")
    body += [f"    __record_dict__[{name!r}] = {name}" for name in options]
    source = "\n".join([f"def __init__({', '.join(parameters)}):", *body])
    exec(compile(source, f"<record {cls.__module__}.{cls.__qualname__}>", "exec"), scope)
    function = scope["__init__"]
    function.__qualname__ = f"{cls.__qualname__}.__init__"
    return function


def _getter(names: list[str]) -> Callable[[Any], tuple[Any, ...]]:
    if len(names) == 1:  # attrgetter of one name gives the value, not a 1-tuple
        single = attrgetter(names[0])
        return lambda instance: (single(instance),)
    return attrgetter(*names) if names else lambda instance: ()


_LAZY_FIELDS = _DataclassFields()


@dataclass_transform(frozen_default=True, field_specifiers=(field,))
class Record:
    """Base of gts's record classes (see the module's notes)."""

    __slots__ = ()
    __dataclass_fields__: ClassVar[Any] = _LAZY_FIELDS
    _fields: ClassVar[tuple[str, ...]]
    _field_options: ClassVar[dict[str, _Field]]
    _field_types: ClassVar[dict[str, Any]]  # as annotated (strings, where annotations are deferred)
    _frozen: ClassVar[bool]
    _compared: ClassVar[Any]  # the compared fields' values of an instance, as a tuple
    _represented: ClassVar[tuple[str, ...]]

    def __init_subclass__(cls, *, frozen: bool = True, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        (base,) = cls.__bases__ if len(cls.__bases__) == 1 else (None,)
        if base is None or not issubclass(base, Record):
            raise TypeError(f"{cls.__qualname__}: a record class derives from Record or one record class alone")
        generated = [name for name in ("__init__", "__hash__", "__setattr__", "__delattr__") if name in cls.__dict__]
        if generated:
            raise TypeError(f"{cls.__qualname__}: a record class's {', '.join(generated)} is made for it")
        options: dict[str, _Field] = {}
        types: dict[str, Any] = {}
        if base is not Record:
            if base._frozen != frozen:
                raise TypeError(f"{cls.__qualname__}: a record class is frozen if and only if its base is")
            options, types = dict(base._field_options), dict(base._field_types)
        # The class's own annotations (strings: every module of ours defers them); Python 3.14 may
        # keep them behind __annotate__, which the attribute evaluates.
        for name, annotation in (cls.__dict__.get("__annotations__") or cls.__annotations__).items():
            if _is_class_var(annotation):
                continue
            declared = cls.__dict__.get(name, _MISSING)
            option = declared if isinstance(declared, _Field) else _Field(declared, _MISSING, True, True)
            if option.default is not _MISSING and type(option.default).__hash__ is None:  # as dataclass
                raise ValueError(
                    f"{cls.__qualname__}: mutable default {type(option.default).__name__} for field {name!r} "
                    "would be shared by every instance: use field(default_factory=...)"
                )
            options[name] = option
            types[name] = annotation
            if isinstance(declared, _Field):  # the class keeps the default, as a dataclass's does
                if option.default is _MISSING:
                    delattr(cls, name)
                else:
                    setattr(cls, name, option.default)
        cls._field_options = options
        cls._field_types = types
        cls._fields = tuple(options)
        cls._frozen = frozen
        cls._compared = staticmethod(_getter([name for name, o in options.items() if o.compare]))
        cls._represented = tuple(name for name, o in options.items() if o.repr)
        type.__setattr__(cls, "__match_args__", cls._fields)  # as a dataclass has it, for `match`
        type.__setattr__(cls, "__dataclass_fields__", _LAZY_FIELDS)  # not its base's, once built
        cls.__init__ = _compile_init(cls, options)  # type: ignore[method-assign]
        if frozen:
            cls.__setattr__ = _refuse_assignment  # type: ignore[method-assign]
            cls.__delattr__ = _refuse_deletion  # type: ignore[method-assign]
            cls.__hash__ = _hash  # type: ignore[method-assign]
        else:
            cls.__hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        shown = ", ".join(f"{name}={getattr(self, name)!r}" for name in self._represented)
        return f"{type(self).__qualname__}({shown})"

    def __eq__(self, other: object) -> bool:
        if other.__class__ is self.__class__:
            return self._compared(self) == self._compared(other)
        return NotImplemented

    def _asdict(self) -> dict[str, Any]:
        """The fields and their values (the values themselves, not copies: see ``dataclasses.asdict``)."""
        return {name: getattr(self, name) for name in self._fields}

    def _replace(self, **changes: Any) -> Self:
        """A copy with ``changes``, as ``dataclasses.replace`` makes it."""
        for name in self._fields:
            if name not in changes:
                changes[name] = getattr(self, name)
        return type(self)(**changes)
