#!/usr/bin/env bash
# What one decision costs Redis, counted in instructions: a private
# redis-server runs under valgrind's callgrind, benches/redis_load.py sends
# it one decision's calls per request, and the instructions Redis ran over
# CALLS decisions (after WARMUP decisions that are not counted) are divided
# by CALLS. Instructions do not move with the machine's load, where CPU time
# does (the machine is shared), so this is the figure to compare two
# versions of the script by; `sluice bench --redis-url` and
# benches/side_by_side.sh give the CPU time of a real run.
#
# Everything Redis does for a call is counted: reading and parsing the
# command, running the script and the commands it calls, the reply.
# Identities are drawn from KEYS, uniformly or by a Zipf law, by a seeded
# generator, and the clock is simulated (decisions RATE per second), so a
# run makes exactly the same calls whatever the machine's speed. Counts
# still move by about 2% between runs: Redis's own timer (serverCron: expiry
# cycles, rehashing) runs by the wall clock, so more often per call when
# valgrind runs slower; compare scripts in runs made side by side. With the defaults the counted
# decisions find what the middle of a 220,000-request run over 100,000
# identities finds (a run of benches/side_by_side.sh): most identities seen
# once or twice before, some buckets new, none leaving the window. Every
# call is one decision (none shares a call with another), except in the
# batch scenarios.
#
# Usage: benches/redis_instructions.sh [SCENARIO...]
#   sliding    Sluice's decide.lua, one sliding-window limit in 6 s buckets
#              (the default's: a minute in 6 s buckets), far from full, with
#              the arguments the store sends for one descriptor; the window
#              is an hour, so that no HASH expires in the minutes a run under
#              valgrind takes (the operations per call are the default's);
#              `now` is passed (Redis TIME, the default time source, adds
#              one call: see BENCHMARKS.md)
#   fixed      the same with a fixed window
#   bucket     the same with a token bucket (burst = limit, the default)
#   log        the same with a sliding log of 100 an hour: a log keeps at
#              most its limit's entries and costs more per entry kept, so
#              its limit is one a log is configured with; with the
#              defaults an identity's log holds its earlier decisions, 1.2
#              on average, so this is a short log's cost
#   concurrency  the same with a concurrency limit (a log of slots leased
#              for an hour, never released), far from full
#   batch      the store's batch.lua: the sliding window's decisions that
#              one connection has in flight (CLIENTS' pipeline) in one
#              call, whatever their identities, as coalesce.rs sends them
#   fixed-batch, bucket-batch  the same for the fixed window and the token
#              bucket (the sliding log and concurrency are never batched)
#   function   benches/decide_function_prototype.py: the sliding window's
#              decide.lua as a Redis Functions library (FCALL), so that the
#              algorithms' functions are built once rather than on every
#              call; a prototype the store does not run
#   incumbent  envoyproxy/ratelimit's per-descriptor pattern: INCRBY key 1
#              and EXPIRE key 3600, pipelined together
#   (default: sliding incumbent)
#   DECIDE     directory of decide.lua's parts (default src/store/redis/decide;
#              another checkout's, to compare two scripts)
#   KEYS       distinct identities (default 100000)
#   ZIPF       Zipf exponent; unset: uniform (default)
#   WARMUP     decisions before counting (default 120000)
#   CALLS      decisions counted (default 10000)
#   RATE       simulated decisions per second (default 27500)
#   PROFILES   a directory to keep callgrind's files and the scripts in
#              (callgrind_annotate --inclusive=yes FILE shows where the
#              instructions went); by default they are removed
#   CLIENTS    "connections pipeline" (default "4 8": four connections each
#              carrying eight decisions at a time, as a service's few
#              multiplexed connections do under load)
#   SERVER     the server binary to count (default redis-server; e.g. a
#              valkey-server, driven by the same redis-cli)
#   CPU        set (CPU=1): no valgrind; the server's CPU time (user +
#              system, from /proc/PID/stat) over the CALLS decisions
#              instead of instructions, and the 1-minute load average
#              before and after them. CPU time moves with the machine's
#              load, instructions do not.
#
# Needs redis-server (or SERVER), redis-cli, valgrind (not with CPU),
# python3, rustc.
set -euo pipefail
cd "$(dirname "$0")/.."

decide=${DECIDE:-src/store/redis/decide}
keys=${KEYS:-100000}
warmup=${WARMUP:-120000}
calls=${CALLS:-10000}
rate=${RATE:-27500}
read -r conns pipeline <<<"${CLIENTS:-4 8}"
zipf=()
[ -n "${ZIPF:-}" ] && zipf=(--zipf "$ZIPF")
scenarios=("$@")
[ ${#scenarios[@]} -gt 0 ] || scenarios=(sliding incumbent)

server=${SERVER:-redis-server}
tools=("$server" redis-cli python3 rustc)
[ -n "${CPU:-}" ] || tools+=(valgrind callgrind_control)
for tool in "${tools[@]}"; do
  command -v "$tool" >/dev/null || { echo "needs $tool" >&2; exit 1; }
done

work=$(mktemp -d)
vpid=
cleanup() {
  [ -n "$vpid" ] && kill "$vpid" 2>/dev/null && wait "$vpid" 2>/dev/null
  if [ -n "${PROFILES:-}" ]; then
    mkdir -p "$PROFILES" && cp "$work"/callgrind.out.* "$work"/*.lua "$PROFILES"/ 2>/dev/null || true
  fi
  rm -rf "$work"
}
trap cleanup EXIT

# decide.lua as build.rs assembles it: the parts in DECIDE_PARTS's order,
# their records' names numbered by build/lua.rs (built here as a filter; a
# script without names goes through unchanged).
rustc --edition 2024 -O build/lua_filter.rs -o "$work/lua_filter"
parts=$(sed -n '/^const DECIDE_PARTS/,/\];/p' build.rs | grep -o '"[a-z_]*"' | tr -d '"')
for part in $parts; do
  printf -- '-- src/store/redis/decide/%s.lua\n' "$part"
  cat "$decide/$part.lua"
  echo
done | "$work/lua_filter" >"$work/decide.lua"
# batch.lua as build.rs assembles it: prelude.lua, clock.lua, then
# decide/batch.lua with the algorithms it decides where its marker is.
{
  cat "$decide/prelude.lua" "$decide/clock.lua"
  echo
  python3 - "$decide" <<'PY'
import sys
d = sys.argv[1]
parts = "".join(open(f"{d}/{n}.lua").read() + "\n" for n in ("sliding_window", "fixed_window", "token_bucket"))
print(open(f"{d}/batch.lua").read().replace("-- @@ algorithms @@\n", parts, 1))
PY
} | "$work/lua_filter" >"$work/batch.lua"

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

# Instructions counted since the last dump (a dump zeroes the counts).
instructions() {
  callgrind_control --dump "$vpid" >/dev/null 2>&1
  local last
  last=$(ls -t "$work"/callgrind.out.* | head -1)
  awk '/^totals:/ {print $2}' "$last"
}

# CPU: clock ticks of user + system CPU of the server so far, and the
# 1-minute load average.
ticks() { awk '{print $14 + $15}' "/proc/$vpid/stat"; }
loadavg() { cut -d' ' -f1 /proc/loadavg; }

if [ -n "${CPU:-}" ]; then
  printf '%-12s %14s %20s %20s %12s  %s\n' scenario "CPU µs/decision" "decisions/s per core" \
    "commands/decision" "load avg" "commands per decision (a script's inner ones)"
else
  printf '%-12s %18s %20s  %s\n' scenario instr/decision "commands/decision" "commands per decision (a script's inner ones)"
fi
for scenario in "${scenarios[@]}"; do
  port=$(free_port)
  server_cmd=("$server" --port "$port" --bind 127.0.0.1 --save '' --appendonly no --dir "$work")
  if [ -n "${CPU:-}" ]; then
    "${server_cmd[@]}" >"$work/server.log" 2>&1 &
  else
    valgrind --tool=callgrind --instr-atstart=no --callgrind-out-file="$work/callgrind.out.%p" \
      "${server_cmd[@]}" >"$work/valgrind.log" 2>&1 &
  fi
  vpid=$!
  until redis-cli -p "$port" ping >/dev/null 2>&1; do sleep 0.2; done
  case "$scenario" in
    sliding | fixed | bucket | log | concurrency)
      pattern=("$scenario" "$(redis-cli -p "$port" script load "$(cat "$work/decide.lua")")")
      ;;
    batch | fixed-batch | bucket-batch)
      pattern=("$scenario" "$(redis-cli -p "$port" script load "$(cat "$work/batch.lua")")")
      ;;
    function)
      # The Functions prototype: decide.lua as a library.
      python3 benches/decide_function_prototype.py <"$work/decide.lua" >"$work/function.lua"
      pattern=(function "$(redis-cli -p "$port" function load "$(cat "$work/function.lua")")")
      ;;
    incumbent) pattern=(incumbent) ;;
    *) echo "unknown scenario $scenario" >&2; exit 1 ;;
  esac
  load() {
    python3 benches/redis_load.py "$port" "${pattern[@]}" --first "$1" --count "$2" --keys "$keys" \
      "${zipf[@]}" --rate "$rate" --connections "$conns" --pipeline "$pipeline"
  }
  load 0 "$warmup"
  if [ -n "${CPU:-}" ]; then
    redis-cli -p "$port" config resetstat >/dev/null
    load_before=$(loadavg) ticks_before=$(ticks)
    load "$warmup" "$calls"
    total=$(($(ticks) - ticks_before)) load_after=$(loadavg)
  else
    callgrind_control --instr=on "$vpid" >/dev/null 2>&1
    instructions >/dev/null
    redis-cli -p "$port" config resetstat >/dev/null
    load "$warmup" "$calls"
    total=$(instructions)
  fi
  stats=$(redis-cli -p "$port" info commandstats | tr -d '\r')
  redis-cli -p "$port" shutdown nosave >/dev/null 2>&1 || true
  wait "$vpid" 2>/dev/null || true
  vpid=
  python3 - "$scenario" "$total" "$calls" "${CPU:+$(getconf CLK_TCK) $load_before $load_after}" <<PY
import re, sys
scenario, total, calls, cpu = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4].split()
inner, top = {}, 0
for m in re.finditer(r'cmdstat_(\w+):calls=(\d+)', """$stats"""):
    name, n = m[1], int(m[2])
    if name in ('config', 'info', 'ping', 'shutdown', 'function', 'script'):
        continue
    if name in ('evalsha', 'eval', 'fcall'):
        top += n
    else:
        inner[name] = n
# Commands a script calls are counted by Redis too.
per = ", ".join(f"{k} {v / calls:.2f}" for k, v in sorted(inner.items()))
commands = (top + sum(inner.values())) / calls
if cpu:
    us = total * 1e6 / int(cpu[0]) / calls
    rate = f"{1e6 / us:20,.0f}" if us else f"{'(under a tick)':>20s}"
    load = f"{cpu[1]}-{cpu[2]}"
    print(f"{scenario:12s} {us:15.2f} {rate} {commands:20.2f} {load:>12s}  {per}")
else:
    print(f"{scenario:12s} {total / calls:18,.0f} {commands:20.2f}  {per}")
PY
done
