"""``gts grid``: the commands of a parameter grid, streamed (compatible with simple_hypersearch).

The grid is never built: command *k* is computed from *k* (mixed radix, the
first parameter varying slowest, as ``itertools.product``), so a grid of a
million commands costs no more memory than one. ``shuffled_grid`` visits the
indices in a seeded pseudo-random order given by a Feistel permutation over
the next power of two, walking past indices outside the grid; it is a true
permutation (every command once) and also needs no list. Its order differs
from simple_hypersearch's for the same seed (that tool shuffles a full list).
Without a seed the order is still fixed: seeded from the input (the pattern and
the values), so the same ``gts grid`` prints the same commands in the same order
and ``gts grid … | gts queue --resume`` run again finds every job where it was.
"""

from __future__ import annotations

import json
import random
from collections.abc import Iterator, Sequence

from ..digest import sha256_int
from ..errors import ConfigError
from .templates import check_fields, fill

Parameters = Sequence[tuple[str, Sequence[str]]]
_ROUNDS = 3  # a permutation for any count; three rounds already scramble well (Luby-Rackoff)
_MASK64 = (1 << 64) - 1


def grid_size(parameters: Parameters) -> int:
    size = 1
    for _, values in parameters:
        size *= len(values)
    return size


class _Permutation:
    """A seeded bijection of range(size), computed one index at a time."""

    def __init__(self, size: int, seed: int | None) -> None:
        self.size = size
        bits = max(2, (size - 1).bit_length())
        bits += bits % 2
        self.half = bits // 2
        self.mask = (1 << self.half) - 1
        rng = random.Random(seed)
        self.keys = [rng.getrandbits(64) | 1 for _ in range(_ROUNDS)]

    def _round(self, value: int, key: int) -> int:
        value = (value * 0x9E3779B97F4A7C15 + key) & _MASK64
        value ^= value >> 29
        value = (value * key) & _MASK64
        return (value >> 17) & self.mask

    def _encrypt(self, value: int) -> int:
        left, right = value >> self.half, value & self.mask
        for key in self.keys:
            left, right = right, left ^ self._round(right, key)
        return (left << self.half) | right

    def __call__(self, index: int) -> int:
        value = self._encrypt(index)
        while value >= self.size:  # cycle-walk back into range
            value = self._encrypt(value)
        return value


def input_seed(pattern: str, parameters: Parameters) -> int:
    """The shuffled order's seed when none is given: from the input, so that it repeats."""
    text = json.dumps([pattern, [[name, list(values)] for name, values in parameters]])
    return sha256_int(text)


def check_pattern(pattern: str, names: Sequence[str]) -> None:
    check_fields(pattern, [*names, "job_index"], what="the pattern", kind="parameter")


def commands(
    pattern: str, parameters: Parameters, *, mode: str = "grid", n_samples: int | None = None, seed: int | None = None
) -> Iterator[str]:
    names = [name for name, _ in parameters]
    if len(set(names)) != len(names):
        raise ConfigError(f"a parameter is given twice: {names}")
    for name, values in parameters:
        if not values:
            raise ConfigError(f"parameter {name!r} has no values")
    check_pattern(pattern, names)
    if mode not in ("grid", "shuffled_grid"):
        raise ConfigError(f"sampling mode must be grid or shuffled_grid; got {mode!r}")
    size = grid_size(parameters)
    count = size if n_samples is None else min(max(n_samples, 0), size)
    order = (
        _Permutation(size, input_seed(pattern, parameters) if seed is None else seed)
        if mode == "shuffled_grid"
        else None
    )
    options = [list(values) for _, values in reversed(parameters)]
    keys = [*reversed(names), "job_index"]
    fields: dict[str, str] = {}
    for job_index in range(count):
        index = order(job_index) if order is not None else job_index
        picked = []
        for values in options:  # mixed radix, last parameter fastest
            index, digit = divmod(index, len(values))
            picked.append(values[digit])
        picked.append(str(job_index))
        fields.update(zip(keys, picked, strict=False))
        try:
            line = fill(pattern, fields)
        except (ValueError, OverflowError, MemoryError) as error:
            raise ConfigError(
                f"the pattern {pattern!r} cannot be filled in with {fields}: {type(error).__name__}: {error}"
            ) from None
        yield line
