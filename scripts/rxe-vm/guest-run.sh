#!/usr/bin/env bash
# The rxe VM's second stage: sets up rxe0, runs the command, records its exit status.
#
# The initramfs's /init (guest-init.sh) runs this script with the host's bash, chrooted into the
# host's root file system, with stdout and stderr on the host's stdout. run-in-vm.sh copies it into
# the run's control folder, mounted here at /run/rxe-vm, which also holds:
#   job      variables from run-in-vm.sh: share (the folder to mount read-write), cwd
#   argv     the command and its arguments, each ended by a NUL byte
#   passenv  `export NAME=value` lines for the variables named in RXEVM_PASSENV
# and receives:
#   rc          the command's exit status (written only once it has run)
#   error       why the setup failed (run-in-vm.sh then exits 125)
#   setup.log   the setup steps' output
#   dmesg.log   the guest kernel's log, at the end
#
# The device: rxe0 is the kernel's soft-RoCE on rxenet0, a dummy netdev, so no packet can leave
# the guest; rxe's own traffic to its addresses loops back in the IP stack. rxenet0 has the
# link-local IPv4 address 169.254.77.1/16 and an IPv6 link-local address, which are rxe0's RoCE v2
# GIDs (::ffff:169.254.77.1 at index 1, the fe80:: address at index 0). rdma_cm binds to either.
# The command's environment has RXE_DEV, RXE_NETDEV and RXE_IPV4 naming them.
set -Eeuo pipefail

readonly ctl=/run/rxe-vm
readonly rxe_dev=rxe0 netdev=rxenet0 ipv4=169.254.77.1 ipv4_prefix=16
readonly setup_seconds=30

fail() {
  echo "$*" > "$ctl/error"
  exit 1
}
trap 'fail "setup step failed (line $LINENO): $BASH_COMMAND"' ERR

# The setup's own output goes to setup.log; fds 3 and 4 keep the host's stdout for the command.
exec 3>&1 4>&2 >> "$ctl/setup.log" 2>&1

# shellcheck source=/dev/null # sets share and cwd
. "$ctl/job"
: "${share:?the job file sets no share}" "${cwd:?the job file sets no cwd}"
mapfile -d '' -t argv < "$ctl/argv"
((${#argv[@]})) || fail "no command in $ctl/argv"

# Runs "$@" until it succeeds, for at most setup_seconds; fails naming what it waited for.
wait_for() {
  local what=$1 deadline=$((SECONDS + setup_seconds))
  shift
  until "$@"; do
    ((SECONDS < deadline)) || fail "rxe0 not ready after ${setup_seconds} s: no $what"
    sleep 0.1
  done
}

# The writable share, at the host's path. Below /tmp, /run or /dev/shm (fresh tmpfs here) the
# mount point has to be made; elsewhere it is the host's folder, visible read-only.
mkdir -p "$share"
mount -t 9p -o trans=virtio,version=9p2000.L,msize=262144 work "$share"

# The netdev and the device. DAD off, so the link-local address (GID 0) is usable at once.
ip link set lo up
ip link add "$netdev" type dummy
echo 0 > "/proc/sys/net/ipv6/conf/$netdev/accept_dad"
ip link set "$netdev" up
ip addr add "$ipv4/$ipv4_prefix" dev "$netdev"
rdma link add "$rxe_dev" type rxe netdev "$netdev"

# rxe fills its GID table from a work queue; the command must find both GIDs there.
port=/sys/class/infiniband/$rxe_dev/ports/1
mapped_gid=$(printf '0000:0000:0000:0000:0000:ffff:%02x%02x:%02x%02x' ${ipv4//./ })
has_gid() { grep -qx "$1" "$port"/gids/* 2> /dev/null; }
has_link_local_gid() { grep -q '^fe80:' "$port"/gids/* 2> /dev/null; }
wait_for "ACTIVE port 1" grep -q ACTIVE "$port/state"
wait_for "GID $mapped_gid" has_gid "$mapped_gid"
wait_for "IPv6 link-local GID" has_link_local_gid
{
  echo "$rxe_dev ready:"
  rdma link show
  grep -H . "$port"/gids/[0-3]
} || true

# The command: as root, in the caller's folder, with a fresh environment. Pinned memory has no
# limit (RDMA registrations pin it), and many sockets may be open at once.
trap - ERR
mkdir -p /tmp/home
cd "$cwd" || fail "cannot enter $cwd in the guest"
rc=0
# shellcheck disable=SC2016 # the inner shell expands "$0" (the passenv file) and "$@" (the command)
env -i HOME=/tmp/home TERM=dumb LANG=C.UTF-8 \
  PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
  RXE_DEV="$rxe_dev" RXE_NETDEV="$netdev" RXE_IPV4="$ipv4" \
  /bin/bash -c 'ulimit -l unlimited && ulimit -n 65536 && . "$0" && exec "$@"' "$ctl/passenv" "${argv[@]}" \
  < /dev/null >&3 2>&4 || rc=$?
echo "$rc" > "$ctl/rc"

dmesg > "$ctl/dmesg.log" 2>&1 || true
cd /
sync
umount "$share" || true
