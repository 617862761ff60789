#!/usr/bin/env bash
# Two processes in two network namespaces, joined by a veth pair, move data through RDMA WRITE and
# READ over the soft devices of their veth ends, verified byte for byte by `ferry demo`.
# Exit 77 (skipped) where namespaces cannot be made (not root, no iproute2).
set -u
ferry="$1"
size="${2:-67108864}"
. "$(dirname "$0")/netns_lib.sh"
tag="f$$"
netns_pair "$tag" 10.213.0
set +e
out=$(timeout 120 ip netns exec "$nsa" "$ferry" demo --size "$size" --device "soft_${tag}a" \
      --target-device "soft_${tag}b" --target-via "ip netns exec $nsb" 2>&1)
rc=$?
echo "$out"
if [ $rc -ne 0 ]; then
  echo "FAIL: ferry demo across namespaces exited $rc"
  exit 1
fi
echo "$out" | grep -q "RDMA WRITE .* verified" || { echo "FAIL: no verified WRITE"; exit 1; }
echo "$out" | grep -q "RDMA READ .* verified" || { echo "FAIL: no verified READ"; exit 1; }
echo "PASS: WRITE and READ across network namespaces"
