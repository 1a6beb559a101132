"""What a Python script imports, read from its source without running it: the warm process's
imports before any run has ended (``zygote.WarmStarts``), and what ``gts run --dry-run`` says.

A script's imports are its statements ``import x`` and ``from x import y`` that run whenever the
script runs: those of its module body, of the ``try`` blocks there (an optional import, as a cold
start tries it too), and of its ``if __name__ == "__main__":`` block. Not those under any other
``if`` (``if args.wandb: import wandb``: a run may never import it) or in a function (learned at
the runs' ends, as before). Of these, the standard library's and installed packages' modules are
kept (``forkserver._installed``: what a warm process may import); the user's own modules (the
script's folder, the working folder, a checkout on ``PYTHONPATH``) are read in turn for theirs,
never imported. Names are resolved by ``importlib.machinery.PathFinder`` on the folders given,
which reads folders and imports nothing (a package's ``__init__`` does not run).

Reading is bounded: a source file of more than :data:`MOST_BYTES`, more than :data:`MOST_FILES`
files, or one that does not parse is left out. What it misses is learned as today, from the runs.
"""

from __future__ import annotations

import ast
import importlib.machinery
import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from .forkserver import _installed

MOST_FILES = 32  # source files read for one script (itself and the user's modules it imports)
MOST_BYTES = 2 << 20  # a source file larger than this is not read


def imports_of(path: str, search: Sequence[str]) -> list[str]:
    """The installed modules the source file ``path`` imports when it runs, in the order read; the
    user's modules it imports, found on ``search`` (the run's ``sys.path``), read too."""
    return _imports_from([(path, None)], search)


def script_imports(path: str, search: Sequence[str]) -> list[str]:
    """The same for ``python path``: its folder first on ``sys.path``, then ``search``."""
    return imports_of(path, [os.path.dirname(os.path.abspath(path)), *search])


def code_imports(code: str, search: Sequence[str]) -> list[str]:
    """The same for ``python -c code`` (``search``: the run's ``sys.path``, its working folder first)."""
    return _imports_from([("<string>", code)], search)


@dataclass(frozen=True)
class Source:
    """What a Python command runs, to be read: a source file, or the code of ``-c``, and the run's
    ``sys.path`` to resolve its imports on."""

    file: str | None
    code: str | None
    search: tuple[str, ...]

    @property
    def key(self) -> str | None:
        """Names what is read, once: the code, or the file as it is now (its path and mtime); None
        when there is nothing to read."""
        if self.code is not None:
            return self.code
        try:
            return f"{self.file}:{os.stat(self.file).st_mtime_ns}" if self.file is not None else None
        except OSError:
            return None

    @property
    def what(self) -> str:
        """How the log names it."""
        return "the code it runs" if self.code is not None else os.path.basename(self.file or "")

    def imports(self) -> list[str]:
        """The installed modules it imports when it runs (``imports_of``, ``code_imports``)."""
        if self.code is not None:
            return code_imports(self.code, self.search)
        return imports_of(self.file, self.search) if self.file is not None else []


def command_source(argv: Sequence[str], cwd: str, base: Sequence[str]) -> Source:
    """What ``python *argv`` run in ``cwd`` runs (``argv``: the interpreter's arguments after its
    options, ``zygote.script_argv``'s): ``-c code``, ``-m module`` (found on the working folder, then
    ``base``), or a script (its folder first on ``sys.path``). ``base``: the run's ``sys.path`` after
    its first entry (its ``PYTHONPATH``, then the interpreter's folders). The one reading of a command
    the warm process and ``gts run --dry-run`` share."""
    search = (cwd, *base)
    if argv and argv[0] == "-c":
        return Source(None, argv[1], search)
    if argv and argv[0] == "-m":
        return Source(module_file(argv[1], search), None, search)
    file = os.path.join(cwd, argv[0])
    return Source(file, None, (os.path.dirname(os.path.abspath(file)), *base))


def module_file(name: str, search: Sequence[str]) -> str | None:
    """The source file of the module ``name`` (``python -m name``, a GPUTask's module) on ``search``,
    found without importing anything; None if it is not a source file there."""
    spec = _spec(name, search)
    origin = getattr(spec, "origin", None) if spec is not None else None
    return origin if isinstance(origin, str) and origin.endswith(".py") and os.path.isfile(origin) else None


def _imports_from(sources: list[tuple[str, str | None]], search: Sequence[str]) -> list[str]:
    found: list[str] = []
    read: set[str] = set()
    while sources and len(read) < MOST_FILES:
        path, text = sources.pop(0)
        if path in read:
            continue
        read.add(path)
        tree = _parsed(path, text)
        if tree is None:
            continue
        for name in _imported_names(tree):
            if name in found:
                continue
            where = _origin(name, search)
            if where is None:
                continue
            if _installed(os.path.realpath(where)):
                found.append(name)
            elif where.endswith(".py"):
                sources.append((where, None))  # the user's own: its imports are read, it is never imported
    return found


def _parsed(path: str, text: str | None) -> ast.Module | None:
    try:
        if text is None:
            if os.path.getsize(path) > MOST_BYTES:
                return None
            with open(path, "rb") as handle:
                source: str | bytes = handle.read()
        else:
            if len(text) > MOST_BYTES:
                return None
            source = text
        return ast.parse(source, filename=path)
    except (OSError, SyntaxError, ValueError, RecursionError, MemoryError):
        return None


def _imported_names(tree: ast.Module) -> Iterable[str]:
    """The absolute module names of the import statements that run whenever the module runs (a
    dotted one's packages first: importing ``a.b`` runs ``a``'s ``__init__``)."""
    for statement in _always_run(tree.body):
        if isinstance(statement, ast.Import):
            for alias in statement.names:
                yield from _with_packages(alias.name)
        elif isinstance(statement, ast.ImportFrom) and statement.module and not statement.level:
            yield from _with_packages(statement.module)
            for alias in statement.names:  # `from torch import nn`: a submodule, if it is one
                if alias.name != "*":
                    yield f"{statement.module}.{alias.name}"


def _with_packages(name: str) -> Iterable[str]:
    parts = name.split(".")
    for index in range(1, len(parts) + 1):
        yield ".".join(parts[:index])


def _always_run(body: list[ast.stmt]) -> Iterable[ast.stmt]:
    for statement in body:
        if isinstance(statement, ast.Try):
            yield from _always_run(statement.body)
        elif isinstance(statement, ast.If) and _is_main_check(statement.test):
            yield from _always_run(statement.body)
        else:
            yield statement


def _is_main_check(test: ast.expr) -> bool:
    """``__name__ == "__main__"`` (either way round)."""
    if not isinstance(test, ast.Compare) or len(test.ops) != 1 or not isinstance(test.ops[0], ast.Eq):
        return False
    sides = [test.left, *test.comparators]
    names = [side.id for side in sides if isinstance(side, ast.Name)]
    values = [side.value for side in sides if isinstance(side, ast.Constant)]
    return names == ["__name__"] and values == ["__main__"]


def _spec(name: str, search: Sequence[str]) -> importlib.machinery.ModuleSpec | None:
    """``name``'s spec found folder by folder (a package's submodules in its own folders), with
    nothing imported: PathFinder reads folders only."""
    path: list[str] | None = [folder for folder in search if isinstance(folder, str)]
    spec = None
    parts = name.split(".")
    for index in range(len(parts)):
        if path is None:
            return None  # a module, not a package: no submodule under it
        try:
            # The last part's name in its parent's folders: a dotted name would have PathFinder look
            # the parent up in sys.modules for a namespace package
            spec = importlib.machinery.PathFinder.find_spec(parts[index], path)
        except (ImportError, ValueError, OSError, KeyError):
            return None
        if spec is None:
            return None
        if spec.submodule_search_locations is None:
            path = None
        elif spec.origin in (None, "namespace"):  # a namespace package: its folders of that name (its
            # own path object would look its parent up in sys.modules, where nothing was imported)
            path = [
                os.path.join(folder, parts[index])
                for folder in path
                if os.path.isdir(os.path.join(folder, parts[index]))
            ]
        else:
            path = list(spec.submodule_search_locations)
    return spec


def _origin(name: str, search: Sequence[str]) -> str | None:
    """Where ``name`` is (its file, or a namespace package's folder), on ``search``."""
    spec = _spec(name, search)
    if spec is None:
        return None
    if isinstance(spec.origin, str) and spec.origin not in ("built-in", "frozen", "namespace"):
        return spec.origin
    folders = [os.path.join(folder, name.split(".")[-1]) for folder in search]  # a namespace package's
    return next((folder for folder in folders if os.path.isdir(folder)), None) if "." not in name else None
