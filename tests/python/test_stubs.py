"""The type stubs shipped with the package (python/ferry/_core/*.pyi, scripts/generate-stubs.sh)
list exactly the public names of the extension: every module, class, function and constant of
ferry._core and its submodules, and every public member of each class. A binding added or
removed without regenerating the stubs fails here."""

import ast
import inspect
import os
import types

import pytest

import ferry._core

STUBS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "python", "ferry", "_core")


def public(names):
    return {n for n in names if not n.startswith("_")} | ({"__version__"} & set(names))


def stub_names(body):
    """Names a stub module or class body defines."""
    names = set()
    for node in body:
        if isinstance(node, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            names.add(node.name)
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names.add(node.target.id)
        elif isinstance(node, ast.Assign):
            names.update(t.id for t in node.targets if isinstance(t, ast.Name))
        elif isinstance(node, ast.ImportFrom) and node.module is None and node.level == 1:
            names.update(a.asname or a.name for a in node.names)  # from . import verbs
    return names


def load_stub(name):
    path = os.path.join(STUBS, "__init__.pyi" if name == "" else name + ".pyi")
    with open(path) as f:
        return ast.parse(f.read(), path)


def modules():
    out = {"": ferry._core}
    for name in dir(ferry._core):
        value = getattr(ferry._core, name)
        if isinstance(value, types.ModuleType):
            out[name] = value
    return out


MODULES = modules()


def test_every_submodule_has_a_stub():
    files = {f[:-4] for f in os.listdir(STUBS) if f.endswith(".pyi")}
    assert files == {"__init__"} | (set(MODULES) - {""})
    assert os.path.exists(os.path.join(STUBS, "..", "py.typed"))


@pytest.mark.parametrize("name", sorted(MODULES), ids=lambda n: "ferry._core" + ("." + n if n else ""))
def test_stub_lists_the_modules_public_names(name):
    module = MODULES[name]
    tree = load_stub(name)
    in_stub = public(stub_names(tree.body))
    in_module = public(dir(module))
    assert sorted(in_module - in_stub) == [], "in the extension, not in the stub: regenerate the stubs"
    assert sorted(in_stub - in_module) == [], "in the stub, not in the extension: regenerate the stubs"

    classes = {node.name: node for node in tree.body if isinstance(node, ast.ClassDef)}
    for cls_name, node in classes.items():
        cls = getattr(module, cls_name)
        assert inspect.isclass(cls), cls_name
        # Members the class itself defines (inherited ones are the base's).
        in_cls = public(vars(cls))
        in_stub_cls = public(stub_names(node.body))
        assert sorted(in_cls - in_stub_cls) == [], "%s: in the extension, not in the stub" % cls_name
        assert sorted(in_stub_cls - in_cls) == [], "%s: in the stub, not in the extension" % cls_name


def test_stubs_pass_mypy(tmp_path):
    """The stubs are valid for a type checker, not only parseable (mypy is in requirements-dev.txt)."""
    api = pytest.importorskip("mypy.api", reason="mypy is not installed")
    out, err, status = api.run(["--no-incremental", "--cache-dir", os.devnull, "--follow-imports=silent",
                                os.path.abspath(STUBS)])
    assert status == 0, out + err
