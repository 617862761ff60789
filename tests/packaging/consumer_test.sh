#!/usr/bin/env bash
# `cmake --install` of a built tree into a fresh prefix, then a small project built against it with
# find_package(ferry) and again with pkg-config; both programs run. Only the runtime and development
# components are installed, and nothing lands outside the prefix.
#   consumer_test.sh BUILD_DIR
set -euo pipefail
build=$(cd "$1" && pwd)
here=$(cd "$(dirname "$0")" && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
prefix=$work/prefix

cmake --install "$build" --prefix "$prefix" --component runtime >/dev/null
cmake --install "$build" --prefix "$prefix" --component development >/dev/null
for f in bin/ferry include/ferry/devices.h; do
  [[ -e $prefix/$f ]] || { echo "consumer_test: $f not installed" >&2; exit 1; }
done
pc=$(find "$prefix" -name ferry.pc)
config=$(find "$prefix" -name ferryConfig.cmake)
[[ -n $pc && -n $config ]] || { echo "consumer_test: no ferry.pc or ferryConfig.cmake" >&2; exit 1; }
if find "$prefix" -name '_core*.so' | grep -q .; then
  echo "consumer_test: the Python extension was installed by cmake --install" >&2; exit 1
fi
libdir=$(dirname "$(find "$prefix" -name 'libferry.so' | head -1)")

echo "== find_package(ferry)"
cmake -S "$here/consumer" -B "$work/cmake-build" -G Ninja -DCMAKE_PREFIX_PATH="$prefix" >/dev/null
cmake --build "$work/cmake-build" >/dev/null
LD_LIBRARY_PATH=$libdir "$work/cmake-build/consumer" | tee "$work/out1"
grep -q "^ferry [0-9]" "$work/out1"
grep -q "^soft_lo max_qp" "$work/out1"

echo "== pkg-config ferry"
export PKG_CONFIG_PATH=$(dirname "$pc")
version=$(pkg-config --modversion ferry)
# shellcheck disable=SC2046
g++ "$here/consumer/main.cc" -o "$work/consumer-pc" $(pkg-config --cflags --libs ferry)
LD_LIBRARY_PATH=$libdir "$work/consumer-pc" | tee "$work/out2"
grep -q "^ferry $version\$" "$work/out2"
"$prefix/bin/ferry" --version | grep -q "^ferry $version\$"
echo "consumer_test: find_package and pkg-config builds of an installed ferry $version run"
