#!/usr/bin/env bash
# Sluice and Limitador side by side, on this machine, in one run: each server
# in turn answers the same ShouldRateLimit load from h2load (a standard
# HTTP/2 load tool), and the script reports decisions/s (h2load's) and the
# CPU each server process, and Redis, spent per decision (read from
# /proc/PID/stat before and after each round, so it is CPU time, not wall
# time). Rounds alternate between the servers so that a noisy neighbour
# hits both alike; the last lines give Sluice's figures over Limitador's,
# per round and over the means of all rounds.
#
# Usage: benches/side_by_side.sh [memory|redis] [ROUNDS]
#   SLUICE     the sluice binary       (default target/release/sluice)
#   LIMITADOR  the limitador-server binary, built by
#              ../shared/tools/build-limitador.sh (default /tmp/limitador/target/release/limitador-server);
#              when missing, Limitador's rows are left out
#   REQUESTS   requests per round      (default 200000)
#   CLIENTS    connections x streams   (default "8 16": h2load -c 8 -m 16)
#   COUNT      "cpu" (default), or "instructions": run each server under
#              valgrind's callgrind and report the instructions it ran per
#              decision (user space, all its threads) instead of CPU time:
#              slow (REQUESTS defaults to 10000), but the same on any day,
#              where CPU time moves with the machine. Redis's CPU is then
#              read at the few thousand decisions/s valgrind allows, where
#              fewer requests share a call
#
# Needs h2load (Debian: nghttp2-client) and, for redis, redis-server. The
# load: one descriptor of two entries (client=c1, path=/x) under a limit no
# request reaches, so every decision counts. "bare gRPC" is Sluice answering
# a method it does not have (no decode, no decision): the floor of the
# HTTP/2 and gRPC framing alone.
set -euo pipefail
cd "$(dirname "$0")/.."

mode=${1:-memory}
rounds=${2:-2}
sluice=${SLUICE:-target/release/sluice}
limitador=${LIMITADOR:-/tmp/limitador/target/release/limitador-server}
count=${COUNT:-cpu}
case "$count" in
  cpu) requests=${REQUESTS:-200000} warmup=20000 ;;
  instructions) requests=${REQUESTS:-10000} warmup=2000 ;;
  *) echo "COUNT is cpu or instructions, not $count" >&2; exit 1 ;;
esac
read -r conns streams <<<"${CLIENTS:-8 16}"

command -v h2load >/dev/null || { echo "needs h2load: apt-get install nghttp2-client" >&2; exit 1; }
[ -x "$sluice" ] || { echo "no $sluice: cargo build --release" >&2; exit 1; }
[ "$count" = cpu ] || command -v callgrind_control >/dev/null || { echo "needs valgrind: apt-get install valgrind" >&2; exit 1; }
[ -x "$limitador" ] || { echo "note: no Limitador at $limitador; its rows are left out" >&2; limitador=; }

work=$(mktemp -d)
pids=()
sluice_rounds=()
limitador_rounds=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

# The request, as a gRPC frame: RateLimitRequest{domain, descriptors[0].entries}.
python3 - "$work/request.bin" <<'PY'
import sys
def field(number, payload):
    tag = bytes([(number << 3) | 2])
    n, length = len(payload), b""
    while True:
        b = n & 0x7F; n >>= 7
        length += bytes([b | (0x80 if n else 0)])
        if not n: break
    return tag + length + payload
entry = lambda k, v: field(1, field(1, k.encode()) + field(2, v.encode()))
message = field(1, b"bench") + field(2, entry("client", "c1") + entry("path", "/x"))
open(sys.argv[1], "wb").write(b"\x00" + len(message).to_bytes(4, "big") + message)
PY

cat >"$work/rules.yaml" <<'YAML'
domain: bench
descriptors:
  - key: client
    descriptors:
      - key: path
        rate_limit: {unit: minute, requests_per_unit: 1000000000}
YAML
cat >"$work/limits.yaml" <<'YAML'
- namespace: bench
  max_value: 1000000000
  seconds: 60
  conditions: []
  variables:
    - descriptors[0].client
    - descriptors[0].path
YAML

redis_pid=
redis_url=
if [ "$mode" = redis ]; then
  command -v redis-server >/dev/null || { echo "needs redis-server" >&2; exit 1; }
  rport=$(free_port)
  redis-server --port "$rport" --bind 127.0.0.1 --save '' --appendonly no --dir "$work" >/dev/null 2>&1 &
  redis_pid=$!
  pids+=("$redis_pid")
  until redis-cli -p "$rport" ping >/dev/null 2>&1; do sleep 0.1; done
  redis_url="redis://127.0.0.1:$rport"
fi

# Clock ticks of user + system CPU of a process so far.
ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }
hz=$(getconf CLK_TCK)

wait_port() { until (echo >"/dev/tcp/127.0.0.1/$1") 2>/dev/null; do sleep 0.1; done; }

# Becomes a server (run it in the background: `launch ... &`, whose $! is
# then the server's pid): as it is, or under callgrind, counting nothing
# until a round asks. Under callgrind everything runs about fifty times
# slower, so Sluice's Redis timeout (40 ms) is raised to 2 s: a call that
# timed out would be answered UNAVAILABLE and refunded, and counted as
# something else than a decision.
launch() {
  if [ "$count" = instructions ]; then
    export SLUICE_REDIS_TIMEOUT_MS=2000
    exec valgrind --tool=callgrind --instr-atstart=no --callgrind-out-file="$work/callgrind.%p" "$@"
  fi
  exec "$@"
}

# Instructions counted since the last call, for PID under callgrind: dumps
# its counts (which zeroes them) and reads the dump's total.
instructions() {
  callgrind_control --dump "$1" >/dev/null 2>&1
  local last
  last=$(ls -t "$work/callgrind.$1".* | head -1)
  awk '/^totals:/ {print $2}' "$last"
}

start_sluice() {
  local port=$1
  local args=(serve --rules "$work/rules.yaml" --grpc-addr "127.0.0.1:$port" --http-addr "127.0.0.1:$(free_port)")
  [ -n "$redis_url" ] && args+=(--redis-url "$redis_url")
  launch "$sluice" "${args[@]}" >"$work/sluice.log" 2>&1 &
  echo $!
}

start_limitador() {
  local port=$1
  local storage=(memory)
  [ -n "$redis_url" ] && storage=(redis "$redis_url")
  launch "$limitador" --rls-ip 127.0.0.1 --rls-port "$port" --http-ip 127.0.0.1 --http-port "$(free_port)" \
    "$work/limits.yaml" "${storage[@]}" >"$work/limitador.log" 2>&1 &
  echo $!
}

# One round: h2load against PORT/PATH while PID serves it; prints
# "decisions/s server-cost redis-µs", the server's cost in CPU µs or in
# instructions per decision (COUNT).
round() {
  local pid=$1 port=$2 path=$3
  local url="http://127.0.0.1:$port$path"
  [ "$count" = instructions ] && callgrind_control --instr=on "$pid" >/dev/null 2>&1
  # Warm-up: connections, allocator, first keys.
  h2load -n "$warmup" -c "$conns" -m "$streams" -d "$work/request.bin" \
    -H 'content-type: application/grpc' -H 'te: trailers' "$url" >/dev/null
  local s0 r0 s1 r1 out
  s0=$(ticks "$pid"); r0=$([ -n "$redis_pid" ] && ticks "$redis_pid" || echo 0)
  [ "$count" = instructions ] && instructions "$pid" >/dev/null
  out=$(h2load -n "$requests" -c "$conns" -m "$streams" -d "$work/request.bin" \
    -H 'content-type: application/grpc' -H 'te: trailers' "$url")
  s1=$(ticks "$pid"); r1=$([ -n "$redis_pid" ] && ticks "$redis_pid" || echo 0)
  # What the server spent: clock ticks of CPU, or instructions.
  local spent=$((s1 - s0)) per_unit="1e6 / $hz" digits=2
  if [ "$count" = instructions ]; then
    spent=$(instructions "$pid") per_unit=1 digits=0
  fi
  local ok rps
  ok=$(sed -n 's/.*status codes: \([0-9]*\) 2xx.*/\1/p' <<<"$out")
  rps=$(sed -n 's/^finished in .*, \([0-9.]*\) req\/s.*/\1/p' <<<"$out")
  [ "$ok" = "$requests" ] || { echo "only $ok of $requests answered 2xx:" >&2; echo "$out" >&2; exit 1; }
  python3 -c "n = $requests; print(f'{float(\"$rps\"):.0f} {$spent * $per_unit / n:.${digits}f} {($r1 - $r0) * 1e6 / $hz / n:.2f}')"
}

rls=/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit
cost="server CPU µs/dec"
[ "$count" = instructions ] && cost="server instr/dec"
printf '%-22s %6s %12s %18s %17s\n' server round decisions/s "$cost" "Redis CPU µs/dec"
for r in $(seq 1 "$rounds"); do
  port=$(free_port); pid=$(start_sluice "$port"); pids+=("$pid"); wait_port "$port"
  read -r rps cpu rcpu < <(round "$pid" "$port" /envoy.service.ratelimit.v3.RateLimitService/NoSuchMethod)
  printf '%-22s %6s %12s %18s %17s\n' "bare gRPC (Sluice)" "$r" "$rps" "$cpu" -
  read -r rps cpu rcpu < <(round "$pid" "$port" "$rls")
  printf '%-22s %6s %12s %18s %17s\n' "Sluice, $mode" "$r" "$rps" "$cpu" "$([ -n "$redis_pid" ] && echo "$rcpu" || echo -)"
  sluice_rounds+=("$rps $cpu $rcpu")
  if grep -q "after its caller's timeout\|after their callers' timeout" "$work/sluice.log"; then
    echo "warning: Sluice's Redis calls timed out in round $r (its log says so): some answers were UNAVAILABLE, not decisions" >&2
  fi
  kill "$pid"; wait "$pid" 2>/dev/null || true
  if [ -n "$limitador" ]; then
    port=$(free_port); pid=$(start_limitador "$port"); pids+=("$pid"); wait_port "$port"
    read -r rps cpu rcpu < <(round "$pid" "$port" "$rls")
    printf '%-22s %6s %12s %18s %17s\n' "Limitador, $mode" "$r" "$rps" "$cpu" "$([ -n "$redis_pid" ] && echo "$rcpu" || echo -)"
    limitador_rounds+=("$rps $cpu $rcpu")
    kill "$pid"; wait "$pid" 2>/dev/null || true
  fi
done

# Sluice against Limitador, round by round (the same round shares the
# machine's mood) and over the means of all rounds.
if [ -n "$limitador" ]; then
  printf '%s\n' "${sluice_rounds[@]}" >"$work/sluice.txt"
  printf '%s\n' "${limitador_rounds[@]}" >"$work/limitador.txt"
  python3 - "$work/sluice.txt" "$work/limitador.txt" "$mode" <<'PY'
import sys
rows = lambda path: [list(map(float, line.split())) for line in open(path)]
sluice, limitador, mode = rows(sys.argv[1]), rows(sys.argv[2]), sys.argv[3]
ratio = lambda a, b: f"{a / b:.2f}" if b else "-"
print("Sluice / Limitador      round  decisions/s    server cost/dec   Redis CPU/dec")
for r, (s, l) in enumerate(zip(sluice, limitador), 1):
    print(f"{'':22s} {r:6d} {ratio(s[0], l[0]):>12s} {ratio(s[1], l[1]):>18s} {ratio(s[2], l[2]) if mode == 'redis' else '-':>17s}")
mean = lambda rs, i: sum(x[i] for x in rs) / len(rs)
print(f"{'':22s} {'means':>6s} " + " ".join(
    f"{ratio(mean(sluice, i), mean(limitador, i)) if i < 2 or mode == 'redis' else '-':>{w}s}"
    for i, w in ((0, 12), (1, 18), (2, 17))))
PY
fi
