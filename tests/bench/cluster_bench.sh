#!/usr/bin/env bash
# cluster_bench.sh — the cluster benchmark on shaped links (needs root: network namespaces).
# Builds K network namespaces rpcb0..rpcb<K-1>, each with a veth (10.77.0.<r+1>/24) to a bridge
# in this namespace, shapes each node's link to RATE in both directions with `tc tbf` (the node's
# egress and the bridge port's egress towards it), then runs build/tests/bench/cluster_bench once
# per rate: the node's communicators run inside its namespace, and the bytes each node sent are
# read from its bridge port's rx counter. Everything it made is removed on exit.
#   sudo tests/bench/cluster_bench.sh [RATES_GBIT (default "1 10")] [-- extra cluster_bench flags]
set -euo pipefail
cd "$(dirname "$0")/../.."
BIN=build/tests/bench/cluster_bench
[[ -x $BIN ]] || { echo "build $BIN first (cmake --build build --target cluster_bench)" >&2; exit 2; }
RATES=${1:-"1 10"}
shift || true
[[ ${1:-} == -- ]] && shift
K=${RP_BENCH_NODES:-2}
BR=rpcbbr

cleanup() {
  for ((r = 0; r < K; r++)); do
    ip link del "rpcbv$r" 2>/dev/null || true
    ip netns del "rpcb$r" 2>/dev/null || true
  done
  ip link del "$BR" 2>/dev/null || true
}
trap cleanup EXIT
cleanup

ip link add "$BR" type bridge
ip link set "$BR" up
addresses=() counters=()
for ((r = 0; r < K; r++)); do
  ip netns add "rpcb$r"
  ip link add "rpcbv$r" type veth peer name eth0 netns "rpcb$r"
  ip link set "rpcbv$r" master "$BR" up
  ip -n "rpcb$r" addr add "10.77.0.$((r + 1))/24" dev eth0
  ip -n "rpcb$r" link set eth0 up
  ip -n "rpcb$r" link set lo up
  addresses+=("10.77.0.$((r + 1))")
  counters+=("/sys/class/net/rpcbv$r/statistics/rx_bytes")
done
join() { local IFS=,; echo "$*"; }

for rate in $RATES; do
  for ((r = 0; r < K; r++)); do
    # A token bucket per direction: bursts of 1 ms at the rate (at least 64 KiB), queueing up to 50 ms.
    burst=$(awk -v g="$rate" 'BEGIN { b = g * 1e9 / 8 / 1000; if (b < 65536) b = 65536; printf "%d", b }')
    ip netns exec "rpcb$r" tc qdisc replace dev eth0 root tbf rate "${rate}gbit" burst "$burst" latency 50ms
    tc qdisc replace dev "rpcbv$r" root tbf rate "${rate}gbit" burst "$burst" latency 50ms
  done
  "$BIN" --nodes "$K" --netns rpcb --addresses "$(join "${addresses[@]}")" \
    --wire_counters "$(join "${counters[@]}")" --link_gbps "$rate" "$@"
done
