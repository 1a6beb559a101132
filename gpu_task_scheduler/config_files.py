"""Reading a sweep config from a file: ``.yaml``/``.yml``, ``.json`` or ``.py``.

A ``.py`` file must define a variable named ``config`` (the original's
``config_sample.py`` convention). The file is run in a namespace of its own,
so its ``if __name__ == "__main__":`` block does not run.
"""
from __future__ import annotations

import json
import os
import runpy
from typing import Any, Mapping, Union

from .errors import ConfigError
from .lazy import lazy_import

yaml = lazy_import("yaml")

ConfigSource = Union[Mapping[str, Any], str, "os.PathLike[str]"]
SUFFIXES = (".yaml", ".yml", ".json", ".py")


def load_config(source: ConfigSource) -> Mapping[str, Any]:
    """Return the config mapping from a dict or a config file path."""
    if isinstance(source, Mapping):
        return source
    if not isinstance(source, (str, os.PathLike)):
        raise ConfigError(
            f"config must be a dict or the path of a {'/'.join(SUFFIXES)} file; "
            f"got {type(source).__name__} {source!r}"
        )
    path = os.fspath(source)
    suffix = os.path.splitext(path)[1].lower()
    if suffix not in SUFFIXES:
        raise ConfigError(f"config file {path!r} has an unknown suffix; use one of {', '.join(SUFFIXES)}")
    if not os.path.isfile(path):
        raise ConfigError(f"config file {path!r} does not exist")
    try:
        if suffix == ".py":
            namespace = runpy.run_path(path, run_name="__gts_config__")
            if "config" not in namespace:
                raise ConfigError(f"config file {path!r} defines no variable named 'config'")
            loaded = namespace["config"]
        else:
            with open(path, encoding="utf-8") as handle:
                loaded = json.load(handle) if suffix == ".json" else yaml.safe_load(handle)
    except ConfigError:
        raise
    except Exception as error:  # a syntax error in the user's file, reported as a config problem
        raise ConfigError(f"could not read config file {path!r}: {type(error).__name__}: {error}") from error
    if not isinstance(loaded, Mapping):
        raise ConfigError(f"config file {path!r} must hold a mapping at the top level; got {type(loaded).__name__}")
    return loaded
