#!/usr/bin/env python3
"""A prototype, for benches/redis_instructions.sh only (the store never
loads it): decide.lua as a Redis Functions library (FUNCTION LOAD, then
FCALL sluice_decide), to count what running the chunk on every call costs.

A library's top level runs once, at FUNCTION LOAD; what it builds lives
on: here every algorithm's function and the prelude's helpers are built once
(at the first call, see below), and each call runs only what request.lua and
driver.lua do. The per-call values the algorithms read (now, KEYS, ARGV) become
library-level locals assigned at the start of each call (upvalues the
algorithms share), which is what a real port would do too.

Reads the assembled decide.lua (build/lua.rs's output) on stdin, writes the
library on stdout. The parts are found by the "-- src/store/redis/decide/…"
lines build.rs puts before each.
"""

import re
import sys

script = sys.stdin.read()
parts = re.split(r"^-- src/store/redis/decide/(\w+)\.lua\n", script, flags=re.M)
named = dict(zip(parts[1::2], parts[2::2]))

# The clock (clock.lua) and request.lua's per-call locals become
# assignments to the library's locals.
clock = named["clock"]
assert "local now\n" in clock
clock = clock.replace("local now\n", "")
request = named["request"]
for old, new in [
    ("local whole = ", "whole = "),
    ("local single = ", "single = "),
    ("local items, limits, nl, a = ", "items, limits, nl, a = "),
    ("local uses_sliding, uses_fixed, uses_bucket, uses_log, uses_calendar = false, false, false, false, false\n", ""),
]:
    assert old in request, old
    request = request.replace(old, new)

# Redis 7.0 gives a library's top level (run at FUNCTION LOAD) no `math`,
# `string` or `table`: the helpers and the algorithms are built at the first
# call instead, once, by build(), and kept in the library's upvalue.
out = ["#!lua name=sluice_bench\n"]
out.append("local decide\n")
out.append("local function build()\n")
out.append("local KEYS, ARGV, now, whole, single, items, limits, nl, a\n")
out.append("local uses_sliding, uses_fixed, uses_bucket, uses_log, uses_calendar = true, true, true, true, true\n")
out.append(named["prelude"])
for alg in ("sliding_window", "fixed_window", "token_bucket", "sliding_log", "calendar_window"):
    out.append(named[alg])
out.append("return function(keys, args)\nKEYS, ARGV = keys, args\n")
out.append(clock)
out.append(request)
out.append(named["driver"])
out.append("end\nend\n")
out.append("""redis.register_function('sluice_decide', function(keys, args)
  if not decide then
    decide = build()
  end
  return decide(keys, args)
end)
""")
sys.stdout.write("".join(out))
