#!/usr/bin/env bash
# The soak: two processes in two network namespaces joined by a link that delays, reorders and
# drops packets (2 ms +- 1 ms delay, 1% loss, 5% reordering), moving data by RDMA WRITE and READ
# over the soft devices of the link's ends (TCP only, FERRY_SOFT_SAME_HOST=0), again and again for SOAK_SECONDS (default 600), each
# run verified byte for byte by `ferry demo`. Prints the runs, the bytes verified and the
# throughput; fails on the first run that fails or does not verify.
#
# The link is a veth pair under `tc netem` where the kernel has sch_netem; elsewhere a pair of TUN
# devices whose packets tests/netns/impair.py forwards with the same impairments.
#
# usage: netns_soak.sh FERRY [SECONDS] [SIZE]
# Exit 77 (skipped) where namespaces cannot be made (not root, no iproute2) or neither netem nor
# TUN devices are available.
set -u
ferry="$1"
seconds="${2:-${SOAK_SECONDS:-600}}"
size="${3:-16777216}"
here="$(cd "$(dirname "$0")" && pwd)"
. "$here/netns_lib.sh"
tag="s$$"
netns_pair "$tag" 10.214.0
impair_pid=""
impair_log="$(mktemp)"
cleanup() {
  if [ -n "$impair_pid" ]; then
    kill -TERM "$impair_pid" 2>/dev/null
    wait "$impair_pid" 2>/dev/null
    tail -n 1 "$impair_log"
  fi
  rm -f "$impair_log"
  ip netns del "$nsa" 2>/dev/null
  ip netns del "$nsb" 2>/dev/null
}
trap cleanup EXIT
if command -v tc >/dev/null 2>&1 &&
   ip netns exec "$nsa" tc qdisc add dev "${tag}a" root netem delay 2ms 1ms loss 1% reorder 5% 50% 2>/dev/null &&
   ip netns exec "$nsb" tc qdisc add dev "${tag}b" root netem delay 2ms 1ms loss 1% reorder 5% 50% 2>/dev/null; then
  deva="soft_${tag}a"
  devb="soft_${tag}b"
  link="veth under tc netem: $(ip netns exec "$nsa" tc qdisc show dev "${tag}a" | head -1)"
elif [ -c /dev/net/tun ] && command -v python3 >/dev/null 2>&1; then
  python3 "$here/impair.py" "$nsa" "${tag}ta" 10.215.0.1 "$nsb" "${tag}tb" 10.215.0.2 \
    --loss 0.01 --delay-ms 2 --jitter-ms 1 --reorder 0.05 >"$impair_log" 2>&1 &
  impair_pid=$!
  for _ in $(seq 100); do
    grep -q '^ready' "$impair_log" && break
    kill -0 "$impair_pid" 2>/dev/null || break
    sleep 0.1
  done
  if ! grep -q '^ready' "$impair_log"; then
    cat "$impair_log"
    echo "SKIP: no tc netem on this kernel, and the TUN link could not be made"
    exit 77
  fi
  deva="soft_${tag}ta"
  devb="soft_${tag}tb"
  link="TUN pair through tests/netns/impair.py (this kernel has no tc netem): delay 2ms 1ms loss 1% reorder 5%"
else
  echo "SKIP: neither tc netem nor /dev/net/tun is available"
  exit 77
fi
echo "soak: ${seconds} s of ferry demo (${size} bytes WRITE and READ per run) across namespaces; link: $link"
start=$(date +%s)
runs=0
while :; do
  now=$(date +%s)
  [ $((now - start)) -ge "$seconds" ] && break
  # TCP only: two namespaces of one host could otherwise reach each other's memory directly (the
  # soft provider's same-host path), around the impaired link this soak is about.
  out=$(FERRY_SOFT_SAME_HOST=0 timeout 300 ip netns exec "$nsa" "$ferry" demo --size "$size" --device "$deva" \
        --target-device "$devb" --target-via "ip netns exec $nsb" 2>&1)
  rc=$?
  if [ $rc -ne 0 ] || ! echo "$out" | grep -q "RDMA WRITE .* verified" || ! echo "$out" | grep -q "RDMA READ .* verified"; then
    echo "$out"
    echo "FAIL: run $((runs + 1)) exited $rc or did not verify"
    exit 1
  fi
  runs=$((runs + 1))
  last="$out"
  [ -n "${SOAK_VERBOSE:-}" ] && echo "$out"
done
elapsed=$(( $(date +%s) - start ))
bytes=$((runs * size * 2))
echo "${last:-}" | grep -E "RDMA (WRITE|READ)" | sed 's/^/  last run: /'
echo "soak: $runs runs in ${elapsed} s, $((bytes / 1048576)) MiB moved and verified (WRITE and READ), $((bytes / 1048576 / (elapsed > 0 ? elapsed : 1))) MiB/s on average including process start-up, 0 corrupted or lost bytes"
echo "PASS: soak across network namespaces on an impaired link"
