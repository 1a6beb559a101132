"""Placeholders in command templates and ``gts grid`` patterns: parsing, checking, filling in.

One place for what a ``{key.attr[0]!r:>8}`` field means to this project, used by
argv templates, ``shell: true`` templates and ``gts grid`` alike. Filling in
is :meth:`str.format` with one bound: a width or precision over
:data:`MAX_FIELD_WIDTH` is refused, because ``{a:>99999999999}`` would
otherwise make the scheduler build a 100 GB string (on a machine with enough
memory to try, it grinds for minutes instead of failing).
"""

from __future__ import annotations

import re
import string
from collections.abc import Iterable, Mapping
from typing import Any

from ..errors import ConfigError

MAX_FIELD_WIDTH = 10_000  # characters one placeholder may ask for (width or precision)

# [[fill]align][sign][z][#][0][width][grouping][.precision][type]: only width and precision matter here.
_SPEC = re.compile(r"(?:.?[<>=^])?[-+ ]?z?#?0?(?P<width>\d*)[,_]?(?:\.(?P<precision>\d*))?")


BRACES = " (a literal brace is written doubled: {{ for {, }} for })"


def parse(text: str, what: str = "command template") -> list[tuple[str, str | None, str | None, str | None]]:
    """``(literal, field, spec, conversion)`` pieces as :meth:`string.Formatter.parse` gives them;
    ConfigError if the text is malformed."""
    try:
        return list(string.Formatter().parse(text))
    except ValueError as error:
        raise ConfigError(f"{what} {text!r} is malformed: {error}{BRACES}") from None


def placeholders(text: str, what: str = "command template") -> list[tuple[str, str, str | None]]:
    """``(field, spec, conversion)`` of each placeholder; ConfigError if the text is malformed."""
    return [(field, spec or "", conv) for _, field, spec, conv in parse(text, what) if field is not None]


def base_key(field: str) -> str:
    """The config key a field reads: ``a`` for ``a.b``, ``a[0]``."""
    return re.split(r"[.\[]", field, maxsplit=1)[0]


def check_spec(spec: str) -> None:
    """ValueError if the spec asks for more than :data:`MAX_FIELD_WIDTH` characters."""
    match = _SPEC.match(spec)
    if match is None:
        return
    for part in ("width", "precision"):
        digits = match.group(part)
        if digits and (len(digits) > 9 or int(digits) > MAX_FIELD_WIDTH):
            raise ValueError(f"the format spec {spec!r} asks for a {part} of {digits}; at most {MAX_FIELD_WIDTH}")


def check_fields(text: str, known: Iterable[str], *, what: str = "command", kind: str = "config key") -> None:
    """ConfigError for a malformed template, a positional or unknown placeholder, or a spec too wide."""
    known = set(known)
    for field, spec, _ in placeholders(text, f"{what} template" if what == "command" else what):
        if field == "" or field.isdigit():
            raise ConfigError(f"{what} {text!r} has a positional placeholder {{{field}}}; name a {kind}")
        if base_key(field) not in known:
            raise ConfigError(
                f"{what} uses the placeholder {{{field}}}, which is not a {kind}; known: {', '.join(sorted(known))}"
                + (BRACES if not base_key(field).isidentifier() else "")
            )
        if "{" not in spec:  # nested specs are checked when filled in
            try:
                check_spec(spec)
            except ValueError as error:
                raise ConfigError(f"{what} {text!r}: {error}") from None


class _Formatter(string.Formatter):
    def format_field(self, value: Any, format_spec: str) -> Any:
        check_spec(format_spec)
        return super().format_field(value, format_spec)


_FORMATTER = _Formatter()


def fill(text: str, values: Mapping[str, Any]) -> str:
    """``text.format_map(values)`` with bounded widths (ValueError beyond)."""
    return _FORMATTER.vformat(text, (), values)


def format_one(field: str, spec: str, conversion: str | None, values: Mapping[str, Any]) -> str:
    """One placeholder's text, as :func:`fill` would write it."""
    value, _ = _FORMATTER.get_field(field, (), values)
    return _FORMATTER.format_field(_FORMATTER.convert_field(value, conversion), spec)
