#!/usr/bin/env bash
# The soak: two processes in two network namespaces joined by a veth pair whose both ends delay,
# reorder and drop packets (tc netem: 2 ms +- 1 ms delay, 1% loss, 5% reordering), moving data by
# RDMA WRITE and READ over the soft devices of their veth ends, again and again for SOAK_SECONDS
# (default 600), each run verified byte for byte by `ferry demo`. Prints the runs, the bytes
# verified and the throughput; fails on the first run that fails or does not verify.
#
# usage: netns_soak.sh FERRY [SECONDS] [SIZE]
# Exit 77 (skipped) where namespaces or netem cannot be made (not root, no iproute2, a kernel
# without sch_netem).
set -u
ferry="$1"
seconds="${2:-${SOAK_SECONDS:-600}}"
size="${3:-67108864}"
if ! command -v tc >/dev/null 2>&1; then
  echo "SKIP: needs tc for netem"
  exit 77
fi
. "$(dirname "$0")/netns_lib.sh"
tag="s$$"
netns_pair "$tag" 10.214.0
for end in "$nsa ${tag}a" "$nsb ${tag}b"; do
  set -- $end
  if ! err=$(ip netns exec "$1" tc qdisc add dev "$2" root netem delay 2ms 1ms loss 1% reorder 5% 50% 2>&1); then
    echo "SKIP: tc netem is not available on this kernel ($err)"
    exit 77
  fi
done
echo "soak: ${seconds} s of ferry demo (${size} bytes WRITE and READ per run) across namespaces, netem: $(ip netns exec "$nsa" tc qdisc show dev "${tag}a" | head -1)"
start=$(date +%s)
runs=0
while :; do
  now=$(date +%s)
  [ $((now - start)) -ge "$seconds" ] && break
  out=$(timeout 300 ip netns exec "$nsa" "$ferry" demo --size "$size" --device "soft_${tag}a" \
        --target-device "soft_${tag}b" --target-via "ip netns exec $nsb" 2>&1)
  rc=$?
  if [ $rc -ne 0 ] || ! echo "$out" | grep -q "RDMA WRITE .* verified" || ! echo "$out" | grep -q "RDMA READ .* verified"; then
    echo "$out"
    echo "FAIL: run $((runs + 1)) exited $rc or did not verify"
    exit 1
  fi
  runs=$((runs + 1))
done
elapsed=$(( $(date +%s) - start ))
bytes=$((runs * size * 2))
echo "soak: $runs runs in ${elapsed} s, $((bytes / 1048576)) MiB moved and verified (WRITE and READ), $((bytes / 1048576 / (elapsed > 0 ? elapsed : 1))) MiB/s on average including process start-up, 0 corrupted or lost bytes"
echo "PASS: soak across network namespaces under netem"
