#!/usr/bin/env bash
# Regenerates the type stubs of the extension module, python/ferry/_core/*.pyi, from a built
# ferry._core with pybind11-stubgen (requirements-dev.txt).
#
#   scripts/generate-stubs.sh [PYTHONPATH]   default: build/python (where the build puts ferry)
#
# tests/python/test_stubs.py fails when the extension and the stubs list different public names;
# run this after adding or removing a binding, and review the diff.
set -euo pipefail

repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
python="${PYTHON:-$repo_root/.venv/bin/python}"
out="$(mktemp -d)"
trap 'rm -rf "$out"' EXIT

# Bindings whose signatures name a C++ type (ferry::endpoint::Future) are printed as they are and
# then shortened to the Python class of the same module.
PYTHONPATH="${1:-$repo_root/build/python}" "$python" -m pybind11_stubgen ferry._core -o "$out" \
  --ignore-invalid-expressions "ferry::.*" --print-invalid-expressions-as-is --exit-code
# Then what mypy refuses in stubgen's output: a parameter of a class type defaulting to None
# (PEP 484 has no implicit Optional), and __hash__ = None of classes that define __eq__ (typeshed's
# spelling with its ignore comment).
sed -i -E -e 's/ferry::[a-z_]+::([A-Za-z_]+)/\1/g' \
  -e 's/([a-z_]+): ([A-Za-z_][A-Za-z_.]*) = None([,)])/\1: \2 | None = None\3/g' \
  -e 's/^( +__hash__: typing\.ClassVar\[None\] = None)$/\1  # type: ignore[assignment]/' \
  "$out"/ferry/_core/*.pyi
rm -rf "$repo_root/python/ferry/_core"
cp -r "$out/ferry/_core" "$repo_root/python/ferry/_core"
"$python" -c "import ast, glob, sys; [ast.parse(open(f).read(), f) for f in glob.glob(sys.argv[1] + '/*.pyi')]" \
  "$repo_root/python/ferry/_core"
echo "stubs written to python/ferry/_core/"
