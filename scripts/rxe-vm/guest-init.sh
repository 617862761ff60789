#!/bin/busybox sh
# PID 1 of the rxe VM: make-image.sh installs this file as the initramfs's /init.
#
# It does only what has to happen before the host's root file system is there:
#   1. loads the kernel modules listed in /modules.load (virtio, 9p, rdma_rxe, dummy, ...), in the
#      order make-image.sh resolved them;
#   2. mounts the control folder (9p tag "ctl": run-in-vm.sh's temp folder of this run) at /ctl;
#   3. mounts the host's root file system (9p tag "hostroot", read-only) at /newroot, with fresh
#      /proc, /sys, /dev, /dev/pts, /dev/shm, /tmp and /run on top, and the control folder at
#      /run/rxe-vm;
#   4. runs /run/rxe-vm/guest-run.sh with the host's own bash inside that root. It sets up rxe0,
#      runs the command and writes its status to the control folder;
#   5. powers the guest off.
# Everything that may change from one run to the next is in guest-run.sh, which run-in-vm.sh
# copies into the control folder for each boot. Only a change to this file needs a new image.
#
# Output: the kernel and this script log to ttyS0 (run-in-vm.sh's console.log). guest-run.sh's
# stdout and stderr are the virtio console hvc0, which is the host's stdout. This script keeps hvc0
# open in raw mode for the whole run, because the tty layer resets its settings on the last close,
# and the default settings would turn every "\n" into "\r\n".
# If something fails before guest-run.sh has written a result, the reason goes to /ctl/error, and
# run-in-vm.sh exits 125.

/bin/busybox --install -s /bin
export PATH=/bin

mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev

say() { echo "rxe-vm init: $*" > /dev/ttyS0; }

# Never returns. With panic=-1 on the kernel command line, even a dying PID 1 ends the VM.
power_off() {
  sync
  poweroff -f
  sleep 60
}

fail() {
  say "$*"
  if mountpoint -q /ctl; then echo "$*" > /ctl/error; fi
  power_off
}

# A module that does not load is reported once the control folder is there to report it in.
failed_modules=""
while read -r module params; do
  [ -n "$module" ] || continue
  # shellcheck disable=SC2086 # params is a list of name=value words
  insmod "/lib/modules/$module" $params || failed_modules="$failed_modules $module"
done < /modules.load

mount -t 9p -o trans=virtio,version=9p2000.L ctl /ctl || fail "cannot mount the control folder (9p tag ctl)"
[ -z "$failed_modules" ] || fail "kernel modules failed to load:$failed_modules"
[ -c /dev/hvc0 ] || fail "no virtio console /dev/hvc0"
exec 3<> /dev/hvc0
stty raw -echo <&3

# The host's root. cache=loose: nothing changes it while the guest runs, and executables and
# libraries then load from the guest's page cache instead of over 9p each time.
mount -t 9p -o trans=virtio,version=9p2000.L,ro,cache=loose,msize=262144 hostroot /newroot \
  || fail "cannot mount the host's root file system (9p tag hostroot)"
mount -t proc proc /newroot/proc || fail "cannot mount /proc in the host's root"
mount -t sysfs sysfs /newroot/sys || fail "cannot mount /sys in the host's root"
mount -t devtmpfs devtmpfs /newroot/dev || fail "cannot mount /dev in the host's root"
mkdir -p /newroot/dev/pts /newroot/dev/shm
mount -t devpts devpts /newroot/dev/pts || fail "cannot mount /dev/pts"
mount -t tmpfs -o mode=1777 tmpfs /newroot/dev/shm || fail "cannot mount /dev/shm"
mount -t tmpfs -o mode=1777 tmpfs /newroot/tmp || fail "cannot mount /tmp"
mount -t tmpfs -o mode=0755 tmpfs /newroot/run || fail "cannot mount /run"
mkdir -p /newroot/run/rxe-vm
mount --bind /ctl /newroot/run/rxe-vm || fail "cannot bind the control folder into the host's root"
[ -f /ctl/guest-run.sh ] || fail "no guest-run.sh in the control folder"
[ -x /newroot/bin/bash ] || fail "the host's root has no /bin/bash"

chroot /newroot /bin/bash /run/rxe-vm/guest-run.sh < /dev/null >&3 2>&3 3>&-
status=$?
if [ ! -s /ctl/rc ] && [ ! -s /ctl/error ]; then
  echo "guest-run.sh exited $status without a result" > /ctl/error
fi
power_off
