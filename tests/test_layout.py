"""The package's shape: no module imports a module that imports it, however indirectly (lazy and
type-only imports counted), and no module grows past what one reader can hold."""

import ast
import os

import pytest

import gpu_task_scheduler

PACKAGE = os.path.dirname(gpu_task_scheduler.__file__)
MOST_LINES = 800  # and at most 5 % of the package


def _modules():
    found = {}
    for folder, _, names in os.walk(PACKAGE):
        for name in names:
            if name.endswith(".py"):
                path = os.path.join(folder, name)
                parts = os.path.relpath(path, os.path.dirname(PACKAGE))[: -len(".py")].split(os.sep)
                found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


def _imports(module, path, modules):
    """The package's modules that ``module`` imports anywhere in its file (in functions and under
    ``if TYPE_CHECKING`` too): ``from . import x`` counts x when x is a module, else the package."""
    package = module if path.endswith("__init__.py") else module.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(open(path, encoding="utf-8").read())):
        if isinstance(node, ast.ImportFrom):
            base = package.split(".")[: len(package.split(".")) - node.level + 1] if node.level else []
            target = ".".join(base + ([node.module] if node.module else []))
            for alias in node.names:
                full = f"{target}.{alias.name}"
                found.add(full if full in modules else target)
        elif isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
    return {name for name in found if name in modules and name != module}


def test_no_module_imports_a_module_that_imports_it():
    modules = _modules()
    graph = {module: _imports(module, path, modules) for module, path in modules.items()}
    assert graph["gpu_task_scheduler.records.ledger"] >= {"gpu_task_scheduler.records.ledger.runs"}  # it sees imports
    done, path = set(), []

    def visit(module):  # depth first; a module met again on the current path closes a cycle
        if module in path:
            cycle = path[path.index(module) :] + [module]
            raise AssertionError("an import cycle: " + " -> ".join(cycle))
        if module in done:
            return
        path.append(module)
        for imported in sorted(graph[module]):
            visit(imported)
        path.pop()
        done.add(module)

    for module in sorted(graph):
        visit(module)


def test_no_module_is_over_800_lines_or_5_percent_of_the_package():
    sizes = {}
    for module, path in _modules().items():
        with open(path, encoding="utf-8") as handle:
            sizes[module] = sum(1 for _ in handle)
    total = sum(sizes.values())
    large = {module: lines for module, lines in sizes.items() if lines > min(MOST_LINES, total * 0.05)}
    assert not large, f"split these by concern (the package has {total} lines): {large}"


@pytest.mark.xdist_group("clusters")
def test_the_suites_xdist_groups_hold(request):
    """The Ray and Slurm tests (group "clusters") and the framework sweeps ("frameworks") rely on
    running one after another in one worker: pytest-xdist puts a test's group in its node id. A
    pytest that keeps node ids elsewhere (9.2, with pytest-xdist 3.8) spreads every group over the
    workers without a word; this fails instead."""
    if not getattr(request.config.option, "loadgroup", False):
        pytest.skip("not in a pytest-xdist worker of --dist loadgroup")
    assert request.node.nodeid.endswith("@clusters"), request.node.nodeid
