#!/usr/bin/env bash
# Several "hosts" on this machine, for multi-host tests: Linux network namespaces joined by a
# bridge, each with an address of its own and a private /tmp and /dev/shm (a mount namespace
# of its own), so that nothing can rely on a shared local disk or on loopback. Root only.
#
#   scripts/netcluster.sh start HOST... [--name NAME] [--subnet A.B.C]
#   scripts/netcluster.sh exec NAME HOST -- COMMAND...     (COMMAND runs on HOST)
#   scripts/netcluster.sh status NAME
#   scripts/netcluster.sh stop NAME
#
# start makes the namespace NAME-sw (the switch: a bridge), and for each HOST the namespace
# NAME-HOST with one link to the switch, the address A.B.C.(10+i) (i from 1, in the order
# given; A.B.C defaults to 10.231.0) and its loopback, plus its mount namespace (private /tmp
# and /dev/shm, tmpfs; an /etc/hosts that names every host HOST.NAME.test and HOST). It prints
# HOST=ADDRESS lines. The addresses exist only inside these
# namespaces: nothing of the machine's own network is touched, and no traffic leaves them.
# exec runs COMMAND in HOST's network and mount namespaces (its /tmp), with the environment
# given. stop kills every process inside the namespaces, removes the namespaces, their links
# and mounts, and the state directory ($SPARKTF_NETCLUSTER_DIR, default /run/sparktf-netcluster).
set -euo pipefail

STATE_ROOT="${SPARKTF_NETCLUSTER_DIR:-/run/sparktf-netcluster}"
usage() { sed -n '2,19p' "$0" | sed 's/^# \{0,1\}//'; }
die() { echo "netcluster.sh: $*" >&2; exit "${2:-1}"; }

# NAME and HOST end up in paths that stop removes as root and in namespace names: checked in
# every subcommand, before anything else (so `stop ../../x` never reaches rm -rf).
check_name() {
  [[ "$1" =~ ^[a-z][a-z0-9]{0,7}$ ]] || die "NAME: 1-8 lowercase letters and digits, got '$1'" 2
}
check_host() {
  [[ "$1" =~ ^[a-z][a-z0-9]{0,5}$ ]] || die "host names: 1-6 lowercase letters and digits, got '$1'" 2
}

cmd="${1:-}"; shift || true
case "$cmd" in -h|--help|"") usage; [ -n "$cmd" ] && exit 0; exit 2 ;; esac
case "$cmd" in
  exec) [ $# -ge 2 ] && { check_name "$1"; check_host "$2"; } ;;
  status|stop) [ $# -ge 1 ] && check_name "$1" ;;
esac
[ "$(id -u)" = 0 ] || die "needs root (network and mount namespaces)"
command -v ip >/dev/null || die "needs iproute2 (ip)"

state_of() { check_name "$1"; echo "$STATE_ROOT/$1"; }
# The namespaces of cluster $1 (NAME-...), matched as a fixed prefix, never as a pattern.
namespaces_of() {
  ip netns list 2>/dev/null | awk -v prefix="$1-" 'index($1, prefix) == 1 {print $1}'
}

stop_cluster() {  # $1 = name: everything start made, whatever is left of it
  local name="$1" dir ns pids
  dir="$(state_of "$name")"
  for ns in $(namespaces_of "$name"); do
    pids="$(ip netns pids "$ns" 2>/dev/null || true)"
    [ -n "$pids" ] && kill -9 $pids 2>/dev/null || true
  done
  if [ -d "$dir" ]; then
    for f in "$dir"/*.mnt; do
      [ -e "$f" ] || continue
      # processes that entered only the mount namespace
      for p in /proc/[0-9]*; do
        [ "$(readlink "$p/ns/mnt" 2>/dev/null)" = "$(readlink "/proc/self/ns/mnt")" ] && continue
        if [ "$(stat -L -c %i "$p/ns/mnt" 2>/dev/null)" = "$(stat -L -c %i "$f" 2>/dev/null)" ]; then
          kill -9 "${p#/proc/}" 2>/dev/null || true
        fi
      done
      umount "$f" 2>/dev/null || umount -l "$f" 2>/dev/null || true
    done
  fi
  for ns in $(namespaces_of "$name"); do
    ip netns del "$ns" 2>/dev/null || true
  done
  if [ -d "$dir" ]; then
    umount "$dir" 2>/dev/null || umount -l "$dir" 2>/dev/null || true
    rm -rf "$dir"
  fi
}

case "$cmd" in
  start)
    name="sparktf"; subnet="10.231.0"; hosts=()
    while [ $# -gt 0 ]; do
      case "$1" in
        --name) name="$2"; shift 2 ;;
        --subnet) subnet="$2"; shift 2 ;;
        -*) die "unknown option $1" 2 ;;
        *) hosts+=("$1"); shift ;;
      esac
    done
    [ ${#hosts[@]} -ge 1 ] || die "name at least one host" 2
    [ ${#hosts[@]} -le 200 ] || die "at most 200 hosts" 2
    [[ "$name" =~ ^[a-z][a-z0-9]{0,7}$ ]] || die "--name: 1-8 lowercase letters and digits, got '$name'" 2
    [[ "$subnet" =~ ^[0-9]+\.[0-9]+\.[0-9]+$ ]] || die "--subnet: A.B.C, got '$subnet'" 2
    for h in "${hosts[@]}"; do check_host "$h"; done
    dir="$(state_of "$name")"
    [ -e "$dir" ] && die "a cluster named $name is running (stop it first)"
    trap 'stop_cluster "$name"' ERR
    mkdir -p "$dir"
    chmod 700 "$dir"
    # persistent mount namespaces are bind-mounted onto files of a private mount
    mount --bind "$dir" "$dir"
    mount --make-private "$dir"
    sw="$name-sw"
    ip netns add "$sw"
    ip -n "$sw" link set lo up
    ip -n "$sw" link add br0 type bridge
    ip -n "$sw" link set br0 up
    i=0
    for h in "${hosts[@]}"; do
      i=$((i + 1)); ns="$name-$h"; addr="$subnet.$((10 + i))"
      ip netns add "$ns"
      ip -n "$ns" link set lo up
      ip link add "v$name$i" netns "$ns" type veth peer name "s$i" netns "$sw"
      ip -n "$ns" link set "v$name$i" name eth0
      ip -n "$ns" addr add "$addr/24" dev eth0
      ip -n "$ns" link set eth0 up
      ip -n "$sw" link set "s$i" master br0
      ip -n "$sw" link set "s$i" up
      printf '%s=%s\n' "$h" "$addr" >> "$dir/hosts"
    done
    # every host resolves the others' names (HOST.NAME.test, and HOST): the machine's
    # /etc/hosts plus these lines, bind-mounted on /etc/hosts in each mount namespace
    { cat /etc/hosts; echo "# scripts/netcluster.sh $name"
      sed "s/^\([^=]*\)=\(.*\)$/\2 \1.$name.test \1/" "$dir/hosts"; } > "$dir/etc-hosts"
    chmod 644 "$dir/etc-hosts"
    for h in "${hosts[@]}"; do
      touch "$dir/$h.mnt"
      unshare --mount="$dir/$h.mnt" --propagation private sh -c \
        'mount --bind "$1" /etc/hosts && mount -t tmpfs -o mode=1777 tmpfs /tmp &&
         mount -t tmpfs -o mode=1777 tmpfs /dev/shm' sh "$dir/etc-hosts"  # (state may be in /tmp)
    done
    trap - ERR
    cat "$dir/hosts"
    ;;
  exec)
    [ $# -ge 3 ] || die "usage: exec NAME HOST -- COMMAND..." 2
    name="$1"; h="$2"; shift 2
    check_name "$name"; check_host "$h"
    [ "${1:-}" = "--" ] && shift
    dir="$(state_of "$name")"
    [ -e "$dir/$h.mnt" ] || die "no host $h in cluster $name"
    exec nsenter --mount="$dir/$h.mnt" --net="/run/netns/$name-$h" --wd="$PWD" -- "$@"
    ;;
  status)
    name="${1:-sparktf}"; check_name "$name"; dir="$(state_of "$name")"
    [ -f "$dir/hosts" ] || { echo "not running"; exit 3; }
    cat "$dir/hosts"
    ;;
  stop)
    name="${1:-sparktf}"; check_name "$name"
    stop_cluster "$name"
    echo "netcluster.sh: $name stopped"
    ;;
  *) usage >&2; exit 2 ;;
esac
