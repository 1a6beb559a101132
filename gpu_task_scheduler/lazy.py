"""Deferred imports, so heavy frameworks load only where they are used.

Importing PyTorch or TensorFlow at the top of a task module makes the
*scheduler* process initialise CUDA and hold GPU memory for the whole sweep.
``torch = lazy_import("torch")`` instead gives a stand-in object that imports
the module on first attribute access, which happens inside ``main()``, in the
run's own process, after ``CUDA_VISIBLE_DEVICES`` is set.
"""

from __future__ import annotations

import importlib
from types import ModuleType

__all__ = ["lazy_import"]


def lazy_import(name: str) -> ModuleType:
    """Return a proxy for module ``name`` that imports it on first use.

    >>> json = lazy_import("json")
    >>> json.dumps([1])
    '[1]'

    A missing module raises ``ImportError`` at first use, not here.
    """
    if not isinstance(name, str) or not name:
        raise TypeError(f"lazy_import() needs a module name such as 'torch', got {name!r}")
    import lazy_object_proxy  # here, not at the top: it imports inspect (10 ms), which few starts need

    return lazy_object_proxy.Proxy(lambda: importlib.import_module(name))
