"""Reading a sweep config from a file: ``.yaml``/``.yml``, ``.json`` or ``.py``.

A ``.py`` file must define a variable named ``config`` (the original's
``config_sample.py`` convention). The file is run in a namespace of its own,
so its ``if __name__ == "__main__":`` block does not run. It is code: reading
it (also for ``gts run --dry-run``) runs it.

YAML is read with PyYAML's safe loader plus one change: numbers in exponent
form without a dot (``1e-3``, ``5E-4``, ``1e5``), which YAML 1.2 reads as
floats but PyYAML's YAML 1.1 rules leave as strings, are floats. Everything
else is PyYAML's: ``yes``/``no``/``on``/``off`` stay booleans (YAML 1.1, as
the original read them), ``0x10`` and ``1_000`` stay integers, ``.5`` and
``.inf`` floats.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Mapping
from typing import Any, Union

from ..errors import ConfigError

ConfigSource = Union[Mapping[str, Any], str, "os.PathLike[str]"]
SUFFIXES = (".yaml", ".yml", ".json", ".py")


# YAML 1.1's float pattern, widened to YAML 1.2's: the dot is optional before an exponent
# (compiled with the loader: a start without YAML does not pay for it).
_FLOAT = r"""^(?:[-+]?(?:[0-9][0-9_]*)(?:\.[0-9_]*)?(?:[eE][-+]?[0-9]+)?
    |[-+]?\.[0-9][0-9_]*(?:[eE][-+]?[0-9]+)?
    |[-+]?[0-9][0-9_]*(?::[0-5]?[0-9])+\.[0-9_]*
    |[-+]?\.(?:inf|Inf|INF)
    |\.(?:nan|NaN|NAN))$"""
_LOADER: type | None = None


def _yaml_loader() -> type:
    """``yaml.SafeLoader`` with the YAML 1.2 float forms (built once, on first use)."""
    global _LOADER
    if _LOADER is None:
        import yaml  # here: most starts (gts queue, a .json or dict config) read no YAML

        class Loader(yaml.SafeLoader):
            pass

        Loader.yaml_implicit_resolvers = {
            key: [(tag, regexp) for tag, regexp in resolvers if tag != "tag:yaml.org,2002:float"]
            for key, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
        }
        Loader.add_implicit_resolver("tag:yaml.org,2002:float", re.compile(_FLOAT, re.X), list("-+0123456789."))
        _LOADER = Loader
    return _LOADER


def load_yaml(text: Any) -> Any:
    """YAML text (or a stream) as Python values, with the float forms above."""
    import yaml

    return yaml.load(text, Loader=_yaml_loader())


def load_config(source: ConfigSource) -> Mapping[str, Any]:
    """Return the config mapping from a dict or a config file path."""
    if isinstance(source, Mapping):
        return source
    if not isinstance(source, (str, os.PathLike)):
        raise ConfigError(
            f"config must be a dict or the path of a {'/'.join(SUFFIXES)} file; got {type(source).__name__} {source!r}"
        )
    path = os.fspath(source)
    suffix = os.path.splitext(path)[1].lower()
    if suffix not in SUFFIXES:
        raise ConfigError(f"config file {path!r} has an unknown suffix; use one of {', '.join(SUFFIXES)}")
    if not os.path.isfile(path):
        raise ConfigError(f"config file {path!r} does not exist")
    try:
        if suffix == ".py":
            try:
                import runpy  # only for a .py config (`gts`, unlike `python -m`, has not loaded it)

                namespace = runpy.run_path(path, run_name="__gts_config__")
            except SystemExit as error:
                raise ConfigError(
                    f"config file {path!r} called sys.exit({error.code!r}) while it was read; "
                    "a config file only defines the variable 'config'"
                ) from None
            if "config" not in namespace:
                raise ConfigError(f"config file {path!r} defines no variable named 'config'")
            loaded = namespace["config"]
        else:
            with open(path, encoding="utf-8") as handle:
                loaded = json.load(handle) if suffix == ".json" else load_yaml(handle)
    except ConfigError:
        raise
    except RecursionError:
        raise ConfigError(f"config file {path!r} is nested too deeply to be a config") from None
    except Exception as error:  # a syntax error in the user's file, reported as a config problem
        raise ConfigError(f"could not read config file {path!r}: {type(error).__name__}: {error}") from error
    if not isinstance(loaded, Mapping):
        raise ConfigError(f"config file {path!r} must hold a mapping at the top level; got {type(loaded).__name__}")
    return loaded
