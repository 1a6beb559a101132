"""Run folder names: the original algorithm, made safe and collision-free.

The original GPUTaskScheduler names a run's folder after its test-block
values: keys sorted, each written ``key`` + indicator + ``str(value)[:maxlen]``
+ separator, then every ignored character removed from the whole string.
:func:`config_string` reproduces that byte for byte, so existing result
folders keep their names.

On top of it, :func:`folder_name` makes sure a name is one path component
inside the result root (no ``/``, NUL, control characters, ``.``/``..``, or
more than 255 bytes) and never empty, and :class:`NameRegistry` gives two
*different* configs that end up with the same name distinct folders instead of
letting the second one be skipped as "already done".

Where we differ from the original on purpose: a run whose name is empty (a
sweep without ``test_config``, an empty test block, a block whose keys are
all left out of names or whose characters are all stripped) ran in the result
root itself there. Here the root holds ``.gts`` and every other run, and a
task that cleans its own folder would delete them; such a run gets the folder
:data:`EMPTY_NAME` instead (and ``run~<hash>`` for a second config with an
empty name, as for any other shared name).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping

from ..digest import blake2b_8, sha256_hex
from ..layout import MAX_NAME_BYTES, META

_HASH_CHARS = 8


def config_string(
    test_config: Mapping[str, object],
    *,
    indicator: str,
    separator: str,
    maxlen: int | None,
    ignored_keys: Iterable[str] = (),
    ignored_characters: Iterable[str] = (),
) -> str:
    """The original folder-name string for one run's test values.

    >>> config_string({"wd": 0.0, "lr": 0.001}, indicator="-", separator=",", maxlen=30)
    'lr-0.001,wd-0.0,'
    >>> config_string({"layers": [64, 64]}, indicator="-", separator=",", maxlen=30,
    ...               ignored_characters=[" ", "[", "]"])
    'layers-64,64,'
    """
    skip = set(ignored_keys)
    parts = []
    for key in sorted(test_config):
        if key in skip:
            continue
        parts.append(f"{key}{indicator}{value_text(test_config[key])[:maxlen]}{separator}")
    name = "".join(parts)
    for character in ignored_characters:
        name = name.replace(character, "")
    return name


def value_text(value: object) -> str:
    """``str(value)``, or a placeholder for values that cannot be printed
    (integers of over 4300 digits, objects whose ``__str__`` raises)."""
    try:
        return str(value)
    except Exception:
        return f"<{type(value).__name__}>"


_UNSAFE = re.compile(r"[/\x00-\x1f\x7f]")


def _escape(match: re.Match[str]) -> str:
    return f"%{ord(match.group()):02X}"


def short_hash(text: str) -> str:
    return sha256_hex(text)[:_HASH_CHARS]


# The folder of a run whose name would be empty (see the module's notes). No name that
# config_string() makes for a run with a swept key equals it: those end in the separator.
EMPTY_NAME = "run"


def folder_name(name: str) -> str:
    """The folder a run named ``name`` gets: :func:`safe_folder_name`, and never the root.

    >>> folder_name("")
    'run'
    >>> folder_name("lr-0.1,")
    'lr-0.1,'
    """
    return safe_folder_name(name) or EMPTY_NAME


def safe_folder_name(name: str) -> str:
    """Make ``name`` a single, portable path component.

    Names that are already safe come back unchanged (the common case, and the
    one the original produced). Path separators and control characters become
    ``%XX``; ``.``, ``..`` and ``.gts`` (the root's own records) are escaped;
    names over 255 bytes are cut and end with a hash of the full name so that
    they stay distinct.

    >>> safe_folder_name("lr-0.001,")
    'lr-0.001,'
    >>> safe_folder_name("path-../../etc,")
    'path-..%2F..%2Fetc,'
    >>> safe_folder_name(".gts")
    '%2Egts'
    """
    escaped = _UNSAFE.sub(_escape, name)
    if escaped in (".", "..", META):  # the root, its parent, the root's own records
        escaped = escaped.replace(".", "%2E")
    encoded = escaped.encode("utf-8", "surrogatepass")
    if len(encoded) > MAX_NAME_BYTES:
        keep = MAX_NAME_BYTES - _HASH_CHARS - 1
        head = encoded[:keep].decode("utf-8", "ignore")
        escaped = f"{head}~{short_hash(name)}"
    return escaped


class NameRegistry:
    """Gives every config of a sweep its folder name, and never another config's folder.

    ``assign(name, config_hash, suffix=..., foreign=...)`` returns
    ``(final_name, duplicate)``. The same config under the same name is a
    duplicate (run once). A name that an earlier config of this sweep took, or
    that ``foreign(name)`` says the result root records for a different config,
    is not given out again: the config gets ``name~<suffix>`` instead, where
    ``suffix`` is a hash of its own values. So which folder a config gets is
    decided by its own values and by what is on disk, never by where it
    stands in the sweep: adding, removing or reordering values cannot hand a
    folder that holds one config's results to another config.

    Names and configs are kept as 64-bit digests (two small ints per run), so a
    sweep of a million runs costs tens of megabytes here, not hundreds.
    """

    def __init__(self) -> None:
        self._owner: dict[int, int] = {}

    @staticmethod
    def _key(name: str) -> int:
        return int.from_bytes(blake2b_8(name), "big")

    def assign(
        self,
        name: str,
        config_hash: str,
        *,
        suffix: Callable[[], str] | str | None = None,
        foreign: Callable[[str], bool] | None = None,
    ) -> tuple[str, bool]:
        """``suffix`` (or a function that makes it, called only when a name is taken): the
        config's own hash text; by default ``config_hash``."""
        config = int(config_hash[:16], 16)
        candidate, width = name, _HASH_CHARS
        while True:
            key = self._key(candidate)
            owner = self._owner.get(key)
            if owner is None:
                if foreign is None or not foreign(candidate):
                    self._owner[key] = config
                    return candidate, False
            elif owner == config:
                return candidate, True
            if callable(suffix):
                suffix = suffix()
            candidate = safe_folder_name(f"{name}~{(suffix or config_hash)[:width]}")
            width += 4
