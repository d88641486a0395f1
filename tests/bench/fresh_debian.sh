#!/usr/bin/env bash
# fresh_debian.sh — the README's two commands on a bare Debian 12, timed: debootstrap a minbase
# bookworm system into a folder, clone this checkout into it, and run `bash deploy/demo.sh` and
# `bash deploy/test.sh` there as a new user would (a clean environment, as root). Prints a table
# of step, exit status and seconds. Root only (debootstrap, chroot, mounts); takes about an hour
# on 2 cores, most of it the build and the ~5 GB download of the torch wheel.
#
#   bash tests/bench/fresh_debian.sh [DIR]          # DIR default /tmp/rp-fresh-debian (wiped)
#   RP_FRESH_CUDA=/usr/local/cuda bash tests/bench/fresh_debian.sh
#       also bind-mounts that CUDA toolkit read-only at /usr/local/cuda in the chroot, *not* on
#       PATH (the NVIDIA installer's default): the build must work with it as without it.
#   RP_FRESH_STEPS="demo test"  which README commands to run (default both, in that order)
#
# What it copies in, so that downloads reach the registries this machine reaches: the extra CA
# certificates under /usr/local/share/ca-certificates, /etc/pip.conf and /etc/resolv.conf, and it
# writes the /etc/hosts every installed Debian has (localhost). The
# Debian archive is the one this machine's apt sources name (deploy/install-deps.sh
# --print-archive). Nothing else of the host enters the chroot.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
DIR="${1:-/tmp/rp-fresh-debian}"
STEPS="${RP_FRESH_STEPS:-demo test}"
[ "$(id -u)" = 0 ] || { echo "fresh_debian.sh: run as root" >&2; exit 2; }
command -v debootstrap >/dev/null || { echo "fresh_debian.sh: needs debootstrap (apt-get install debootstrap)" >&2; exit 2; }
ARCHIVE="$(bash "$ROOT/deploy/install-deps.sh" --print-archive)"
LOG="$DIR.logs"
mkdir -p "$LOG"
rows=()
row() { rows+=("$(printf '%-34s %4s %7s' "$1" "$2" "$3")"); }

umount_all() { for m in usr/local/cuda dev sys proc; do umount -R "$DIR/$m" 2>/dev/null || true; done; }
trap umount_all EXIT
umount_all
if grep -q " $DIR/" /proc/mounts; then  # never rm -rf through a bind-mounted /dev or /sys
  echo "fresh_debian.sh: something is still mounted under $DIR; unmount it first" >&2; exit 2
fi
rm -rf "$DIR"

t=$(date +%s)
rc=0; debootstrap --variant=minbase --include=ca-certificates bookworm "$DIR" "$ARCHIVE" >"$LOG/debootstrap.log" 2>&1 || rc=$?
row "debootstrap --variant=minbase" "$rc" "$(( $(date +%s) - t ))"
[ "$rc" = 0 ] || { printf '%s\n' "${rows[@]}"; tail -20 "$LOG/debootstrap.log"; exit 1; }

cp /etc/resolv.conf "$DIR/etc/resolv.conf"
# Every installed Debian has an /etc/hosts naming localhost (the installer or the cloud image
# writes it); debootstrap does not. Without it "localhost" does not resolve (TensorBoard's server
# looks it up), which no real machine shows: write the installer's two lines.
[ -f "$DIR/etc/hosts" ] || printf '127.0.0.1\tlocalhost\n::1\t\tlocalhost ip6-localhost ip6-loopback\n' >"$DIR/etc/hosts"
[ -f /etc/pip.conf ] && cp /etc/pip.conf "$DIR/etc/pip.conf"
if compgen -G "/usr/local/share/ca-certificates/*.crt" >/dev/null; then
  cp /usr/local/share/ca-certificates/*.crt "$DIR/usr/local/share/ca-certificates/"
  chroot "$DIR" update-ca-certificates >/dev/null
fi
mount -t proc proc "$DIR/proc"; mount --rbind /sys "$DIR/sys"; mount --rbind /dev "$DIR/dev"
if [ -n "${RP_FRESH_CUDA:-}" ]; then
  mkdir -p "$DIR/usr/local/cuda" && mount --bind -o ro "$RP_FRESH_CUDA" "$DIR/usr/local/cuda"
fi
# The chroot has no git yet (install-deps installs it): clone on the host, from committed work.
git clone -q "$ROOT" "$DIR/root/roundpipe"
commit="$(git -C "$DIR/root/roundpipe" log --oneline -1)"

in_chroot() {
  chroot "$DIR" /usr/bin/env -i HOME=/root TERM=dumb LANG=C.UTF-8 \
    PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin /bin/bash -c "cd /root/roundpipe && $1"
}
what_is_there="$(in_chroot 'command -v nvcc || echo "nvcc: not on PATH"; ls -d /usr/local/cuda/bin 2>/dev/null || echo "no /usr/local/cuda"')"
for step in $STEPS; do
  t=$(date +%s); rc=0
  in_chroot "bash deploy/$step.sh" >"$LOG/$step.log" 2>&1 || rc=$?
  row "bash deploy/$step.sh" "$rc" "$(( $(date +%s) - t ))"
done

echo "fresh Debian 12 (minbase) in $DIR, checkout $commit"
echo "CUDA in the chroot: $(echo "$what_is_there" | tr '\n' ';')"
printf '%-34s %4s %7s\n' "step" "rc" "seconds"
printf '%s\n' "${rows[@]}"
for step in $STEPS; do echo "--- tail of $LOG/$step.log"; tail -8 "$LOG/$step.log"; done
