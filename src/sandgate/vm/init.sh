#!/bin/sh
# sandgate's VM guest init (busybox sh, PID 1). Console: ttyS0 (boot log, kept by the runner);
# the command's output: ttyS1; its exit status: /sg/vm/exit. Any failure says why on the console
# and powers off (the runner then reports the guest did not run the command, with the log).
export PATH=/bin
/bin/busybox --install -s /bin
mount -t proc proc /proc
mount -t sysfs sys /sys
mount -t devtmpfs dev /dev
say() { echo "sandgate-init: $*" > /dev/ttyS0; }
fail() { say "FAILED: $*"; sync; poweroff -f; sleep 5; }
arg() { for w in $(cat /proc/cmdline); do case "$w" in "sg.$1="*) echo "${w#sg."$1"=}";; esac; done; }

# Dependencies first (the order comes from modules.dep at build time).
for m in $(cat /lib/modules/order); do insmod "/lib/modules/$m" || fail "insmod $m"; done
O=trans=virtio,version=9p2000.L,msize=262144
mount -t 9p -o "$O,ro,cache=loose" host /host || fail "mount the host's system (9p tag host)"
mount -t 9p -o "$O,cache=none" sg /sg || fail "mount the session folder (9p tag sg)"
mkdir -p /work
mount -t 9p -o "$O,cache=none" work /work || fail "mount the work dir (9p tag work)"
[ -f /sg/vm/job.sh ] || fail "no job in the session folder"

# IPv6 off, as on a namespace guest's link (the gateway's ingress chain drops it regardless).
for c in all default eth0; do
    [ -f "/proc/sys/net/ipv6/conf/$c/disable_ipv6" ] && echo 1 > "/proc/sys/net/ipv6/conf/$c/disable_ipv6"
done
ip link set lo up
addr=$(arg ip)
if [ -n "$addr" ]; then
    # The NIC's MAC was set by QEMU (the gateway's ingress chain pins it); only its address here.
    # The address before the link is up: no packet of this guest leaves from 0.0.0.0.
    gw=$(arg gw)
    ip addr add "$addr" dev eth0 && ip link set eth0 up \
        && { [ -z "$gw" ] || ip route add default via "$gw"; } || fail "network ($addr via $gw)"
fi
say "up at $(cut -d' ' -f1 /proc/uptime) s"

# The root the command sees: the host's system read-only, the session's areas writable.
R=/newroot
mount -t tmpfs -o mode=0755,size=64m root $R
for d in bin sbin lib lib32 lib64 libx32; do
    if [ -L "/host/$d" ]; then ln -s "$(readlink "/host/$d")" "$R/$d"
    elif [ -d "/host/$d" ]; then mkdir "$R/$d" && mount --bind "/host/$d" "$R/$d"; fi
done
for d in usr etc opt var; do
    [ -d "/host/$d" ] && mkdir "$R/$d" && mount --bind "/host/$d" "$R/$d"
done
mkdir -p $R/proc $R/sys $R/dev $R/work $R/home/agent $R/tmp $R/run $R/root
mount -t proc proc $R/proc
mount -t sysfs sys $R/sys
mount -t devtmpfs dev $R/dev
mkdir -p $R/dev/pts $R/dev/shm
mount -t devpts devpts $R/dev/pts
area() { [ -d "/sg/$1" ] && mount --bind "/sg/$1" "$R$2" || fail "session area $1 on $2"; }
mount --bind /work $R/work || fail "bind /work"
area home /home/agent
area tmp /tmp
area run /run
area vartmp /var/tmp
area shm /dev/shm
# bind SRC DST: a session file over a system one (resolver, CA bundle, users).
bind() {
    # A mount point in a writable area (/run, /tmp) is made; in the read-only system it must exist.
    [ -e "$R$2" ] || { mkdir -p "$R$(dirname "$2")" && touch "$R$2"; } 2>/dev/null
    if [ -e "$R$2" ]; then mount --bind "$1" "$R$2" || fail "bind $2"
    else say "skipped $2 (no such file in the guest's system)"; fi
}
. /sg/vm/job.sh
sg_binds

stty -F /dev/ttyS1 raw -echo 2>/dev/null
sg_run < /dev/null > /dev/ttyS1 2>&1
echo "$?" > /sg/vm/exit
say "done at $(cut -d' ' -f1 /proc/uptime) s"
sync
poweroff -f
