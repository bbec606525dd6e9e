#!/usr/bin/env bash
# Prepares the QEMU soft-RoCE guest used by run.sh: installs the Debian
# packages, unpacks Debian's kernel into a cache folder and builds the
# initramfs (busybox + the modules for 9p, virtio and rdma_rxe).
#
#   tests/qemu/setup.sh [--quiet]
#
# Cache: $FUSEWIRE_QEMU_CACHE (default <repo>/build/qemu). Nothing is written
# to the host's /boot. Idempotent: a second run downloads nothing and only
# rebuilds the initramfs when guest-init.sh or this script changed.
# Exit 0 when ready; 77 with a one-line reason when the guest cannot be
# prepared here (not root and packages missing, no network, ...).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
cache=${FUSEWIRE_QEMU_CACHE:-$repo/build/qemu}
quiet=0
[ "${1:-}" = "--quiet" ] && quiet=1
say() { [ $quiet = 1 ] || echo "qemu-setup: $*" >&2; }
skip() { echo "qemu-setup: $*" >&2; exit 77; }

# Not rdma-core: it pulls udev and upgrades the systemd packages.
packages=(qemu-system-x86 busybox-static ibverbs-providers ibverbs-utils
          libibverbs-dev librdmacm-dev rdmacm-utils perftest iproute2)
# Modules the guest loads (their dependencies are added from modules.dep).
modules=(virtio_pci 9pnet_virtio 9p dummy crc32_generic crc32_pclmul
         rdma_rxe ib_uverbs rdma_ucm)

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'ok installed' || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  [ "$(id -u)" = 0 ] || skip "packages missing (${missing[*]}) and not root to install them"
  say "installing ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  if ! apt-get install -y --no-install-recommends "${missing[@]}" >"${TMPDIR:-/tmp}/fw-qemu-apt.log" 2>&1; then
    apt-get update >/dev/null 2>&1 || true
    apt-get install -y --no-install-recommends "${missing[@]}" >"${TMPDIR:-/tmp}/fw-qemu-apt.log" 2>&1 \
      || skip "apt-get install ${missing[*]} failed (see ${TMPDIR:-/tmp}/fw-qemu-apt.log)"
  fi
fi

mkdir -p "$cache"
# Kernel: the image package linux-image-amd64 currently points at.
# Kept: the .deb; its unpacked tree, several times larger, only while building.
unpack() {
  rm -rf "$cache/kernel"
  dpkg-deb -x "$(cat "$cache/kernel.deb")" "$cache/kernel" || skip "dpkg-deb -x $(cat "$cache/kernel.deb") failed"
}
if [ ! -s "$cache/kernel.version" ] || [ ! -s "$cache/vmlinuz" ] \
   || [ ! -s "$(cat "$cache/kernel.deb" 2>/dev/null)" ]; then
  pkg=$(apt-cache depends linux-image-amd64 2>/dev/null | sed -n 's/^ *Depends: \(linux-image-[^ ]*\)$/\1/p' | head -1)
  [ -n "$pkg" ] || { apt-get update >/dev/null 2>&1 || true
    pkg=$(apt-cache depends linux-image-amd64 2>/dev/null | sed -n 's/^ *Depends: \(linux-image-[^ ]*\)$/\1/p' | head -1); }
  [ -n "$pkg" ] || skip "cannot find the package behind linux-image-amd64 (apt-cache depends)"
  say "downloading $pkg"
  rm -rf "$cache/dl" "$cache/kernel" "$cache"/linux-image-*.deb
  mkdir -p "$cache/dl"
  chmod 777 "$cache/dl"   # apt-get download drops to user _apt
  (cd "$cache/dl" && apt-get download "$pkg" >/dev/null 2>&1) || skip "apt-get download $pkg failed"
  mv "$cache"/dl/"$pkg"_*.deb "$cache/"
  rm -rf "$cache/dl"
  ls "$cache"/"$pkg"_*.deb >"$cache/kernel.deb"
  unpack
  kver=$(ls "$cache/kernel/lib/modules" | head -1)
  [ -n "$kver" ] && [ -f "$cache/kernel/boot/vmlinuz-$kver" ] || skip "$pkg has no vmlinuz/modules"
  cp "$cache/kernel/boot/vmlinuz-$kver" "$cache/vmlinuz"
  echo "$kver" >"$cache/kernel.version"
  rm -f "$cache/initramfs.stamp"
fi
kver=$(cat "$cache/kernel.version")
mdir=$cache/kernel/lib/modules/$kver

# Initramfs, rebuilt when its inputs change.
stamp=$( (cat "$here/guest-init.sh" "$0" /bin/busybox | sha256sum; echo "$kver") | sha256sum | cut -c1-16)
if [ -s "$cache/initramfs.cpio.gz" ] && [ "$(cat "$cache/initramfs.stamp" 2>/dev/null)" = "$stamp" ]; then
  touch "$cache/initramfs.stamp"
  say "ready (cached): kernel $kver"
  exit 0
fi
say "building initramfs for $kver"
[ -f "$mdir/modules.order" ] || unpack
busybox depmod -b "$cache/kernel" "$kver"
ird=$cache/initramfs
rm -rf "$ird"
mkdir -p "$ird"/{bin,sbin,dev,proc,sys,ctl,newroot,lib/modules/"$kver"}
cp /bin/busybox "$ird/bin/busybox"
for a in $(/bin/busybox --list); do
  [ "$a" = busybox ] || ln -s busybox "$ird/bin/$a"
done
ln -s ../bin/busybox "$ird/sbin/modprobe"

# Module closure over modules.dep (paths relative to the modules folder).
declare -A want=()
add() {
  local rel=$1 d
  [ -n "${want[$rel]:-}" ] && return
  want[$rel]=1
  for d in $(grep -E "^$rel:" "$mdir/modules.dep" | cut -d: -f2); do add "$d"; done
}
for m in "${modules[@]}"; do
  rel=$(grep -E "/${m//_/[-_]}\.ko:" "$mdir/modules.dep" | cut -d: -f1 | head -1)
  [ -n "$rel" ] || skip "module $m not in kernel $kver"
  add "$rel"
done
for rel in "${!want[@]}"; do
  mkdir -p "$ird/lib/modules/$kver/$(dirname "$rel")"
  cp "$mdir/$rel" "$ird/lib/modules/$kver/$rel"
done
cp "$mdir"/modules.builtin "$mdir"/modules.order "$ird/lib/modules/$kver/" 2>/dev/null || true
busybox depmod -b "$ird" "$kver"
printf '%s\n' "${modules[@]}" >"$ird/modules.list"
cp "$here/guest-init.sh" "$ird/init"
chmod 755 "$ird/init"
(cd "$ird" && find . | busybox cpio -o -H newc 2>/dev/null | gzip -1 >"$cache/initramfs.cpio.gz.new")
mv "$cache/initramfs.cpio.gz.new" "$cache/initramfs.cpio.gz"
echo "$stamp" >"$cache/initramfs.stamp"
rm -rf "$cache/kernel" "$ird"
say "ready: kernel $kver, ${#want[@]} modules, initramfs $(du -h "$cache/initramfs.cpio.gz" | cut -f1)"
