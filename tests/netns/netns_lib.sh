# Sourced by the namespace tests: two network namespaces joined by a veth pair.
#
# netns_pair TAG NET: creates namespaces ferry_TAG_a and ferry_TAG_b (in $nsa, $nsb) joined by the
# veth ends TAGa (NET.1/30) and TAGb (NET.2/30), removed again when the script exits. Exits 77
# (skipped) where namespaces cannot be made (not root, no iproute2).
netns_pair() {
  local tag="$1" net="$2"
  if [ "$(id -u)" != 0 ] || ! command -v ip >/dev/null 2>&1; then
    echo "SKIP: needs root and iproute2 to create network namespaces"
    exit 77
  fi
  nsa="ferry_${tag}_a"
  nsb="ferry_${tag}_b"
  trap 'ip netns del "$nsa" 2>/dev/null; ip netns del "$nsb" 2>/dev/null' EXIT
  if ! ip netns add "$nsa" 2>/dev/null || ! ip netns add "$nsb" 2>/dev/null; then
    echo "SKIP: cannot create network namespaces here"
    exit 77
  fi
  ip link add "${tag}a" netns "$nsa" type veth peer name "${tag}b" netns "$nsb" || exit 1
  ip -n "$nsa" addr add "${net}.1/30" dev "${tag}a"
  ip -n "$nsb" addr add "${net}.2/30" dev "${tag}b"
  ip -n "$nsa" link set lo up
  ip -n "$nsb" link set lo up
  ip -n "$nsa" link set "${tag}a" up
  ip -n "$nsb" link set "${tag}b" up
}
