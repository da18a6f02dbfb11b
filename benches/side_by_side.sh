#!/usr/bin/env bash
# Sluice and Limitador side by side, on this machine, in one run: each server
# in turn answers the same ShouldRateLimit load, and the script reports
# decisions/s and the CPU each server process, and Redis, spent per decision
# (read from /proc/PID/stat before and after each round, so it is CPU time,
# not wall time). Rounds alternate between the servers so that a noisy
# neighbour hits both alike; the last lines give Sluice's figures over
# Limitador's, per load, per round and over the means of all rounds.
#
# Three loads, in this order (LOADS): 100,000 identities drawn uniformly,
# the same drawn by a Zipf law (s = 1: a few hot identities and a long
# tail), as real traffic spreads, then one hot identity that every request
# hits. The first two are sent by `sluice bench` (a gRPC client that fills
# each request's descriptor with its drawn identity), the last by h2load (a
# standard HTTP/2 load tool sending one fixed request).
#
# With Redis, each round also runs Sluice in memory, and the script gives
# what the Redis path adds to Sluice's server CPU per decision (its client
# side), and, under each round that calls Redis, Redis's own account of it
# (INFO commandstats, reset before the round): calls and microseconds per
# decision, by command (commands a script runs are listed too, and their
# time is also inside the script's).
#
# Usage: benches/side_by_side.sh [memory|redis] [ROUNDS]
#   LOADS      which loads, in order (default "uniform zipf hot")
#   KEYS       identities of the uniform and Zipf loads (default 100000)
#   SLUICE     the sluice binary       (default target/release/sluice)
#   SLUICE_THREADS  the server's worker threads (TOKIO_WORKER_THREADS for it
#              alone; default: one per CPU, as the binary has it)
#   LIMITADOR  the limitador-server binary, built by
#              benches/build-limitador.sh (default /tmp/limitador/target/release/limitador-server);
#              when missing, Limitador's rows are left out
#   REQUESTS   requests per round      (default 200000)
#   CLIENTS    connections x streams   (default "8 16": h2load -c 8 -m 16)
#   RATE       decisions/s in all: pace each round at this rate for
#              DURATION seconds (default 8; h2load --rps, the rate split
#              over the connections) and also report the latency of the
#              paced requests, p50 and p99, from h2load's per-request log
#              (its time from when a request is sent to its whole answer);
#              unset (default), h2load sends as fast as it is answered
#   COUNT      "cpu" (default), or "instructions": run each server under
#              valgrind's callgrind and report the instructions it ran per
#              decision (user space, all its threads) instead of CPU time:
#              slow (REQUESTS defaults to 10000), but the same on any day,
#              where CPU time moves with the machine. Redis's CPU is then
#              read at the few thousand decisions/s valgrind allows, where
#              fewer requests share a call
#
# Needs h2load (Debian: nghttp2-client) and, for redis, redis-server. The
# load: one descriptor of two entries under a limit no request reaches, so
# every decision counts: client=c1, path=u<k> for identity k of the uniform
# and Zipf loads, client=c1, path=/x for the hot one (both servers keep one
# counter per distinct path). Both generators keep CLIENTS' connections x
# streams requests in flight. "bare gRPC" (hot load only) is Sluice
# answering a method it does not have (no decode, no decision): the floor
# of the HTTP/2 and gRPC framing alone.
set -euo pipefail
cd "$(dirname "$0")/.."

mode=${1:-memory}
rounds=${2:-2}
sluice=${SLUICE:-target/release/sluice}
limitador=${LIMITADOR:-/tmp/limitador/target/release/limitador-server}
count=${COUNT:-cpu}
read -r -a loads <<<"${LOADS:-uniform zipf hot}"
keys=${KEYS:-100000}
for load in "${loads[@]}"; do
  case "$load" in uniform | zipf | hot) ;; *) echo "LOADS are uniform, zipf or hot, not $load" >&2; exit 1 ;; esac
done
case "$count" in
  cpu) requests=${REQUESTS:-200000} warmup=20000 ;;
  instructions) requests=${REQUESTS:-10000} warmup=2000 ;;
  *) echo "COUNT is cpu or instructions, not $count" >&2; exit 1 ;;
esac
read -r conns streams <<<"${CLIENTS:-8 16}"
rate=${RATE:-}
duration=${DURATION:-8}
if [ -n "$rate" ]; then
  [ "$count" = cpu ] || { echo "RATE paces CPU rounds only, not COUNT=$count" >&2; exit 1; }
  requests=$((rate * duration))
fi

command -v h2load >/dev/null || { echo "needs h2load: apt-get install nghttp2-client" >&2; exit 1; }
[ -x "$sluice" ] || { echo "no $sluice: cargo build --release" >&2; exit 1; }
[ "$count" = cpu ] || command -v callgrind_control >/dev/null || { echo "needs valgrind: apt-get install valgrind" >&2; exit 1; }
[ -x "$limitador" ] || { echo "note: no Limitador at $limitador; its rows are left out" >&2; limitador=; }

work=$(mktemp -d)
pids=()
declare -A sluice_rounds memory_rounds limitador_rounds
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

# Sluice's Redis timeout (40 ms by default) is raised: on a loaded machine a
# call can wait longer than that for a core, and a call that timed out is
# answered UNAVAILABLE and refunded, which is not a decision.
export SLUICE_REDIS_TIMEOUT_MS=${SLUICE_REDIS_TIMEOUT_MS:-1000}

# Starts Sluice on PORT, with Redis when given its URL.
start_sluice() {
  local port=$1 redis=${2:-}
  local args=(serve --rules "$work/rules.yaml" --grpc-addr "127.0.0.1:$port" --http-addr "127.0.0.1:$(free_port)")
  [ -n "$redis" ] && args+=(--redis-url "$redis")
  (
    [ -n "${SLUICE_THREADS:-}" ] && export TOKIO_WORKER_THREADS=$SLUICE_THREADS
    launch "$sluice" "${args[@]}"
  ) >"$work/sluice.log" 2>&1 &
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

# Sends N requests of LOAD to PORT/PATH; prints "decisions/s p50-ms
# p99-ms" (the latencies "-" unless paced). The hot load and bare gRPC are
# h2load's (one fixed request); the uniform and Zipf loads `sluice bench`'s
# (the same identities, in the same order, for every server: one seed).
drive() {
  local port=$1 path=$2 load=$3 n=$4 paced=${5:-}
  local out
  if [ "$load" = hot ] || [ "$path" != "$rls" ]; then
    local pace=()
    [ -n "$paced" ] && pace=(--rps "$((rate / conns))" --log-file "$work/times.log")
    out=$(h2load -n "$n" -c "$conns" -m "$streams" "${pace[@]}" -d "$work/request.bin" \
      -H 'content-type: application/grpc' -H 'te: trailers' "http://127.0.0.1:$port$path")
    local ok rps latency="- -"
    ok=$(sed -n 's/.*status codes: \([0-9]*\) 2xx.*/\1/p' <<<"$out")
    rps=$(sed -n 's/^finished in .*, \([0-9.]*\) req\/s.*/\1/p' <<<"$out")
    [ "$ok" = "$n" ] || { echo "only $ok of $n answered 2xx:" >&2; echo "$out" >&2; exit 1; }
    [ -n "$paced" ] && latency=$(percentiles "$work/times.log")
    echo "$rps $latency"
    return
  fi
  local pace=()
  [ -n "$paced" ] && pace=(--rate "$rate")
  out=$("$sluice" bench --addr "127.0.0.1:$port" --domain bench --requests "$n" --warmup 0 \
    --concurrency "$((conns * streams))" --connections "$conns" "${pace[@]}" \
    --keys "$keys" --distribution "$load" --descriptor 'client=c1,path=u{key}' \
    --timeout 10s --json)
  python3 -c "
import json, sys
r = json.loads(sys.argv[1])
if r['decisions'] != $n or r['errors']:
    sys.exit(f'only {r[\"decisions\"]} of $n decided: {r[\"errors\"]}')
paced = bool('$paced')
lat = f\"{r['latency_ms']['p50']:.2f} {r['latency_ms']['p99']:.2f}\" if paced else '- -'
print(f\"{r['decisions_per_s']:.0f} {lat}\")" "$out"
}

# One round: LOAD against PORT/PATH while PID serves it; prints
# "decisions/s server-cost redis-µs p50-ms p99-ms", the server's cost in
# CPU µs or in instructions per decision (COUNT), the latencies "-" unless
# paced (RATE).
round() {
  local pid=$1 port=$2 path=$3 load=$4
  [ "$count" = instructions ] && callgrind_control --instr=on "$pid" >/dev/null 2>&1
  # Warm-up: connections, allocator, first keys.
  drive "$port" "$path" "$load" "$warmup" >/dev/null || exit 1
  local s0 r0 s1 r1 out
  s0=$(ticks "$pid"); r0=$([ -n "$redis_pid" ] && ticks "$redis_pid" || echo 0)
  [ -n "$redis_pid" ] && redis-cli -p "$rport" config resetstat >/dev/null
  [ "$count" = instructions ] && instructions "$pid" >/dev/null
  out=$(drive "$port" "$path" "$load" "$requests" "$rate") || exit 1
  s1=$(ticks "$pid"); r1=$([ -n "$redis_pid" ] && ticks "$redis_pid" || echo 0)
  # What the server spent: clock ticks of CPU, or instructions.
  local spent=$((s1 - s0)) per_unit="1e6 / $hz" digits=2
  if [ "$count" = instructions ]; then
    spent=$(instructions "$pid") per_unit=1 digits=0
  fi
  [ -n "$redis_pid" ] && commandstats >"$work/commandstats.txt"
  local rps p50 p99
  read -r rps p50 p99 <<<"$out"
  python3 -c "n = $requests; print(f'{float(\"$rps\"):.0f} {$spent * $per_unit / n:.${digits}f} {($r1 - $r0) * 1e6 / $hz / n:.2f} $p50 $p99')"
}

# Redis's commands since its stats were reset, per decision of the round:
# "  INFO commandstats: evalsha 0.028 calls/dec, 63.10 µs/call, 1.76 µs/dec".
commandstats() {
  redis-cli -p "$rport" info commandstats | tr -d '\r' | python3 -c "
import re, sys
for line in sys.stdin:
    m = re.match(r'cmdstat_(\w+):calls=(\d+),usec=(\d+),', line)
    if m and m[1] not in ('config', 'info', 'ping'):
        calls, usec = int(m[2]), int(m[3])
        print(f'{\"\":30s} INFO commandstats: {m[1]} {calls / $requests:.4f} calls/dec, '
              f'{usec / calls:.2f} µs/call, {usec / $requests:.2f} µs/dec')"
}

# "p50 p99", in ms, of the request times (third column, µs) in h2load's log.
percentiles() {
  python3 - "$1" <<'PY'
import sys
times = sorted(int(line.split("\t")[2]) for line in open(sys.argv[1]))
at = lambda q: times[min(len(times) - 1, int(q * len(times)))] / 1000
print(f"{at(0.50):.2f} {at(0.99):.2f}")
PY
}

rls=/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit
cost="server CPU µs/dec"
[ "$count" = instructions ] && cost="server instr/dec"
# A row of the table: NAME ROUND and a round's figures.
row() {
  local name=$1 r=$2 rps cpu rcpu p50 p99
  read -r rps cpu rcpu p50 p99 <<<"$3"
  [ -n "$redis_pid" ] || rcpu=-
  printf '%-30s %6s %12s %18s %17s %7s %7s\n' "$name" "$r" "$rps" "$cpu" "$rcpu" "$p50" "$p99"
}
# A round's figures with the Redis column emptied, for a round that calls no Redis.
no_redis() { awk '{$3 = "-"; print}'; }
printf '%-30s %6s %12s %18s %17s %7s %7s\n' server round decisions/s "$cost" "Redis CPU µs/dec" "p50 ms" "p99 ms"
# Every round starts on an empty Redis, so that rounds and servers are alike.
flush() { [ -z "$redis_pid" ] || redis-cli -p "$rport" flushall >/dev/null; }
for r in $(seq 1 "$rounds"); do
  for load in "${loads[@]}"; do
    label="$load"
    [ "$load" = hot ] || label="$load $keys"
    if [ -n "$redis_pid" ]; then
      # The same decision in memory, for what the Redis path adds to it.
      port=$(free_port); pid=$(start_sluice "$port"); pids+=("$pid"); wait_port "$port"
      figures=$(round "$pid" "$port" "$rls" "$load")
      row "Sluice, memory, $label" "$r" "$(no_redis <<<"$figures")"
      memory_rounds[$load]+="$figures"$'\n'
      kill "$pid"; wait "$pid" 2>/dev/null || true
    fi
    flush
    port=$(free_port); pid=$(start_sluice "$port" "$redis_url"); pids+=("$pid"); wait_port "$port"
    if [ "$load" = hot ]; then
      row "bare gRPC (Sluice)" "$r" "$(round "$pid" "$port" /envoy.service.ratelimit.v3.RateLimitService/NoSuchMethod hot | no_redis)"
    fi
    figures=$(round "$pid" "$port" "$rls" "$load")
    row "Sluice, $mode, $label" "$r" "$figures"
    [ -n "$redis_pid" ] && cat "$work/commandstats.txt"
    sluice_rounds[$load]+="$figures"$'\n'
    if grep -q "after its caller's timeout\|after their callers' timeout" "$work/sluice.log"; then
      echo "warning: Sluice's Redis calls timed out in round $r (its log says so): some answers were UNAVAILABLE, not decisions" >&2
    fi
    kill "$pid"; wait "$pid" 2>/dev/null || true
    if [ -n "$limitador" ]; then
      flush
      port=$(free_port); pid=$(start_limitador "$port"); pids+=("$pid"); wait_port "$port"
      figures=$(round "$pid" "$port" "$rls" "$load")
      row "Limitador, $mode, $label" "$r" "$figures"
      [ -n "$redis_pid" ] && cat "$work/commandstats.txt"
      limitador_rounds[$load]+="$figures"$'\n'
      kill "$pid"; wait "$pid" 2>/dev/null || true
    fi
  done
done

for load in "${loads[@]}"; do
  echo
  echo "== $load load"
  # What the Redis path adds to Sluice's server cost per decision (its
  # client side), round by round and over the means.
  if [ -n "${memory_rounds[$load]:-}" ]; then
    printf '%s' "${memory_rounds[$load]}" >"$work/memory.txt"
    printf '%s' "${sluice_rounds[$load]}" >"$work/sluice.txt"
    python3 - "$work/memory.txt" "$work/sluice.txt" <<'PY'
import sys
cost = lambda path: [float(line.split()[1]) for line in open(path)]
memory, redis = cost(sys.argv[1]), cost(sys.argv[2])
mean = lambda xs: sum(xs) / len(xs)
print(f"{'Redis over memory':30s} " + " ".join(f"{b - a:+.2f}" for a, b in zip(memory, redis))
      + f"  (means {mean(redis) - mean(memory):+.2f}) server cost/dec")
PY
  fi

  # Sluice against Limitador, round by round (the same round shares the
  # machine's mood) and over the means of all rounds.
  if [ -n "$limitador" ]; then
    printf '%s' "${sluice_rounds[$load]}" >"$work/sluice.txt"
    printf '%s' "${limitador_rounds[$load]}" >"$work/limitador.txt"
    python3 - "$work/sluice.txt" "$work/limitador.txt" "$mode" <<'PY'
import sys
number = lambda word: None if word == "-" else float(word)
rows = lambda path: [[number(w) for w in line.split()] for line in open(path)]
sluice, limitador, mode = rows(sys.argv[1]), rows(sys.argv[2]), sys.argv[3]
# decisions/s, server cost, Redis CPU (with Redis only), p50, p99 (paced only)
widths = (12, 18, 17, 7, 7)
shown = [True, True, mode == "redis", sluice[0][3] is not None, sluice[0][4] is not None]
ratio = lambda a, b: f"{a / b:.2f}" if b else "-"
line = lambda label, cells: print(f"{'':30s} {label:>6s} " + " ".join(
    f"{cell if shown[i] else '-':>{widths[i]}s}" for i, cell in enumerate(cells)))
print(f"{'Sluice / Limitador':30s} {'round':>6s} {'decisions/s':>12s} {'server cost/dec':>18s} {'Redis CPU/dec':>17s} {'p50':>7s} {'p99':>7s}")
for r, (s, l) in enumerate(zip(sluice, limitador), 1):
    line(str(r), [ratio(a, b) if shown[i] else "-" for i, (a, b) in enumerate(zip(s, l))])
mean = lambda rs, i: sum(x[i] for x in rs) / len(rs)
line("means", [ratio(mean(sluice, i), mean(limitador, i)) if shown[i] else "-" for i in range(5)])
PY
  fi
done
