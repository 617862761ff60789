#!/usr/bin/env bash
# Runs one command in a QEMU guest that has the kernel's soft-RoCE device rxe0, and exits with the
# command's status.
#
#   scripts/rxe-vm/run-in-vm.sh CMD [ARG...]
#
# CMD runs with exactly these arguments (no shell: pass `bash -c '...'` for a command line), as
# root, in the current folder, with stdout and stderr, merged, on this script's stdout. The guest
# sees the host's root file system read-only, so host-built binaries and the host's libibverbs and
# rxe provider run unchanged; RXEVM_SHARE is shared read-write at the same path; /tmp, /run and
# /dev/shm are empty tmpfs; HOME=/tmp/home. The guest has no network card. rxe0 sits on the dummy
# netdev rxenet0 (169.254.77.1/16); CMD's environment has RXE_DEV=rxe0, RXE_NETDEV=rxenet0 and
# RXE_IPV4=169.254.77.1 (guest-run.sh describes the device).
#
# Exit status: CMD's; 124 when RXEVM_TIMEOUT ran out; 125 when the VM could not be started or set
# up (no qemu, no image, a setup step failed: the guest's logs are printed); 2 for a usage error.
#
# Environment:
#   RXEVM_DIR      the image from make-image.sh (default /var/tmp/ferry-rxe-vm)
#   RXEVM_SHARE    the folder the guest may write (default: the current folder)
#   RXEVM_TIMEOUT  seconds until the guest is stopped (default 900)
#   RXEVM_VERBOSE  1: print the guest's console, setup log and kernel log after the run
#   RXEVM_SMP      guest CPUs (default 2)
#   RXEVM_MEM      guest memory (default 2G)
#   RXEVM_ACCEL    auto (default: kvm where it is usable, else tcg), kvm or tcg
#   RXEVM_PASSENV  names of host variables to pass into CMD's environment, e.g. "FERRY_LOG"
#   RXEVM_KEEP     1: keep the run's control folder (logs) and print its path
#
# The whole script is functions until the last line, so bash has read all of it before a boot
# starts: a checkout that changes this file during a long run does not change the run.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
readonly here
readonly image=${RXEVM_DIR:-/var/tmp/ferry-rxe-vm}
readonly timeout_s=${RXEVM_TIMEOUT:-900}
readonly smp=${RXEVM_SMP:-2}
readonly mem=${RXEVM_MEM:-2G}
readonly verbose=${RXEVM_VERBOSE:-0}
ctl="" # the run's control folder, once made

log() { echo "run-in-vm: $*" >&2; }

usage_error() {
  log "$*"
  log "usage: $0 CMD [ARG...] (see the header of this script)"
  exit 2
}

# The VM cannot run here: callers tell this apart from a failing command.
unavailable() {
  log "$*"
  exit 125
}

# shellcheck disable=SC2317 # run by the EXIT trap
remove_control_folder() {
  [[ -n $ctl ]] || return 0
  if [[ ${RXEVM_KEEP:-0} == 1 ]]; then log "kept $ctl"; else rm -rf "$ctl"; fi
}

# Prints the folder the command starts in: the caller's, unless it lies below a folder that is a
# fresh tmpfs in the guest and outside the share (then it does not exist there: the share).
start_folder() {
  local share=$1 cwd
  cwd=$(realpath -e "$PWD")
  case "$cwd/" in
    "$share"/*) ;;
    /tmp/* | /run/* | /dev/shm/*)
      log "$cwd is not visible in the guest; the command starts in $share"
      cwd=$share
      ;;
  esac
  echo "$cwd"
}

# Prints the accelerator to use. A writable /dev/kvm is not enough: where the CPU shows no vmx/svm
# flag, /dev/kvm may be a paravirtual backend under which a stock kernel does not boot.
choose_accel() {
  local accel=${RXEVM_ACCEL:-auto}
  if [[ $accel == auto ]]; then
    accel=tcg
    if [[ -w /dev/kvm ]] && grep -qwE 'vmx|svm' /proc/cpuinfo; then accel=kvm; fi
  fi
  [[ $accel == kvm || $accel == tcg ]] || usage_error "RXEVM_ACCEL must be auto, kvm or tcg, not '$accel'"
  echo "$accel"
}

# Fills the control folder: what the guest reads (guest-run.sh, job, argv, passenv). The guest
# writes rc, error and its logs next to them.
write_control_folder() {
  local share=$1 cwd=$2 name
  shift 2
  cp "$here/guest-run.sh" "$ctl/guest-run.sh"
  printf 'share=%q\ncwd=%q\n' "$share" "$cwd" > "$ctl/job"
  printf '%s\0' "$@" > "$ctl/argv"
  : > "$ctl/passenv"
  for name in ${RXEVM_PASSENV:-}; do
    [[ $name =~ ^[A-Za-z_][A-Za-z0-9_]*$ ]] || usage_error "RXEVM_PASSENV: '$name' is not a variable name"
    if [[ -n ${!name+set} ]]; then printf 'export %s=%q\n' "$name" "${!name}" >> "$ctl/passenv"; fi
  done
}

# Boots the guest and waits for it to power off; returns QEMU's (or timeout's) status.
# -nodefaults and -nic none: no network card, so nothing in the guest reaches beyond it.
# ttyS0 (the kernel's console) goes to console.log; hvc0, a virtio console, carries the command's
# output to stdout. --foreground keeps QEMU in this process group, so Ctrl-C reaches it.
boot() {
  local share=$1 accel=$2 kernel=$image/vmlinuz
  local -a accel_args
  # The ELF vmlinux boots through QEMU's PVH entry, which skips the bzImage's own decompression:
  # several seconds less under emulation.
  if [[ -f $image/vmlinux ]]; then kernel=$image/vmlinux; fi
  # One host thread per guest CPU under TCG; "max" gives the guest the instruction set
  # extensions that the host's libraries and host-built binaries may use.
  # shellcheck disable=SC2054 # the commas belong to QEMU's option syntax
  case $accel in
    kvm) accel_args=(-accel kvm -cpu host) ;;
    tcg) accel_args=(-accel tcg,thread=multi,tb-size=512 -cpu max) ;;
  esac
  # shellcheck disable=SC2054 # the commas belong to QEMU's option syntax
  local -a qemu_args=(
    -nodefaults -no-user-config -display none -no-reboot -nic none
    "${accel_args[@]}" -smp "$smp" -m "$mem"
    -kernel "$kernel" -initrd "$image/initrd.img"
    -append "console=ttyS0 loglevel=4 panic=-1 mitigations=off"
    -serial "file:$ctl/console.log"
    -device virtio-serial-pci
    -chardev stdio,id=out,signal=off -device virtconsole,chardev=out
    -virtfs "local,path=/,mount_tag=hostroot,security_model=none,readonly=on,multidevs=remap"
    -virtfs "local,path=$ctl,mount_tag=ctl,security_model=none"
    -virtfs "local,path=$share,mount_tag=work,security_model=none,multidevs=remap"
  )
  timeout --foreground -k 10 "$timeout_s" qemu-system-x86_64 "${qemu_args[@]}" < /dev/null
}

# Prints the guest's logs to stderr: the console and setup log, and with RXEVM_VERBOSE=1 the
# kernel log.
print_guest_logs() {
  echo "---- guest console (ttyS0), last 60 lines ----"
  tr -d '\r' < "$ctl/console.log" 2> /dev/null | grep -v '^$' | tail -n 60 || true
  if [[ -s $ctl/setup.log ]]; then
    echo "---- guest setup log ----"
    cat "$ctl/setup.log"
  fi
  if [[ $verbose == 1 && -s $ctl/dmesg.log ]]; then
    echo "---- guest kernel log ----"
    cat "$ctl/dmesg.log"
  fi
}

main() {
  (($#)) || usage_error "no command given"
  [[ $timeout_s =~ ^[1-9][0-9]*$ ]] || usage_error "RXEVM_TIMEOUT must be a number of seconds, not '$timeout_s'"
  [[ $smp =~ ^[1-9][0-9]*$ ]] || usage_error "RXEVM_SMP must be a number of CPUs, not '$smp'"
  local share cwd accel started elapsed_ms qemu_rc=0 status
  share=$(realpath -e "${RXEVM_SHARE:-$PWD}" 2> /dev/null) \
    || usage_error "RXEVM_SHARE '${RXEVM_SHARE:-}' does not exist"
  [[ $share != / ]] || usage_error "RXEVM_SHARE=/ would let the guest write the host's whole root"
  cwd=$(start_folder "$share")
  accel=$(choose_accel)

  command -v qemu-system-x86_64 > /dev/null \
    || unavailable "qemu-system-x86_64 is not installed (make-image.sh installs it)"
  [[ -f $image/initrd.img && -f $image/vmlinuz ]] \
    || unavailable "no VM image in $image: run $here/make-image.sh (RXEVM_DIR=$image)"
  if [[ "$(tail -n 1 "$image/image.id" 2> /dev/null)" \
    != "$(cat "$here/make-image.sh" "$here/guest-init.sh" | sha256sum)" ]]; then
    log "note: the image in $image was built by another version of make-image.sh; rebuild it if the run fails"
  fi

  ctl=$(mktemp -d "${TMPDIR:-/tmp}/ferry-rxe-vm.XXXXXX")
  trap remove_control_folder EXIT
  write_control_folder "$share" "$cwd" "$@"

  started=$(date +%s%N)
  boot "$share" "$accel" || qemu_rc=$?
  elapsed_ms=$((($(date +%s%N) - started) / 1000000))

  if [[ -s $ctl/rc ]]; then
    status=$(< "$ctl/rc")
  elif ((qemu_rc == 124 || qemu_rc == 137)); then
    log "the guest did not finish within ${timeout_s} s (RXEVM_TIMEOUT)"
    status=124
  elif [[ -s $ctl/error ]]; then
    log "the guest's setup failed: $(< "$ctl/error")"
    status=125
  else
    log "the VM stopped without a result (qemu exited $qemu_rc)"
    status=125
  fi
  if [[ $verbose == 1 ]] || ((status >= 124)); then print_guest_logs >&2; fi
  log "$(printf 'exit %s after %d.%d s (%s, %s CPUs)' "$status" $((elapsed_ms / 1000)) \
    $((elapsed_ms % 1000 / 100)) "$accel" "$smp")"
  return "$status"
}

main "$@"
