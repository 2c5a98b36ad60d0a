#!/usr/bin/env bash
# Times ./scripts/quickstart.sh on a fresh machine, as near as one machine can be made fresh: a
# new Debian 12 root file system (mmdebstrap, variant minbase, plus git and ca-certificates),
# this checkout cloned into it (committed files only), and the quick start run there in a chroot
# with nothing installed but that, so every package it needs is downloaded and installed, and
# everything it builds is compiled, within the time. Needs root and mmdebstrap; the packages
# come from the same Debian mirror as this machine's. The mounts are undone and the root removed
# however the script ends.
#
# usage: sudo bench/quickstart_fresh.sh [DIR]   (DIR: where the root goes, default a new temp dir)
set -euo pipefail
root_dir="$(cd "$(dirname "$0")/.." && pwd)"
[ "$(id -u)" = 0 ] || { echo "quickstart_fresh: needs root (mmdebstrap, chroot)" >&2; exit 1; }
command -v mmdebstrap >/dev/null || { echo "quickstart_fresh: needs mmdebstrap" >&2; exit 1; }
fresh="${1:-$(mktemp -d /tmp/vf-fresh-XXXXXX)}"
cleanup() {
  for m in dev sys proc; do umount -R "$fresh/$m" 2>/dev/null || umount -lR "$fresh/$m" 2>/dev/null || true; done
  # Never remove through a mount that is still there (the host's /dev is bound into the root).
  if grep -q " $fresh/" /proc/mounts; then
    echo "quickstart_fresh: $fresh still has mounts; left in place" >&2
    return
  fi
  rm -rf --one-file-system "$fresh"
}
trap cleanup EXIT
mirror="http://deb.debian.org/debian"
echo "quickstart_fresh: a Debian 12 root in $fresh"
mmdebstrap --quiet --variant=minbase --include=ca-certificates,git bookworm "$fresh" \
  "deb $mirror bookworm main" "deb $mirror bookworm-updates main" \
  "deb http://deb.debian.org/debian-security bookworm-security main"
git clone --quiet "$root_dir" "$fresh/root/vf"
cp /etc/resolv.conf "$fresh/etc/resolv.conf"
mount -t proc proc "$fresh/proc"
mount --rbind /sys "$fresh/sys"
mount --rbind /dev "$fresh/dev"
echo "quickstart_fresh: ./scripts/quickstart.sh in the chroot (load average: $(cut -d' ' -f1-3 /proc/loadavg))"
start=$(date +%s.%N)
chroot "$fresh" /usr/bin/env -i HOME=/root TERM=dumb \
  PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
  bash -c 'cd /root/vf && ./scripts/quickstart.sh' | tee "$fresh/quickstart.log" |
  grep -E '^(setup:|quickstart:|Need to get|Fetched|finished|test accuracy|weights)' || true
end=$(date +%s.%N)
grep -q '^weights sha256' "$fresh/quickstart.log" || { echo "quickstart_fresh: no result" >&2; exit 1; }
echo "quickstart_fresh: $(awk -v a="$start" -v b="$end" 'BEGIN { printf "%.0f", b - a }') s to the example's result (load average after: $(cut -d' ' -f1-3 /proc/loadavg))"
