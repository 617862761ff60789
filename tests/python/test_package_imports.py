"""The modules of the ``ferry`` package import one another without a cycle, and each of them
imports on its own.

A cycle between modules (path -> rdma -> path) holds only while no module reads a name of another
before that one has finished importing, and an import written inside a function hides it from the
module's header. So the graph here counts every import of a ferry module wherever it is written,
at module level or in a function body. Only the imports under ``if TYPE_CHECKING:`` are left out:
they never run, and name classes for annotations.
"""

import ast
import os
import subprocess
import sys

import pytest

import ferry

PACKAGE_DIR = os.path.dirname(os.path.abspath(ferry.__file__))


def package_modules(package_dir, package="ferry"):
    """{module name: source file} of every Python module of the package, and the set of its
    extension modules (``ferry._core`` and its submodules)."""
    sources, extensions = {}, set()
    for dirpath, dirnames, files in os.walk(package_dir):
        dirnames[:] = sorted(d for d in dirnames if d != "__pycache__")
        rel = os.path.relpath(dirpath, package_dir)
        prefix = package if rel == "." else package + "." + rel.replace(os.sep, ".")
        for f in sorted(files):
            if f == "__init__.py":
                sources[prefix] = os.path.join(dirpath, f)
            elif f.endswith(".py"):
                sources[prefix + "." + f[:-3]] = os.path.join(dirpath, f)
            elif f.endswith((".so", ".pyd")):
                extensions.add(prefix + "." + f.split(".")[0])
            elif f.endswith(".pyi"):
                # The extension's type declarations, in a source tree without the extension.
                extensions.add(prefix if f == "__init__.pyi" else prefix + "." + f[:-4])
    return sources, extensions


def _is_type_checking(test):
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _imports(tree):
    """Every Import / ImportFrom node of the tree, at any depth, except those under
    ``if TYPE_CHECKING:``."""
    stack = [tree]
    while stack:
        node = stack.pop()
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            stack.extend(node.orelse)
            continue
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            yield node
        stack.extend(ast.iter_child_nodes(node))


def import_graph(package_dir, package="ferry"):
    """{module: set of the package's modules it imports}."""
    sources, extensions = package_modules(package_dir, package)
    known = set(sources) | extensions
    graph = {}
    for name, path in sources.items():
        is_package = os.path.basename(path) == "__init__.py"
        with open(path) as f:
            tree = ast.parse(f.read(), path)
        edges = set()
        for node in _imports(tree):
            if isinstance(node, ast.Import):
                edges.update(a.name for a in node.names if a.name in known)
                continue
            if node.level == 0:
                base = node.module or ""
            else:
                parts = name.split(".") if is_package else name.split(".")[:-1]
                parts = parts[:len(parts) - (node.level - 1)]
                base = ".".join(parts + ([node.module] if node.module else []))
            for alias in node.names:
                # "from . import verbs" imports the module ferry.verbs; "from .path import IBPath"
                # and "from . import install_as_nixl" need the module (or package) they name.
                sub = base + "." + alias.name
                edges.add(sub if sub in known else base)
        edges.discard(name)
        graph[name] = edges & set(sources)
    return graph


def cycles(graph):
    """The strongly connected components of more than one module (Tarjan), each sorted."""
    index, low, on_stack, stack, found = {}, {}, set(), [], []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_the_package_import_graph_has_no_cycle():
    graph = import_graph(PACKAGE_DIR)
    assert {"ferry.path", "ferry.verbs", "ferry.vtools", "ferry.rdma"} <= set(graph)
    assert cycles(graph) == []
    # The verbs modules' order, lowest first, as their module documentation states it.
    assert "ferry.rdma" not in graph["ferry.path"] | graph["ferry.verbs"] | graph["ferry.vtools"]
    assert "ferry.verbs" in graph["ferry.vtools"] and "ferry.path" in graph["ferry.verbs"]


def test_the_check_finds_a_cycle_hidden_in_a_function(tmp_path):
    """The graph counts function-level imports and leaves TYPE_CHECKING ones out."""
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from . import b\n")
    (pkg / "b.py").write_text("def f():\n    from .a import name\n    return name\n")
    (pkg / "c.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from . import d\n")
    (pkg / "d.py").write_text("from .c import x\n")
    graph = import_graph(str(pkg), "pkg")
    assert graph["pkg.b"] == {"pkg.a"} and graph["pkg.c"] == set()
    assert cycles(graph) == [["pkg.a", "pkg.b"]]


@pytest.mark.parametrize("module", sorted(package_modules(PACKAGE_DIR)[0]))
def test_each_module_imports_on_its_own(module):
    """In a fresh interpreter, the module imports without ``ferry/__init__.py`` having imported
    the others first (the package is entered bare), so it needs no import order of its users."""
    code = ("import importlib, sys, types\n"
            "package = types.ModuleType('ferry')\n"
            "package.__path__ = [sys.argv[1]]\n"
            "sys.modules['ferry'] = package\n"
            "importlib.import_module(sys.argv[2])\n")
    if module == "ferry":
        code = "import ferry\n"
    r = subprocess.run([sys.executable, "-c", code, PACKAGE_DIR, module], capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0, r.stderr
