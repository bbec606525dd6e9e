#!/bin/busybox sh
# shellcheck shell=dash
# /init of the soft-RoCE guest (copied into the initramfs by setup.sh).
# Loads the modules, mounts the host root read-only over 9p with the shared
# folders read-write on top, creates rxe0 on a dummy netdev, chroots into
# the host root and runs /ctl/job there; its exit code goes to /ctl/rc.
export PATH=/bin:/sbin

mount -t proc proc /proc
mount -t sysfs sys /sys
mount -t devtmpfs dev /dev
out=/dev/ttyS1

fail() {
  echo "fw-qemu guest: $*" >&2
  echo "$*" >/ctl/error 2>/dev/null
  echo 125 >/ctl/rc 2>/dev/null
  sync
  poweroff -f
}

for m in $(cat /modules.list); do
  modprobe "$m" || echo "fw-qemu guest: modprobe $m failed" >&2
done

p9="trans=virtio,version=9p2000.L,msize=512000"
mount -t 9p -o "$p9,cache=none" fwctl /ctl || fail "cannot mount the control folder"
. /ctl/conf
mount -t 9p -o "ro,$p9,cache=loose" hostroot /newroot || fail "cannot mount the host root"
r=/newroot
mount -t tmpfs -o mode=1777 tmp $r/tmp
mount -t proc proc $r/proc
mount -t sysfs sys $r/sys
mount -t devtmpfs dev $r/dev
mkdir -p $r/dev/pts $r/dev/shm
mount -t devpts -o newinstance,ptmxmode=0666 devpts $r/dev/pts
mount -t tmpfs -o mode=1777 shm $r/dev/shm
mount -t tmpfs -o mode=755 run $r/run
mkdir -p $r/run/fw-qemu
mount --bind /ctl $r/run/fw-qemu
echo "$FW_SHARES" | while read -r tag path; do
  [ -n "$tag" ] || continue
  # A share below a fresh tmpfs (/tmp, /run) needs its mount point made first.
  mkdir -p "$r$path" 2>/dev/null
  mount -t 9p -o "$p9,cache=mmap" "$tag" "$r$path" || fail "cannot mount share $path"
done
[ -f /ctl/error ] && { sync; poweroff -f; }

# Soft-RoCE on a dummy netdev: rdmacm cannot resolve routes over lo.
ch() { chroot $r "$@"; }
ch ip link set lo up
ch ip link add rxenet0 type dummy &&
  ch ip addr add 192.0.2.1/24 dev rxenet0 &&
  ch ip link set rxenet0 up &&
  ch rdma link add rxe0 type rxe netdev rxenet0 ||
  echo "fw-qemu guest: rxe0 setup failed" >&2

stty -F $out raw -echo 2>/dev/null
ulimit -l unlimited 2>/dev/null
ulimit -n 65536 2>/dev/null
# Through a pipe, as on a CI runner: no tty, so no progress bars or colours.
{ chroot $r /bin/bash /run/fw-qemu/job </dev/null 2>&1; echo $? >/ctl/rc; } | cat >$out
sync
poweroff -f
