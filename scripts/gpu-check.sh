#!/usr/bin/env bash
# The GPU suite on a machine with an NVIDIA GPU: what `ctest -L gpu` and `pytest -m gpu` run.
#
#   scripts/gpu-check.sh --prepare [--python-headers PYTHON...]
#       On a machine with ferry's build dependencies (`make deps`): copies into .gpu-deps/ what a
#       bare GPU machine lacks (GoogleTest's sources, the headers of OpenSSL, CLI11, libibverbs and
#       librdmacm, a static libcrypto, and the Python headers of each interpreter named or of any
#       python3.12 found). .gpu-deps/ is ignored by git: it must be copied with the working tree.
#   scripts/gpu-check.sh [--build-dir DIR] [--python PYTHON] [--jobs N] [--fresh] [--no-require-cuda]
#       On the GPU machine: configures DIR (default build-gpu/) with only what such a machine is
#       sure to have (a compiler, CMake, Ninja, and a Python with pybind11, numpy and pytest) and
#       .gpu-deps/, builds the target ferry_gpu_suite (what the tests labelled gpu run: the library,
#       the Python extension, the ferry program, the gpu test executables and their peers), prints
#       the GPU (nvidia-smi) and what ferry makes of its CUDA driver (`ferry info`), then runs
#       `ctest -L gpu` and `pytest -m gpu` over the files that use the marker, with
#       FERRY_REQUIRE_CUDA=1: a missing driver or device fails instead of skipping, and so does any
#       test of the suite that skips. --no-require-cuda runs the same with the GPU tests skipping,
#       which checks the script on a machine without a GPU.
#
# The tree leaves out what needs libraries such a machine lacks: the redis:// and etcd:// stores,
# the object store's HTTP (their calls then say they were not built) and the ibverbs provider
# (docs/architecture.md, "Build"). GPU tests and bench rows are picked up by their ctest label and
# pytest marker `gpu`, never by file name.
#
# Each step is timed; the run ends with a table of the steps and one line: passed or failed. Logs
# and results go to $OUT when it is set, else to DIR/gpu-check/: gpu-check.log (all of it),
# configure.log, build.log, nvidia-smi.txt, ferry-info.txt, ferry-info.json, ctest-gpu.xml and
# pytest-gpu.xml (JUnit), summary.txt. The exit status is 0 only when every step passed.
# GPU_CHECK_CMAKE_ARGS adds configure arguments (separated by spaces), after the script's own;
# GPU_CHECK_BUILD_TIMEOUT is the build's limit in seconds (480: sized for 16 cores).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
DEPS="$ROOT/.gpu-deps"

usage() {
  sed -n '2,/^set -euo/p' "${BASH_SOURCE[0]}" | sed -e '$d' -e 's/^# \{0,1\}//'
  exit "${1:-0}"
}

# ---- --prepare: copy what a bare GPU machine lacks into .gpu-deps/ ----

copy_tree() {  # copy_tree SRC DEST: SRC's contents into DEST
  mkdir -p "$2"
  cp -a "$1/." "$2/"
}

prepare() {
  local headers_of=("$@") arch gtest=${FERRY_GTEST_SOURCE:-/usr/src/googletest} missing=()
  arch=$(gcc -print-multiarch 2>/dev/null || true)
  local inc=/usr/include lib=/usr/lib/${arch}
  [[ -f $gtest/googletest/CMakeLists.txt ]] || missing+=("GoogleTest's sources in $gtest (Debian: googletest)")
  [[ -f $inc/openssl/evp.h && -f $lib/libcrypto.a ]] || missing+=("OpenSSL's headers and libcrypto.a (Debian: libssl-dev)")
  [[ -f $inc/CLI/CLI.hpp && -f /usr/share/cmake/CLI11/CLI11Config.cmake ]] || missing+=("CLI11 (Debian: libcli11-dev)")
  [[ -f $inc/infiniband/verbs.h ]] || missing+=("<infiniband/verbs.h> (Debian: libibverbs-dev)")
  [[ -f $inc/rdma/rdma_cma.h ]] || missing+=("<rdma/rdma_cma.h> (Debian: librdmacm-dev)")
  if ((${#missing[@]})); then
    printf 'gpu-check --prepare: missing here: %s\n' "${missing[@]}" >&2
    exit 1
  fi
  rm -rf "$DEPS"
  mkdir -p "$DEPS/googletest" "$DEPS/prefix/include" "$DEPS/prefix/lib" "$DEPS/prefix/share/cmake"
  # GoogleTest: the top-level project and gtest (gmock, the docs, samples and gtest's own tests
  # stay behind; tests/CMakeLists.txt builds it with BUILD_GMOCK=OFF).
  cp "$gtest/CMakeLists.txt" "$DEPS/googletest/"
  mkdir -p "$DEPS/googletest/googletest"
  for part in CMakeLists.txt cmake include src; do
    cp -a "$gtest/googletest/$part" "$DEPS/googletest/googletest/"
  done
  find "$DEPS/googletest" -name '*.md' -delete  # the docs checks read every Markdown file in the tree
  # Header-only uses (CLI11; the object layer names libibverbs' and librdmacm's types; the ibverbs
  # provider, off in this tree, would load libibverbs at run time) and OpenSSL, linked statically so
  # nothing is needed at run time. The kernel's rdma/ headers go along with librdmacm's, as one set.
  copy_tree "$inc/openssl" "$DEPS/prefix/include/openssl"
  [[ -d $inc/$arch/openssl ]] && copy_tree "$inc/$arch/openssl" "$DEPS/prefix/include/openssl"
  cp "$lib/libcrypto.a" "$DEPS/prefix/lib/"
  copy_tree "$inc/CLI" "$DEPS/prefix/include/CLI"
  copy_tree /usr/share/cmake/CLI11 "$DEPS/prefix/share/cmake/CLI11"
  copy_tree "$inc/infiniband" "$DEPS/prefix/include/infiniband"
  copy_tree "$inc/rdma" "$DEPS/prefix/include/rdma"
  # Python's headers, for an interpreter installed without them (python3.X-dev): the GPU machine's
  # is Python 3.12, and headers of the same minor version build an extension it loads.
  if ((${#headers_of[@]} == 0)); then
    local pyenv_root
    pyenv_root=$(pyenv root 2>/dev/null || true)
    for py in "$(command -v python3.12 || true)" ${pyenv_root:+"$pyenv_root"/versions/3.12*/bin/python3.12}; do
      if [[ -x $py ]] && "$py" -c 'import sys' 2>/dev/null; then headers_of=("$py"); break; fi
    done
  fi
  for py in "${headers_of[@]}"; do
    local ver dir
    ver=$("$py" -c 'import sys; print("%d.%d" % sys.version_info[:2])')
    dir=$("$py" -c 'import sysconfig; print(sysconfig.get_paths()["include"])')
    if [[ ! -f $dir/Python.h ]]; then
      echo "gpu-check --prepare: $py has no Python.h in $dir" >&2
      exit 1
    fi
    copy_tree "$dir" "$DEPS/python/$ver/include"
    echo "Python $ver headers from $dir" >>"$DEPS/python/SOURCES"
  done
  [[ -d $DEPS/python ]] || echo "gpu-check --prepare: note: no Python 3.12 found here; the GPU machine's python3 then needs its own headers (python3.12-dev)" >&2
  cat >"$DEPS/README" <<EOF
Copied by scripts/gpu-check.sh --prepare on $(uname -m), $(ldd --version 2>/dev/null | head -1), for
scripts/gpu-check.sh on a machine that lacks them. Not tracked by git; rebuilt by --prepare.
  googletest/            from $gtest (gtest only)
  prefix/include/        openssl/ (with $inc/$arch/openssl), CLI/, infiniband/, rdma/ from $inc
  prefix/lib/libcrypto.a from $lib
  prefix/share/cmake/CLI11 from /usr/share/cmake/CLI11
  python/VERSION/include Python headers (python/SOURCES)
EOF
  uname -m >"$DEPS/ARCH"
  echo "gpu-check --prepare: $DEPS holds $(du -sh "$DEPS" | cut -f1) in $(find "$DEPS" -type f | wc -l) files:"
  du -sh "$DEPS"/* | sed 's/^/  /'
}

# ---- the check ----

BUILD_DIR="$ROOT/build-gpu"
PYTHON=python3
JOBS=$(nproc 2>/dev/null || echo 4)
FRESH=0
REQUIRE_CUDA=${FERRY_REQUIRE_CUDA:-1}
PREPARE=0
HEADERS_OF=()
while (($#)); do
  case $1 in
    --prepare) PREPARE=1 ;;
    --python-headers) shift; while (($#)) && [[ $1 != --* ]]; do HEADERS_OF+=("$1"); shift; done; continue ;;
    --build-dir) BUILD_DIR=$(realpath -m "$2"); shift ;;
    --python) PYTHON=$2; shift ;;
    --jobs) JOBS=$2; shift ;;
    --fresh) FRESH=1 ;;
    --no-require-cuda) REQUIRE_CUDA=0 ;;
    -h | --help) usage 0 ;;
    *) echo "gpu-check: unknown argument '$1' (--help lists them)" >&2; exit 2 ;;
  esac
  shift
done
if ((PREPARE)); then
  prepare ${HEADERS_OF[@]+"${HEADERS_OF[@]}"}
  exit 0
fi
# An absolute path (a virtual environment's python is not resolved: its link is what makes it one).
if [[ $PYTHON == */* ]]; then
  PYTHON="$(cd "$(dirname "$PYTHON")" && pwd)/$(basename "$PYTHON")"
else
  PYTHON=$(command -v "$PYTHON") || { echo "gpu-check: no $PYTHON on PATH" >&2; exit 1; }
fi

LOG_DIR=${OUT:-$BUILD_DIR/gpu-check}
((FRESH)) && rm -rf "$BUILD_DIR"
mkdir -p "$LOG_DIR" "$BUILD_DIR"
LOG_DIR=$(cd "$LOG_DIR" && pwd)
cd "$ROOT"
rm -f "$LOG_DIR"/{gpu-check.log,configure.log,build.log,ctest-gpu.xml,pytest-gpu.xml,summary.txt}
rm -f "$LOG_DIR"/{nvidia-smi.txt,ferry-info.txt,ferry-info.json}
exec > >(tee -a "$LOG_DIR/gpu-check.log") 2>&1
TEE_PID=$!

STEPS=()
FAILED=()
T0=$SECONDS
summary() {
  {
    echo "== gpu-check steps (wall time)"
    printf '  %s\n' "${STEPS[@]}"
    if ((${#FAILED[@]})); then
      echo "gpu-check: FAILED (${FAILED[*]}) after $((SECONDS - T0)) s; logs in $LOG_DIR"
    else
      echo "gpu-check: all ${#STEPS[@]} steps passed in $((SECONDS - T0)) s (FERRY_REQUIRE_CUDA=$REQUIRE_CUDA); logs in $LOG_DIR"
    fi
  } | tee "$LOG_DIR/summary.txt"
  exec >&- 2>&-
  wait "$TEE_PID" 2>/dev/null || true  # the log is whole when the script has exited
}
trap summary EXIT

# step NAME FUNCTION: runs it, records its wall time and whether it failed.
step() {
  local name=$1 t=$SECONDS rc=0 note=""
  echo "== $name"
  "$2" || rc=$?
  if ((rc)); then
    note="  FAILED, exit $rc"
    FAILED+=("$name")
  fi
  STEPS+=("$(printf '%-10s %5d s%s' "$name" $((SECONDS - t)) "$note")")
  return "$rc"
}

# limited SECONDS COMMAND...: COMMAND, stopped after SECONDS (exit 124, said so). timeout runs it
# in a process group of its own, so a stop of this script is passed on to it.
LIMITED_PID=
limited() {
  local limit=$1 rc=0
  shift
  timeout --kill-after=10 "$limit" "$@" &
  LIMITED_PID=$!
  wait "$LIMITED_PID" || rc=$?
  LIMITED_PID=
  if ((rc == 124 || rc == 137)); then echo "gpu-check: '$1' ran past its ${limit} s and was stopped"; fi
  return "$rc"
}
stopped() {
  echo "gpu-check: stopped by a signal"
  FAILED+=("stopped")
  [[ -n $LIMITED_PID ]] && kill -TERM "$LIMITED_PID" 2>/dev/null
  exit 143
}
trap stopped TERM INT HUP

# What the machine offers; the build needs a compiler, CMake, Ninja and the Python modules.
facts() {
  echo "host: $(uname -srm), $(nproc) cores, $(ldd --version 2>/dev/null | head -1)"
  echo "compiler: $(c++ --version 2>/dev/null | head -1 || echo 'no c++')"
  echo "cmake: $(cmake --version 2>/dev/null | head -1 || echo 'not found'); ninja: $(ninja --version 2>/dev/null || echo 'not found')"
  echo "python: $PYTHON = $("$PYTHON" -c 'import sys; print(sys.executable, sys.version.split()[0])')"
  timeout 90 "$PYTHON" - <<'EOF'
import importlib
for name in ("numpy", "pytest", "pybind11", "torch", "cupy"):
    try:
        module = importlib.import_module(name)
        extra = ""
        if name == "torch":
            extra = ", cuda %s, available: %s" % (module.version.cuda, module.cuda.is_available())
        print("  %s %s%s" % (name, getattr(module, "__version__", "?"), extra))
    except Exception as e:  # a module that is missing or does not load is reported, not fatal here
        print("  %s: not usable (%s)" % (name, str(e).splitlines()[0] if str(e) else type(e).__name__))
EOF
  if command -v nvcc >/dev/null; then echo "nvcc: $(nvcc --version | tail -1)"; else echo "nvcc: not found"; fi
  if command -v nvidia-smi >/dev/null; then
    nvidia-smi >"$LOG_DIR/nvidia-smi.txt" 2>&1 || true
    grep -m1 'CUDA Version' "$LOG_DIR/nvidia-smi.txt" | tr -s ' |' ' ' || true
    nvidia-smi --query-gpu=index,name,driver_version,memory.total --format=csv,noheader 2>&1 | sed 's/^/  gpu /' || true
  else
    echo "nvidia-smi: not found" | tee "$LOG_DIR/nvidia-smi.txt"
  fi
}

preflight() {
  local bad=0 py_include
  for tool in c++ cmake ninja ctest; do
    command -v "$tool" >/dev/null || { echo "gpu-check: $tool is not on PATH"; bad=1; }
  done
  "$PYTHON" -c 'import numpy, pytest, pybind11' || { echo "gpu-check: $PYTHON lacks numpy, pytest or pybind11"; bad=1; }
  if [[ ! -f $DEPS/README ]]; then
    echo "gpu-check: no $DEPS: run scripts/gpu-check.sh --prepare where the build dependencies are, and copy .gpu-deps/ with the tree"
    bad=1
  elif [[ $(cat "$DEPS/ARCH") != "$(uname -m)" ]]; then
    echo "gpu-check: $DEPS was prepared on $(cat "$DEPS/ARCH"), this machine is $(uname -m) (its libcrypto.a cannot link here)"
    bad=1
  fi
  py_include=$("$PYTHON" -c 'import sysconfig; print(sysconfig.get_paths()["include"])')
  PY_VERSION=$("$PYTHON" -c 'import sys; print("%d.%d" % sys.version_info[:2])')
  PYTHON_INCLUDE_ARG=()
  if [[ ! -f $py_include/Python.h ]]; then
    if [[ -f $DEPS/python/$PY_VERSION/include/Python.h ]]; then
      echo "python: no Python.h in $py_include; using the Python $PY_VERSION headers of .gpu-deps/"
      PYTHON_INCLUDE_ARG=("-DPython_INCLUDE_DIR=$DEPS/python/$PY_VERSION/include")
    else
      echo "gpu-check: $PYTHON has no Python.h ($py_include) and .gpu-deps/ has no Python $PY_VERSION headers (scripts/gpu-check.sh --prepare --python-headers PYTHON$PY_VERSION)"
      bad=1
    fi
  fi
  return "$bad"
}

configure() {
  local pybind11_dir EXTRA_CMAKE_ARGS=()
  read -ra EXTRA_CMAKE_ARGS <<<"${GPU_CHECK_CMAKE_ARGS:-}"
  pybind11_dir=$("$PYTHON" -m pybind11 --cmakedir) || return 1
  limited 300 cmake -S "$ROOT" -B "$BUILD_DIR" -G Ninja \
    -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    '-DCMAKE_C_FLAGS_RELWITHDEBINFO=-O2 -g1 -DNDEBUG' '-DCMAKE_CXX_FLAGS_RELWITHDEBINFO=-O2 -g1 -DNDEBUG' \
    -DFERRY_UNITY_BUILD=ON -DFERRY_CCACHE=OFF \
    -DFERRY_BUILD_TESTS=ON -DFERRY_BUILD_PYTHON=ON -DFERRY_WITH_CLI=ON \
    -DFERRY_WITH_REDIS=OFF -DFERRY_WITH_ETCD=OFF -DFERRY_WITH_HTTP=OFF -DFERRY_PROVIDER_IBVERBS=OFF \
    -DFERRY_GTEST_SOURCE_DIR="$DEPS/googletest" \
    -DCMAKE_PREFIX_PATH="$DEPS/prefix" -DOPENSSL_ROOT_DIR="$DEPS/prefix" -DOPENSSL_USE_STATIC_LIBS=TRUE \
    -DPython_EXECUTABLE="$PYTHON" -DPython3_EXECUTABLE="$PYTHON" \
    -Dpybind11_DIR="$pybind11_dir" ${PYTHON_INCLUDE_ARG[@]+"${PYTHON_INCLUDE_ARG[@]}"} \
    ${EXTRA_CMAKE_ARGS[@]+"${EXTRA_CMAKE_ARGS[@]}"} \
    >"$LOG_DIR/configure.log" 2>&1 || { tail -40 "$LOG_DIR/configure.log"; return 1; }
  grep -E '^-- (FERRY_|Found (OpenSSL|Python:|pybind11))|Warning' "$LOG_DIR/configure.log" || true
  echo "switches: $(grep -E '^FERRY_(WITH_[A-Z]+|PROVIDER_IBVERBS|UNITY_BUILD):' "$BUILD_DIR/CMakeCache.txt" | sed 's/:[A-Z]*=/=/' | tr '\n' ' ')"
}

build() {
  limited "${GPU_CHECK_BUILD_TIMEOUT:-480}" cmake --build "$BUILD_DIR" --target ferry_gpu_suite -j "$JOBS" >"$LOG_DIR/build.log" 2>&1 \
    || { grep -E -A5 'error|FAILED' "$LOG_DIR/build.log" | head -80; tail -5 "$LOG_DIR/build.log"; return 1; }
  tail -1 "$LOG_DIR/build.log"
  echo "compiler warnings: $(grep -c 'warning:' "$LOG_DIR/build.log" || true) (build.log)"
}

# ferry's view of the CUDA driver: the `cuda:` line of `ferry info`, and with FERRY_REQUIRE_CUDA=1
# a driver that is not usable is a failure here already.
ferry_info() {
  local ferry=$BUILD_DIR/ferry
  [[ -x $ferry ]] || { echo "gpu-check: $ferry was not built (FERRY_WITH_CLI)"; return 1; }
  limited 60 "$ferry" info >"$LOG_DIR/ferry-info.txt" 2>&1 || { cat "$LOG_DIR/ferry-info.txt"; return 1; }
  limited 60 "$ferry" info --json >"$LOG_DIR/ferry-info.json" || return 1
  sed '/^$/q' "$LOG_DIR/ferry-info.txt"  # the providers and the cuda line, before the devices
  "$PYTHON" - "$LOG_DIR/ferry-info.json" "$REQUIRE_CUDA" <<'EOF'
import json, sys
cuda = json.load(open(sys.argv[1]))["cuda"]
print("cuda (json):", json.dumps(cuda, sort_keys=True))
if sys.argv[2] == "1" and not cuda["usable"]:
    sys.exit("gpu-check: FERRY_REQUIRE_CUDA=1, but ferry finds no usable CUDA driver: " + cuda["reason"])
EOF
}

run_ctest() {
  limited 420 env FERRY_REQUIRE_CUDA="$REQUIRE_CUDA" ctest --test-dir "$BUILD_DIR" -L gpu --no-tests=error --output-on-failure \
    -j "$JOBS" --timeout 300 --output-junit "$LOG_DIR/ctest-gpu.xml"
}

run_pytest() {
  local files
  mapfile -t files < <(grep -rlE --include='test_*.py' --include='*_test.py' 'pytest\.mark\.gpu' tests bench | sort)
  ((${#files[@]})) || { echo "gpu-check: no test file uses the pytest marker gpu"; return 1; }
  echo "files with the marker gpu: ${files[*]}"
  limited 300 env FERRY_REQUIRE_CUDA="$REQUIRE_CUDA" PYTHONPATH="$BUILD_DIR/python" FERRY_TEST_BIN_DIR="$BUILD_DIR/tests" \
    "$PYTHON" -m pytest -m gpu -p no:cacheprovider -ra --tb=short --junitxml="$LOG_DIR/pytest-gpu.xml" "${files[@]}"
}

# With FERRY_REQUIRE_CUDA=1 the suite may not pass by skipping: any skipped case is a failure.
no_skips() {
  "$PYTHON" - "$LOG_DIR/ctest-gpu.xml" "$LOG_DIR/pytest-gpu.xml" <<'EOF'
import os, sys
import xml.etree.ElementTree as ET
skipped = []
for path in sys.argv[1:]:
    if not os.path.exists(path):
        sys.exit("gpu-check: %s is missing" % path)
    for case in ET.parse(path).iter("testcase"):
        if case.find("skipped") is not None or case.get("status") in ("notrun", "disabled", "skipped"):
            why = case.find("skipped")
            skipped.append("%s (%s)" % (case.get("name"), why.get("message", "") if why is not None else case.get("status")))
for s in skipped:
    print("skipped:", s)
sys.exit("gpu-check: FERRY_REQUIRE_CUDA=1 and %d GPU test(s) skipped" % len(skipped) if skipped else 0)
EOF
}

# pip installs cmake and ninja next to the interpreter, which is not always on PATH.
for dir in "$("$PYTHON" -c 'import sysconfig; print(sysconfig.get_path("scripts"))' 2>/dev/null || true)" \
  "$("$PYTHON" -c 'import site, os; print(os.path.join(site.USER_BASE, "bin"))' 2>/dev/null || true)"; do
  [[ -n $dir && -d $dir && ":$PATH:" != *":$dir:"* ]] && PATH="$PATH:$dir"
done
export PATH

echo "gpu-check: $ROOT -> $BUILD_DIR, FERRY_REQUIRE_CUDA=$REQUIRE_CUDA, $JOBS jobs, logs in $LOG_DIR"
step facts facts || true
step preflight preflight || exit 1
step configure configure || exit 1
step build build || exit 1
step info ferry_info || true
step ctest run_ctest || true
step pytest run_pytest || true
if [[ $REQUIRE_CUDA == 1 ]]; then
  step no-skips no_skips || true
fi
((${#FAILED[@]} == 0))
