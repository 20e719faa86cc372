#!/usr/bin/env bash
# Two "hosts" on one machine: network namespaces NAME-h0 and NAME-h1 joined by a veth pair (interface ssveth in
# each), 10.213.0.1/24 in h0 and 10.213.0.2/24 in h1. Each namespace holds only its loopback and its veth end, and
# no route but the link's /24: traffic goes only between the two addresses this script assigns. Needs root.
#
#   tools/netns_hosts.sh check            can namespaces be made here? (makes and removes a throwaway one)
#   tools/netns_hosts.sh up               make both (an error if they exist; a failed `up` removes what it made)
#   tools/netns_hosts.sh down             SIGKILL every process inside them, then remove them (and the link)
#   tools/netns_hosts.sh exec N CMD...    run CMD in host N (0 or 1); NETNS_HOST=N and NETNS_IFNAME set
#   tools/netns_hosts.sh kill N           SIGKILL every process in host N: the "host" dies, its link stays
#   tools/netns_hosts.sh delay MS         add MS ms to each direction of the link (tc netem; 0 removes it)
#   tools/netns_hosts.sh addr N | ifname  host N's address; the veth interface's name (GLOO_SOCKET_IFNAME)
#   tools/netns_hosts.sh run CMD...       up, CMD (in the root namespace), down on any exit or signal
#
# NETNS_HOSTS_NAME (default specswap) names the pair, so runs side by side do not meet.
set -Eeuo pipefail

NAME=${NETNS_HOSTS_NAME:-specswap}
IFNAME=ssveth
NET=10.213.0
ADDRS=("$NET.1" "$NET.2")
NS=("$NAME-h0" "$NAME-h1")

die() { echo "netns_hosts: $*" >&2; exit 2; }

[[ $NAME =~ ^[A-Za-z0-9_.-]{1,40}$ ]] || die "NETNS_HOSTS_NAME must be 1-40 of [A-Za-z0-9_.-]; got '$NAME'"

host() {  # N -> namespace name
  [[ ${1:-} == 0 || ${1:-} == 1 ]] || die "host must be 0 or 1; got '${1:-}'"
  echo "${NS[$1]}"
}

need_root() {
  [[ $(id -u) == 0 ]] || die "needs root (network namespaces); running as uid $(id -u)"
  command -v ip >/dev/null || die "needs iproute2's ip (not found)"
}

exists() { ip netns list 2>/dev/null | awk '{print $1}' | grep -qx "$1"; }

check() {
  need_root
  local probe="$NAME-check$$" out
  if ! out=$(ip netns add "$probe" 2>&1); then
    die "ip netns add failed: $out"
  fi
  ip netns del "$probe"
}

kill_all() {  # NS: SIGKILL every process in it until none is left (one that exits meanwhile is no error)
  local pids killed=0
  for _ in $(seq 50); do
    pids=$(ip netns pids "$1" 2>/dev/null || true)
    [[ -z $pids ]] && { echo "$killed"; return 0; }
    killed=$((killed + $(wc -w <<<"$pids")))
    # shellcheck disable=SC2086 - one pid per word
    kill -9 $pids 2>/dev/null || true
    sleep 0.1
  done
  die "processes still in $1 after 5 s: $(ip netns pids "$1" | tr '\n' ' ')"
}

down() {
  local ns
  for ns in "${NS[@]}"; do
    exists "$ns" || continue
    kill_all "$ns" >/dev/null
    ip netns del "$ns"
  done
}

up() {
  need_root
  local ns
  for ns in "${NS[@]}"; do
    ! exists "$ns" || die "namespace $ns exists already (tools/netns_hosts.sh down removes it)"
  done
  trap 'down' ERR
  ip netns add "${NS[0]}"
  ip netns add "${NS[1]}"
  # both ends made inside their namespaces: nothing of the pair ever sits in the root namespace
  ip link add "$IFNAME" netns "${NS[0]}" type veth peer name "$IFNAME" netns "${NS[1]}"
  for i in 0 1; do
    ip -n "${NS[$i]}" addr add "${ADDRS[$i]}/24" dev "$IFNAME"
    ip -n "${NS[$i]}" link set lo up
    ip -n "${NS[$i]}" link set "$IFNAME" up
  done
  trap - ERR
  echo "netns_hosts: ${NS[0]} ${ADDRS[0]} <-> ${NS[1]} ${ADDRS[1]} over $IFNAME"
}

delay() {
  local ms=${1:-} i out config
  [[ $ms =~ ^[0-9]+(\.[0-9]+)?$ ]] || die "delay takes milliseconds (a number); got '$ms'"
  for i in 0 1; do
    if [[ $ms == 0 || $ms == 0.0 ]]; then
      ip netns exec "${NS[$i]}" tc qdisc del dev "$IFNAME" root 2>/dev/null || true
      continue
    fi
    if ! out=$(ip netns exec "${NS[$i]}" tc qdisc replace dev "$IFNAME" root netem delay "${ms}ms" 2>&1); then
      config=""
      if [[ -r /proc/config.gz ]] && zcat /proc/config.gz | grep -x '# CONFIG_NET_SCH_NETEM is not set' >/dev/null; then
        config=" (/proc/config.gz: CONFIG_NET_SCH_NETEM is not set)"
      fi
      echo "netns_hosts: tc netem failed: $out" >&2
      echo "netns_hosts: this kernel has no netem qdisc: load the sch_netem module (modprobe sch_netem), or use" \
        "a kernel built with CONFIG_NET_SCH_NETEM$config" >&2
      exit 3
    fi
  done
}

cmd=${1:-}
shift || true
case $cmd in
  check) check ;;
  up) up ;;
  down) need_root; down ;;
  exec)
    ns=$(host "${1:-}"); n=$1; shift
    [[ $# -gt 0 ]] || die "exec N CMD...: no command"
    exec ip netns exec "$ns" env NETNS_HOST="$n" NETNS_IFNAME="$IFNAME" "$@" ;;
  kill)
    ns=$(host "${1:-}")
    need_root
    exists "$ns" || die "no namespace $ns (tools/netns_hosts.sh up makes it)"
    killed=$(kill_all "$ns")
    echo "netns_hosts: killed $killed processes in $ns" ;;
  delay) delay "${1:-}" ;;
  addr) host "${1:-}" >/dev/null; echo "${ADDRS[$1]}" ;;
  ifname) echo "$IFNAME" ;;
  run)
    [[ $# -gt 0 ]] || die "run CMD...: no command"
    up
    trap 'down' EXIT
    trap 'exit 130' INT TERM
    NETNS_HOSTS_NAME=$NAME "$@" ;;
  *) die "usage: $0 check | up | down | exec N CMD... | kill N | delay MS | addr N | ifname | run CMD..." ;;
esac
