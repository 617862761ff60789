#!/usr/bin/env bash
# pip as a user runs it: builds ferry's wheel from the source tree, installs it into a fresh virtual
# environment that has nothing else (pip fetches the declared dependencies), and then, with that
# environment only:
#   - `ferry` is on PATH and reports the package's version;
#   - the wheel holds nothing outside the ferry package, its dist-info and the ferry program;
#   - `ferry demo` moves 16 MiB between two processes;
#   - two Python processes move a block through the installed package (wheel_transfer.py).
#   wheel_test.sh SOURCE_DIR PYTHON
set -euo pipefail
src=$(cd "$1" && pwd)
python=$2
here=$(cd "$(dirname "$0")" && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# ccache's counters before and after, to show how much of the wheel's compile the cache served.
cache_stats() { command -v ccache >/dev/null && ccache --print-stats 2>/dev/null | awk '$1 ~ /^(direct_cache_hit|preprocessed_cache_hit|cache_miss)$/ {n[$1]=$2} END {print n["direct_cache_hit"]+n["preprocessed_cache_hit"], n["cache_miss"]+0}' || true; }

echo "== pip wheel (CC=${CC:-default} CXX=${CXX:-default})"
before=$(cache_stats)
"$python" -m pip wheel "$src" -w "$work/dist" --no-deps -q
after=$(cache_stats)
if [[ -n $before && -n $after ]]; then
  read -r h0 m0 <<<"$before"; read -r h1 m1 <<<"$after"
  echo "compiler cache: $((h1 - h0)) hits, $((m1 - m0)) compiled"
fi
wheel=$(ls "$work"/dist/ferry-*.whl)
echo "built $(basename "$wheel")"

echo "== what the wheel holds"
"$python" - "$wheel" <<'PY'
import sys, zipfile
names = zipfile.ZipFile(sys.argv[1]).namelist()
stray = [n for n in names if not (n.startswith("ferry/") or ".dist-info/" in n
                                  or (".data/scripts/" in n and n.endswith("/ferry")))]
if stray:
    sys.exit("wheel_test: files outside the package: %s" % stray[:10])
if not any(n.endswith(".data/scripts/ferry") for n in names):
    sys.exit("wheel_test: no ferry program in the wheel")
if not any(n.startswith("ferry/_core") and n.endswith(".so") for n in names):
    sys.exit("wheel_test: no extension module in the wheel")
for typed in ("ferry/py.typed", "ferry/_core/__init__.pyi"):
    if typed not in names:
        sys.exit("wheel_test: %s is not in the wheel" % typed)
print("%d files, all under ferry/, dist-info and scripts/ferry" % len(names))
PY

echo "== a fresh venv"
"$python" -m venv "$work/venv"
"$work/venv/bin/pip" install -q "$wheel"
export PATH=$work/venv/bin:/usr/bin:/bin
unset PYTHONPATH LD_LIBRARY_PATH
cd "$work"
[[ $(command -v ferry) == "$work/venv/bin/ferry" ]] || { echo "wheel_test: ferry is not the venv's" >&2; exit 1; }
version=$(python -c 'import ferry; print(ferry.__version__)')
[[ $(ferry --version) == "ferry $version" ]] || { echo "wheel_test: ferry --version != $version" >&2; exit 1; }
python -c 'import importlib.metadata as m; import ferry; assert m.version("ferry") == ferry.__version__'
echo "ferry $version from $(command -v ferry)"

echo "== ferry demo (two processes)"
ferry demo --size 16777216

echo "== two Python processes through the installed package"
python "$here/wheel_transfer.py"
echo "wheel_test: the wheel installs alone and moves data between processes"
