#!/usr/bin/env bash
# Two processes in two network namespaces, joined by a veth pair, move data through RDMA WRITE and
# READ over the soft devices of their veth ends, verified byte for byte by `ferry demo`.
# Exit 77 (skipped) where namespaces cannot be made (not root, no iproute2).
set -u
ferry="$1"
size="${2:-67108864}"
if [ "$(id -u)" != 0 ] || ! command -v ip >/dev/null 2>&1; then
  echo "SKIP: needs root and iproute2 to create network namespaces"
  exit 77
fi
tag="f$$"
nsa="ferry_${tag}_a"
nsb="ferry_${tag}_b"
cleanup() {
  ip netns del "$nsa" 2>/dev/null
  ip netns del "$nsb" 2>/dev/null
}
trap cleanup EXIT
if ! ip netns add "$nsa" 2>/dev/null || ! ip netns add "$nsb" 2>/dev/null; then
  echo "SKIP: cannot create network namespaces here"
  exit 77
fi
set -e
ip link add "${tag}a" netns "$nsa" type veth peer name "${tag}b" netns "$nsb"
ip -n "$nsa" addr add 10.213.0.1/30 dev "${tag}a"
ip -n "$nsb" addr add 10.213.0.2/30 dev "${tag}b"
ip -n "$nsa" link set lo up
ip -n "$nsb" link set lo up
ip -n "$nsa" link set "${tag}a" up
ip -n "$nsb" link set "${tag}b" up
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
