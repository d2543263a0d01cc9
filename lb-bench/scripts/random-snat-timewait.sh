#!/bin/bash
# Why the real kube-proxy's NodePort connections/s is low on the test bed
# (docs/benchmarks.md, "Where we lose, and why"): SNAT to a random port
# (kube-proxy's MASQUERADE --random-fully, nftables mode's `masquerade
# fully-random`) meets the backend's TIME_WAIT sockets. A server that closes
# first keeps TIME_WAIT for (node address:port, backend:port); a new SYN that
# the SNAT maps onto such a tuple, from another client connection, carries
# timestamps of another series, so the backend rejects it as old (PAWS,
# TcpExtPAWSTimewait) and the client retransmits its SYN a second later.
#
# Three namespaces, nothing else touched: client -> router (DNAT like a
# NodePort, then no SNAT / masquerade / masquerade fully-random) -> server
# (answers a line and closes, as the bench's lb-pod-server does). Sequential
# short connections for 5 rounds of 4 s per mode; per mode the connection
# rate and the server's and client's counters. Run as root; removes its
# namespaces on exit.
set -u
P=lbx$$
C=${P}c R=${P}r S=${P}s
cleanup() { for n in $C $R $S; do ip netns del "$n" 2>/dev/null; done; }
trap cleanup EXIT
# Fresh namespaces per mode: no TIME_WAIT or conntrack entry carried over.
up() {
  for n in $C $R $S; do ip netns add "$n"; done
  ip -n $C link add vc0 type veth peer name vr0 netns $R
  ip -n $R link add vr1 type veth peer name vs0 netns $S
  ip -n $C addr add 198.51.100.1/24 dev vc0
  ip -n $R addr add 198.51.100.2/24 dev vr0
  ip -n $R addr add 192.0.2.1/24 dev vr1
  ip -n $S addr add 192.0.2.2/24 dev vs0
  for l in "$C vc0" "$C lo" "$R vr0" "$R vr1" "$R lo" "$S vs0" "$S lo"; do
    set -- $l; ip -n "$1" link set "$2" up
  done
  ip -n $S route add default via 192.0.2.1
  ip -n $C route add 192.0.2.0/24 via 198.51.100.2
  ip netns exec $R sysctl -qw net.ipv4.ip_forward=1
  ip netns exec $S python3 -c '
import socket
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("192.0.2.2", 8080)); s.listen(1024)
while True:
    c, _ = s.accept(); c.sendall(b"pod\n"); c.close()
' &
  SERVER=$!
  sleep 0.5
}
down() { kill $SERVER; wait $SERVER 2>/dev/null; cleanup; }
run() {
  local mode=$1 nat
  case $mode in
    none) nat="" ;;
    masquerade) nat="oifname \"vr1\" masquerade" ;;
    fully-random) nat="oifname \"vr1\" masquerade fully-random" ;;
  esac
  up
  ip netns exec $R nft -f - <<NFT
table ip x {
  chain pre { type nat hook prerouting priority -100; ip daddr 198.51.100.2 tcp dport 30080 dnat to 192.0.2.2:8080; }
  chain post { type nat hook postrouting priority 100; $nat; }
}
NFT
  ip netns exec $S nstat -n >/dev/null; ip netns exec $C nstat -n >/dev/null
  ip netns exec $C python3 -c '
import socket, time
n = slow = 0; rates = []
for r in range(5):
    t1 = time.time(); k = 0
    while time.time() - t1 < 4:
        a = time.time()
        s = socket.create_connection(("198.51.100.2", 30080), timeout=3); s.recv(10); s.close()
        slow += time.time() - a > 0.5; k += 1
    rates.append(round(k / (time.time() - t1))); n += k
print("'"$mode"': connections/s per round", rates, "of", n, "connections,", slow, "took over 0.5 s")
'
  echo "  server:"; ip netns exec $S nstat | grep -E "PAWS|TcpExtTW " | sed "s/^/    /"
  echo "  client:"; ip netns exec $C nstat | grep -E "SynRetrans|OutRsts" | sed "s/^/    /"
  down
}
for m in none masquerade fully-random; do run $m; done
