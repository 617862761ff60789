"""Every public name of the ``ferry`` package says what it does and carries its types.

The names checked are those of ``ferry.__all__`` and, for each public module (MODULES, and every
module under ``ferry.agent``), its ``__all__``, or without one the classes and functions the module
defines. For each of them:

- a module, class, function or method has a non-empty docstring; so does every public method and
  property of a class. Members a class inherits from outside ferry (``Exception.args``,
  ``BaseModel.model_dump``) are their library's, and so are names re-exported from the standard
  library (``ferry.verbs.WeakSet``). For a function or method of the extension (``ferry._core``),
  the signature line that pybind11 writes into ``__doc__`` does not count: the text after it is
  the docstring. Those docstrings come from the C++ bindings; the ones still missing there are
  listed in EXTENSION_DOCSTRINGS_DUE, and an entry that has its docstring fails the test until it
  is removed from the list.
- a function or method written in Python annotates every parameter and its return, and does not
  return a bare ``Any``: what a caller gets is what a type checker sees. The methods a caller
  reaches through syntax (``__init__``, ``__enter__``, ``__await__`` ...) count, so that
  ``with ferry.start_peer_agent() as agent`` gives a ``PeerAgent``, not ``Any``.
- a value that is not a module, class or routine is data. Data is exempt only when it is a plain
  constant: a number, a string, None, a member of an enum, or a NumPy dtype (a record layout).
  Constants are documented together in their module (``#:`` comments, the module docstring), not
  one by one; so are the fields of a structure (slots, named-tuple fields), described with their
  class. Anything else is an offender.

A failure lists every offender by the name it is defined under.

The last test runs mypy, with pyproject.toml's configuration, over the examples (except
examples/nixl), the checked modules and a probe of the calls whose types users rely on.

``ferry.nixl`` is left out of these checks.
"""

import enum
import glob
import importlib
import inspect
import os
import pkgutil
import re
import subprocess
import sys

import pytest

import ferry

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))

LEFT_OUT = ("ferry.nixl",)

MODULES = [
    "ferry", "ferry.verbs", "ferry.rdma", "ferry.path", "ferry.IBA", "ferry.endpoint", "ferry.agent",
    "ferry.aio", "ferry.connect", "ferry.objects", "ferry.metrics", "ferry.errors", "ferry.tools",
    "ferry.vtools",
]

# The methods that a caller reaches through syntax or a protocol: their types matter as much as a
# public method's (the type of ``x`` in ``with obj as x`` is ``__enter__``'s return).
SPECIAL_METHODS = {
    "__init__", "__new__", "__call__", "__enter__", "__exit__", "__aenter__", "__aexit__", "__await__",
    "__iter__", "__next__", "__len__", "__getitem__", "__setitem__", "__contains__", "__bool__",
    "__int__", "__eq__", "__hash__", "__str__", "__repr__", "__reduce__", "__copy__", "__del__",
}

# Docstrings the extension does not give yet (python/src/*_bindings.cc): classes, and members by
# class. They are written in the C++ bindings, not patched in from Python.
EXTENSION_CLASS_DOCSTRINGS_DUE: set = set()
EXTENSION_MEMBER_DOCSTRINGS_DUE: dict = {}


def extension_docstrings_due():
    due = set(EXTENSION_CLASS_DOCSTRINGS_DUE)
    for cls, members in EXTENSION_MEMBER_DOCSTRINGS_DUE.items():
        due.update("%s.%s" % (cls, member) for member in members.split())
    return due


def _is_public(name):
    return not name.startswith("_")


def _submodules(package):
    """``package`` and every module below it, by name, except the ones left out."""
    names = [package.__name__]
    for info in pkgutil.walk_packages(getattr(package, "__path__", []), package.__name__ + "."):
        names.append(info.name)
    return [n for n in names if not any(n == x or n.startswith(x + ".") for x in LEFT_OUT)]


def checked_modules():
    names = []
    for name in MODULES:
        module = importlib.import_module(name)
        names.extend(_submodules(module) if name == "ferry.agent" else [name])
    return names


def public_names(module):
    """The module's ``__all__``, else the public classes and functions it defines."""
    if hasattr(module, "__all__"):
        return list(module.__all__)
    return sorted(name for name, value in vars(module).items()
                  if _is_public(name) and (inspect.isclass(value) or inspect.isroutine(value))
                  and getattr(value, "__module__", None) == module.__name__)


# pybind11 writes the signature of each overload into __doc__: "name(a: int) -> str", or
# "name(*args, **kwargs)" and "Overloaded function." followed by "1. name(...) -> ...".
_SIGNATURE_LINE = re.compile(r"^\s*(\d+\.\s+)?[A-Za-z_][A-Za-z0-9_]*\(.*\)(\s*->\s*.+)?\s*$")


def _is_extension_routine(obj):
    return inspect.isroutine(obj) and not inspect.isfunction(inspect.unwrap(obj)) and not inspect.ismethod(obj)


def docstring(obj):
    """The docstring of ``obj`` (a class's own, never a base's) without the signature lines
    pybind11 writes, stripped."""
    doc = obj.__dict__.get("__doc__") if isinstance(obj, type) else getattr(obj, "__doc__", None)
    if not isinstance(doc, str):
        return ""
    if _is_extension_routine(obj):
        doc = "\n".join(line for line in doc.splitlines()
                        if not _SIGNATURE_LINE.match(line) and line.strip() != "Overloaded function.")
    return doc.strip()


def is_plain_constant(value):
    if value is None or isinstance(value, (bool, int, float, complex, str, bytes, enum.Enum)):
        return True
    numpy = sys.modules.get("numpy")
    return numpy is not None and isinstance(value, numpy.dtype)


def _is_field(value):
    """A structure's field: a slot, a getset descriptor or a named tuple's field."""
    return type(value).__name__ in ("member_descriptor", "getset_descriptor", "_tuplegetter")


def _from_ferry(obj):
    return (getattr(obj, "__module__", None) or "").split(".")[0] == "ferry"


def _defined_name(obj):
    return "%s.%s" % (obj.__module__, obj.__qualname__)


def _defining_class(cls, name):
    for klass in cls.__mro__:
        if name in vars(klass):
            return klass
    return None


class Report:
    def __init__(self):
        self.undocumented = []
        self.untyped = []
        self.other = []
        self.seen = set()

    def lines(self):
        out = []
        for title, names in (("no docstring", self.undocumented), ("missing annotations", self.untyped),
                             ("neither a documented object nor a plain constant", self.other)):
            if names:
                out.append("%s (%d):" % (title, len(set(names))))
                out.extend("  " + n for n in sorted(set(names)))
        return out


def _annotation_gaps(func, skip_first):
    """The parameters of a Python function without an annotation, "return" when the return has
    none, and "return (a bare Any)"."""
    signature = inspect.signature(func)
    params = list(signature.parameters.values())
    if skip_first and params and params[0].kind in (params[0].POSITIONAL_ONLY, params[0].POSITIONAL_OR_KEYWORD):
        params = params[1:]
    gaps = [p.name for p in params if p.annotation is inspect.Parameter.empty]
    ret = signature.return_annotation
    if ret is inspect.Signature.empty:
        gaps.append("return")
    elif ret in ("Any", "typing.Any") or repr(ret) == "typing.Any":
        gaps.append("return (a bare Any)")
    return gaps


def check_routine(report, qualname, func, *, method, need_doc=True):
    """A function (or a class's method): its docstring and, when written in Python, its types."""
    if need_doc and not docstring(func):
        report.undocumented.append(qualname)
    target = inspect.unwrap(func)
    if inspect.isfunction(target) and _from_ferry(target):
        gaps = _annotation_gaps(target, skip_first=method)
        if gaps:
            report.untyped.append("%s (%s)" % (qualname, ", ".join(gaps)))


def check_class(report, qualname, cls):
    if cls in report.seen:
        return
    report.seen.add(cls)
    if not docstring(cls):
        report.undocumented.append(qualname)
    for name in sorted(dir(cls)):
        special = name in SPECIAL_METHODS
        if not (_is_public(name) or special):
            continue
        owner = _defining_class(cls, name)
        if owner is None or not _from_ferry(owner):
            continue  # inherited from Python or a library: documented there
        raw = vars(owner)[name]
        # Named where it is defined: a member that many public classes inherit is one offender.
        member = "%s.%s" % (qualname if owner is cls else _defined_name(owner), name)
        if isinstance(raw, (staticmethod, classmethod)):
            check_routine(report, member, raw.__func__, method=isinstance(raw, classmethod) or name == "__new__",
                          need_doc=not special)
        elif isinstance(raw, property):
            if not special and not docstring(raw):
                report.undocumented.append(member)
            for accessor in (raw.fget, raw.fset):
                if accessor is not None:
                    check_routine(report, member, accessor, method=True, need_doc=False)
        elif inspect.isroutine(raw):
            check_routine(report, member, raw, method=True, need_doc=not special)
        elif inspect.isclass(raw):
            if not special:
                check_class(report, member, raw)
        elif special or is_plain_constant(raw) or _is_field(raw) or isinstance(raw, (tuple, dict, frozenset)):
            continue  # data: a field, a default, a table, described with the class
        else:
            report.other.append(member)


def check_name(report, qualname, value):
    if inspect.ismodule(value):
        if not docstring(value):
            report.undocumented.append(qualname)
    elif inspect.isclass(value):
        if _from_ferry(value):
            check_class(report, _defined_name(value), value)
    elif inspect.isroutine(value):
        if _from_ferry(value):
            check_routine(report, qualname, value, method=False)
    elif not is_plain_constant(value):
        report.other.append(qualname)


def collect():
    report = Report()
    for module_name in checked_modules():
        module = importlib.import_module(module_name)
        if not docstring(module):
            report.undocumented.append(module_name)
        for name in public_names(module):
            check_name(report, "%s.%s" % (module_name, name), getattr(module, name))
    return report


def test_the_checked_modules_are_every_public_module():
    public = {n for n in _submodules(ferry) if all(_is_public(part) for part in n.split("."))}
    assert sorted(public - set(checked_modules())) == [], "a public module this test does not check"


def test_every_public_name_has_a_docstring_and_types():
    report = collect()
    due = extension_docstrings_due()
    undocumented = set(report.undocumented)
    report.undocumented = sorted(undocumented - due)
    lines = report.lines()
    assert not lines, "\n" + "\n".join(lines)
    documented_now = sorted(due - undocumented)
    assert not documented_now, ("documented in the bindings now: remove from EXTENSION_*_DOCSTRINGS_DUE:\n  "
                                + "\n  ".join(documented_now))


def test_the_checks_find_offenders():
    """The checks report what they are meant to (a check that finds nothing always passes)."""

    def untyped(a, b: int):
        return a

    def typed(a: int) -> int:
        """Doubles."""
        return 2 * a

    def returns_any(a: int) -> "Any":
        """Anything."""

    class Sample:
        """A class."""

        limit = 3

        def method(self, x: int) -> int:
            return x

        @property
        def size(self) -> int:
            """Bytes."""
            return 0

        def __enter__(self):
            return self

        def _private(self, x):
            return x

    for obj in (untyped, typed, returns_any, Sample, Sample.method, Sample.__enter__, Sample._private):
        obj.__module__ = "ferry.sample"
    Sample.__qualname__ = "Sample"
    report = Report()
    for name, value in (("untyped", untyped), ("typed", typed), ("returns_any", returns_any), ("Sample", Sample),
                        ("table", {"a": 1}), ("LIMIT", 3)):
        check_name(report, "ferry.sample." + name, value)
    assert sorted(report.undocumented) == ["ferry.sample.Sample.method", "ferry.sample.untyped"]
    assert sorted(report.untyped) == ["ferry.sample.Sample.__enter__ (return)",
                                      "ferry.sample.returns_any (return (a bare Any))",
                                      "ferry.sample.untyped (a, return)"]
    assert report.other == ["ferry.sample.table"]
    # pybind11's signature line alone is no docstring; the text after it is one.
    assert _SIGNATURE_LINE.match("drain(self: ferry._core.endpoint.DoneNotifier) -> list[int]")
    assert docstring(ferry._core.endpoint.available_nic).startswith("The names of every usable device")
    assert docstring(ferry._core.endpoint.Future.done).startswith("Whether the operation completed")
    assert not _SIGNATURE_LINE.match(docstring(ferry._core.endpoint.Future.done))


def example_files():
    files = set(glob.glob(os.path.join(ROOT, "examples", "*.py")))
    files |= set(glob.glob(os.path.join(ROOT, "examples", "**", "*.py"), recursive=True))
    return sorted(f for f in files if not f.startswith(os.path.join(ROOT, "examples", "nixl") + os.sep))


def module_files():
    """The source files of the checked modules (python/ferry/...)."""
    files = []
    for name in checked_modules():
        base = os.path.join(ROOT, "python", *name.split("."))
        files.append(os.path.join(base, "__init__.py") if os.path.isdir(base) else base + ".py")
    return files


# The calls whose types programs rely on: each must give exactly this type, never Any.
API_PROBE = '''
from typing import Dict, List

from typing_extensions import assert_type

import ferry
import ferry.verbs as ibv
from ferry.connect import Connector, Descriptor, ReadableOperation, ReadOperation
from ferry.objects import ObjectClient, ObjectInfo


def agent(a: ferry.PeerAgent, conn: ferry.PeerConnection) -> None:
    assert_type(a.read("decode-0", [("kv", 0, 0, 4096)]), ferry.ReadWriteFuture)
    assert_type(a.write(conn, ("kv", "kv2", 0, 0, 4096)), ferry.ReadWriteFuture)
    assert_type(a.write_with_imm("decode-0", [ferry.Assignment(local=1, remote=2, length=8)], 7),
                ferry.ReadWriteFuture)
    assert_type(a.send("decode-0", ("inbox", 0, 256)), ferry.SendFuture)
    assert_type(a.recv(conn, [("inbox", 0, 128), ("inbox", 128, 128)]), ferry.RecvFuture)
    assert_type(a.imm_recv("decode-0"), ferry.ImmRecvFuture)
    assert_type(a.connect_to("decode-0"), ferry.PeerConnection)
    assert_type(a.get_mr_info("decode-0", "kv"), Dict[str, int])
    assert_type(a.lanes("decode-0"), Dict[str, str])
    with ferry.start_peer_agent(store="", alias="prefill-0") as b:
        assert_type(b, ferry.PeerAgent)
        assert_type(b.address, bytes)


async def awaited(a: ferry.PeerAgent) -> None:
    assert_type(await a.recv("decode-0", ("inbox", 0, 256)), int)
    assert_type(await a.imm_recv("decode-0"), int)


def endpoints() -> None:
    with ferry.RDMAEndpoint(device_name=ferry.available_nic()[0], num_qp=2) as ep:
        assert_type(ep, ferry.RDMAEndpoint)
        assert_type(ep.register_memory_region("kv", bytearray(64)), int)
        assert_type(ep.read([(1, 2, 0, 0, 8)]), ferry.ReadWriteFuture)


def verbs() -> None:
    with ferry.get_verbs(ferry.get_end_port()) as ctx:
        assert_type(ctx, ibv.Context)
        with ctx.pd() as pd:
            assert_type(pd, ibv.PD)
            assert_type(pd.mr(bytearray(64), ibv.IBV_ACCESS_LOCAL_WRITE), ibv.MR)
        assert_type(ctx.query_port().active_mtu, int)
        assert_type(ctx.query_device().node_guid, ferry.IBA.GUID)
        event = ctx.get_async_event(0)
        if event is not None:
            assert_type(event.event_type, int)
        assert_type(ibv.qp_attr(qp_state=ibv.IBV_QPS_INIT).MASK, int)


def objects(client: ObjectClient) -> None:
    assert_type(client.get("models", "w.bin"), bytes)
    assert_type(client.list("models"), List[ObjectInfo])


async def connect(connector: Connector, data: bytearray) -> None:
    readable = connector.create_readable(Descriptor(data))
    assert_type(readable, ReadableOperation)
    async with readable as op:
        assert_type(op, ReadableOperation)
    read = await connector.begin_read(readable.metadata(), Descriptor(data))
    assert_type(read, ReadOperation)
'''


def test_the_examples_and_the_package_pass_mypy(tmp_path):
    """mypy with pyproject.toml's configuration: the package comes from python/ (with the
    extension's stubs), ferry's own functions are fully annotated, and the examples' bodies and
    the probe above are checked against those types. The examples are scripts in the verbs
    specification's style: a variable takes another type for the next step, and values known to be
    set (a resolved path's GIDs, a pipe the script opened) are used without a None check; so they
    are checked with redefinitions allowed and without strict Optional, which ferry's modules keep
    (their section in pyproject.toml)."""
    pytest.importorskip("mypy", reason="mypy is not installed")
    probe = tmp_path / "ferry_api_probe.py"
    probe.write_text(API_PROBE)
    files = example_files()
    assert len(files) >= 10, files
    command = [sys.executable, "-m", "mypy", "--config-file", os.path.join(ROOT, "pyproject.toml"),
               "--no-incremental", "--cache-dir", os.devnull, "--allow-redefinition-new", "--local-partial-types",
               "--no-strict-optional"] + files + module_files() + [str(probe)]
    run = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stdout + run.stderr
