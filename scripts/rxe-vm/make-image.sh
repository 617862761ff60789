#!/usr/bin/env bash
# Builds the rxe VM's image: Debian's kernel and a small initramfs, for run-in-vm.sh.
#
#   scripts/rxe-vm/make-image.sh
#
# The kernel is Debian's own (the package linux-image-amd64 depends on, or RXEVM_KPKG), which
# builds the soft-RoCE driver rdma_rxe as a module. Its .deb is fetched with apt and unpacked,
# never installed. The initramfs holds a static busybox, the few modules the guest needs (virtio
# and 9p to reach the host's files, rdma_rxe and rdma_ucm, dummy) and guest-init.sh as /init. No
# user space is copied: the guest runs the host's own, shared read-only (see run-in-vm.sh).
#
# Writes into RXEVM_DIR (default /var/tmp/ferry-rxe-vm, about 80 MB):
#   vmlinuz      the kernel as packaged (bzImage)
#   vmlinux      the same kernel as an ELF file, when it can be extracted (QEMU boots it faster)
#   initrd.img   the initramfs, written last: it is newer than the rest when the image is whole
#   config       the kernel's configuration, for reference
#   image.id     which kernel, and the hash of the scripts the image was built from
# The files are built in a temp folder next to RXEVM_DIR (about 500 MB while it runs, removed at
# the end) and moved into place only when all of them are there.
#
# Installs the Debian packages it needs when they are missing (then it must run as root). Takes
# about 10 s once the packages are installed, plus the kernel's download.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
readonly here
readonly out=${RXEVM_DIR:-/var/tmp/ferry-rxe-vm}

case "${1:-}" in
  "") ;;
  -h | --help)
    sed -n '2,22p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'
    exit 0
    ;;
  *)
    echo "make-image: unknown argument '$1' (see --help)" >&2
    exit 2
    ;;
esac

log() { echo "make-image: $*" >&2; }
die() {
  log "$*"
  exit 1
}
started=$SECONDS

# ---- host packages ----
# qemu-system-x86: the emulator. busybox-static, kmod, cpio, gzip, xz-utils, zstd: building the
# initramfs (modules may ship compressed). iproute2 (ip, rdma) and ibverbs-providers (rxe's user
# space driver): the guest runs them from the host's root.
packages=(qemu-system-x86 busybox-static kmod cpio gzip xz-utils zstd iproute2 ibverbs-providers)
missing=()
for package in "${packages[@]}"; do
  if [[ "$(dpkg-query -W -f='${db:Status-Status}' "$package" 2> /dev/null)" != installed ]]; then
    missing+=("$package")
  fi
done
if ((${#missing[@]})); then
  ((EUID == 0)) || die "missing Debian packages (run as root to install them): ${missing[*]}"
  log "installing ${missing[*]}"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" > /dev/null
fi

# ---- the kernel package ----
kernel_package() {
  apt-cache depends linux-image-amd64 2> /dev/null | awk '$1 == "Depends:" && $2 ~ /^linux-image-[0-9]/ { print $2; exit }'
}
kpkg=${RXEVM_KPKG:-$(kernel_package)}
if [[ -z $kpkg ]]; then # no package lists yet
  apt-get update -qq
  kpkg=$(kernel_package)
fi
[[ -n $kpkg ]] || die "cannot tell which kernel package linux-image-amd64 depends on (set RXEVM_KPKG)"
version=$(apt-cache policy "$kpkg" 2> /dev/null | awk '$1 == "Candidate:" { print $2 }')
[[ -n $version && $version != "(none)" ]] || die "apt knows no version of $kpkg"

mkdir -p "$out" || die "cannot create $out"
work=$(mktemp -d "$(dirname "$out")/.ferry-rxe-vm-build.XXXXXX")
trap 'rm -rf "$work"' EXIT

# apt's own cache may already hold this exact version; otherwise it is downloaded.
deb=/var/cache/apt/archives/${kpkg}_${version//:/%3a}_amd64.deb
if [[ ! -f $deb ]]; then
  log "downloading $kpkg $version"
  # As root, apt drops to its _apt user to download, who cannot write the temp folder.
  (cd "$work" && apt-get download -qq -o APT::Sandbox::User=root "$kpkg=$version") \
    || die "apt-get download $kpkg=$version failed"
  deb=$(compgen -G "$work/${kpkg}_*.deb") || die "apt-get download left no .deb for $kpkg"
fi
log "kernel package: $kpkg $version"
kroot=$work/kernel
dpkg-deb -x "$deb" "$kroot"
kver=$(basename "$(compgen -G "$kroot/lib/modules/*")") || die "$deb holds no modules"
config=$kroot/boot/config-$kver
for option in RDMA_RXE NET_9P_VIRTIO 9P_FS VIRTIO_CONSOLE DUMMY; do
  grep -qE "^CONFIG_$option=[ym]" "$config" || die "kernel $kver lacks CONFIG_$option"
done
[[ -f $kroot/lib/modules/$kver/modules.dep ]] || depmod -b "$kroot" "$kver"

# ---- vmlinux ----
# The bzImage's setup header (the x86 boot protocol, 2.08 and later) says where the compressed
# kernel is: payload_offset (0x248) after the setup sectors, payload_length (0x24c) bytes long.
# The compressors the kernel's build wraps append the uncompressed size (4 bytes) to the stream,
# except gzip, whose own trailer holds it. The payload is the ELF vmlinux QEMU can boot by PVH.
# Prints COUNT bytes of FILE at OFFSET as one unsigned little-endian number.
read_le() { od -An -t "u$3" -j "$2" -N "$3" "$1" | tr -d ' '; }
extract_vmlinux() {
  local bzimage=$kroot/boot/vmlinuz-$kver setup_sects offset length trailer=4
  local -a tool
  [[ "$(dd if="$bzimage" bs=1 skip=$((0x202)) count=4 status=none)" == HdrS ]] || return 1
  (($(read_le "$bzimage" $((0x206)) 2) >= 0x208)) || return 1
  grep -q '^CONFIG_PVH=y' "$config" || return 1
  case "$(grep -oE '^CONFIG_KERNEL_(GZIP|XZ|ZSTD|LZ4|LZMA|LZO|BZIP2)=y' "$config")" in
    *GZIP*) tool=(gzip -dc) trailer=0 ;;
    *XZ*) tool=(xz -dc) ;;
    *ZSTD*) tool=(zstd -qdc) ;;
    *) return 1 ;;
  esac
  setup_sects=$(read_le "$bzimage" $((0x1f1)) 1)
  ((setup_sects)) || setup_sects=4 # 0 means 4 in the boot protocol
  offset=$(((setup_sects + 1) * 512 + $(read_le "$bzimage" $((0x248)) 4)))
  length=$(($(read_le "$bzimage" $((0x24c)) 4) - trailer))
  dd if="$bzimage" bs=64K iflag=skip_bytes,count_bytes skip="$offset" count="$length" status=none \
    | "${tool[@]}" > "$work/vmlinux" || return 1
  [[ "$(od -An -c -N 4 "$work/vmlinux" | tr -d ' ')" == '177ELF' ]]
}
if ! extract_vmlinux; then
  log "note: no ELF vmlinux extracted from the bzImage; the guest boots the slower vmlinuz"
  rm -f "$work/vmlinux"
fi

# ---- initramfs ----
initramfs=$work/initramfs
mkdir -p "$initramfs"/{bin,dev,proc,sys,ctl,newroot,lib/modules}
busybox=$(command -v busybox) || die "no busybox (busybox-static)"
if ldd "$busybox" > /dev/null 2>&1; then die "$busybox is linked dynamically: the initramfs needs busybox-static"; fi
cp "$busybox" "$initramfs/bin/busybox"
install -m 0755 "$here/guest-init.sh" "$initramfs/init"

# The modules and everything they depend on, in the order kmod loads them. Required ones must be
# there; crc32 drivers give rxe's ICRC a fast path where the kernel has them as modules.
#   virtio_pci virtio_console    the PCI transport and hvc0
#   9pnet_virtio 9p              the host's root and the shared folders
#   ib_uverbs rdma_rxe           verbs from user space on soft-RoCE
#   rdma_ucm                     rdma_cm from user space (librdmacm)
#   dummy                        the netdev rxe0 sits on (numdummies=0: no stray dummy0)
required=(virtio_pci virtio_console 9pnet_virtio 9p ib_uverbs rdma_rxe rdma_ucm dummy)
optional=(crc32_generic crc32_pclmul)
declare -A loaded=()
: > "$initramfs/modules.load"
add_module() {
  local deps kind path file params
  # -C: the kernel's own dependencies only, not the host's modprobe.d options.
  deps=$(modprobe -C "$work/no-modprobe.d" -d "$kroot" -S "$kver" --show-depends "$1" 2> /dev/null) || return 1
  while read -r kind path _; do
    [[ $kind == insmod ]] || continue # "builtin NAME": part of the kernel
    file=$(basename "$path")
    file=${file%.xz} file=${file%.zst} file=${file%.gz}
    [[ -z ${loaded[$file]:-} ]] || continue
    loaded[$file]=1
    case $path in # busybox's insmod takes plain .ko files
      *.xz) xz -dc "$path" > "$initramfs/lib/modules/$file" ;;
      *.zst) zstd -qdc "$path" > "$initramfs/lib/modules/$file" ;;
      *.gz) gzip -dc "$path" > "$initramfs/lib/modules/$file" ;;
      *) cp "$path" "$initramfs/lib/modules/$file" ;;
    esac
    params=""
    if [[ $file == dummy.ko ]]; then params=numdummies=0; fi
    echo "$file${params:+ $params}" >> "$initramfs/modules.load"
  done <<< "$deps"
}
mkdir -p "$work/no-modprobe.d"
for module in "${required[@]}"; do
  add_module "$module" || die "kernel $kver has no module $module"
done
for module in "${optional[@]}"; do
  add_module "$module" || log "note: kernel $kver has no module $module (skipped)"
done

(cd "$initramfs" && find . | LC_ALL=C sort | cpio -o -H newc -R 0:0 --quiet) | gzip -9n > "$work/initrd.img"
cp "$kroot/boot/vmlinuz-$kver" "$work/vmlinuz"
cp "$config" "$work/config"
{
  echo "$kpkg $version $kver"
  cat "$here/make-image.sh" "$here/guest-init.sh" | sha256sum
} > "$work/image.id"

# ---- install ----
rm -f "$out/vmlinux"
for file in config image.id vmlinuz vmlinux initrd.img; do
  if [[ -f $work/$file ]]; then mv -f "$work/$file" "$out/$file"; fi
done
log "$out: $kver, $(wc -l < "$initramfs/modules.load") modules, $(du -sh "$out" | cut -f1) in $((SECONDS - started)) s"
