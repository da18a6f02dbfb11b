--[[ Sluice: check every limit of one request and, if it is admitted, count
every one of them — atomically, in one call. The arithmetic is the same as
src/limiter/algorithm/*.rs, operation for operation (Lua numbers are IEEE
doubles like Rust's f64), so the Redis and memory stores agree to the hit.

Assembled at build time (build.rs) from src/store/redis/decide/, in this
order: prelude.lua (what decide.lua and refund.lua share: the records, the
operations of an algorithm, the arithmetic), clock.lua (now, read once),
request.lua (the contract: KEYS and ARGV, the reply; ARGV parsed into
items, limits, which algorithms), sliding_window.lua, fixed_window.lua, token_bucket.lua,
sliding_log.lua (one algorithm each, mirroring src/limiter/algorithm/;
concurrency is a sliding log there as here), driver.lua (the reads, the
check of every limit, the admission rule, the counting, the reply, the
writes). Each part's own header says what it reads and writes. refund.lua
is built from prelude.lua, the same algorithms and its own driver.

Records are named in the source (`st[S_KEY]`, `{ [S_ALG] = f, … }`, each
layout declared once in a `layout` comment) and numbered by build.rs
(build/lua.rs), so the script Redis runs indexes arrays by number; a
generated script shows every layout with its numbers. To see it, build and
read decide.lua in the build's OUT_DIR, or:
  rustc --edition 2024 build/lua_filter.rs -o /tmp/lua &&
    cat src/store/redis/decide/{prelude,clock,request,sliding_window,fixed_window,token_bucket,sliding_log,driver}.lua | /tmp/lua

Fields of a HASH: each algorithm's file lists its own, under a prefix
"D:…:" (D = duration_ms) that keeps every counter of the identity apart, and
  "x"   when the HASH expires (ms, by the script's clock). The TTL is
        moved only when a limit needs it longer, never on every hit, and
        then half as far again (see `expiry` in clock.lua).

Cost: one HMGET and at most one HDEL, one HSET and one PEXPIRE(AT) per key; a
sliding window adds one bounded HMGET when buckets leave its window (once
per bucket), and a sliding log parses at most `requests` entries. Never
proportional to the request rate.

Why it is written as it is: Redis runs this whole chunk on every call, and
what it costs is mostly Lua's own work, not the commands (callgrind, see
BENCHMARKS.md): every `local function` is a new closure on every call, every
local it captures a new upvalue, every table a new allocation for the
collector, a hash part about three times an array part of the same size, and
number <-> string conversions cost more than the arithmetic. Hence: each
algorithm is one function answering every operation (`op`, below), built
only when the request names it; records are arrays; the driver is
straight-line code, and a request of one key with one limit (the default's
shape) makes no item and limit records and runs no loop over them (the
driver's single path: about 15% of the default call's instructions);
integers are formatted with string.format('%d') (half the cost of Lua's own
number-to-string; a field name is `prefix .. fmt('%d', n)`, cheaper than
fmt('%s%d', prefix, n)) and parsed once each, by arithmetic (`s + 0`;
`(s or 0) + 0` for a field that may be missing, i.e. false): Lua's tonumber
parses its argument twice (lua_isnumber, then lua_tonumber), and costs about
1,700 instructions against 700. Every string parsed is one this script or
Rust wrote, so it is a number.
]]

local floor, ceil, max, min = math.floor, math.ceil, math.max, math.min
local call, fmt = redis.call, string.format

-- A counter holds at most 2^53 - 1 hits, and a token bucket's debt stops
-- 2^52 ticks ahead of now (Rust's MAX_HITS and MAX_BUCKET_TICKS): what would
-- pass is not counted, so every number here stays an exact double.
local MAX_HITS, MAX_AHEAD = 9007199254740991, 4503599627370496

-- Records are arrays (a table's hash part costs about three times its
-- array part to fill and to collect, and the records are made anew on
-- every call), their slots named here and numbered by build.rs.

--[[ layout key: one per distinct HASH of the request
  K_NAME      the key
  K_READS     how many field names its HMGET reads (from K_FIELDS)
  K_WRITES    how many values its HSET writes (field, value, …: after the
              names; every name is planned before anything is written)
  K_DELETES   the fields its HDEL deletes (a table), or false
  K_UNTIL     until when the HASH must live (ms), 0 if that has not moved
  K_STORED    until when it lives ("x", as read)
  K_FIRST     the first item on it (its HMGET and writes run once, there)
  K_FIELDS    the first field name it reads: "x"; the others follow,
              then the names and values its HSET writes. A key record of
              one state is made with 16 slots after this one, room for both
              (a slot past a table's array part costs a hash insert and a
              rehash)
]]

--[[ layout item: one per KEYS entry
  I_KEY       its key record
  I_ROLE      its role code (ARGV, one digit, compared as a string)
  I_HITS      its hits
  I_OVER      whether one of its limits does not fit
]]

--[[ layout limit: one per limit of an item (the driver's single path makes
  one with neither item nor state, and without the slots after L_ARG: only
  the driver reads those, and no single-path item has a penalty box)
  L_ITEM      its item
  L_STATE     the state it is counted on
  L_REQUESTS  its requests
  L_DURATION  its duration (ms)
  L_ARG       where it starts in ARGV (its requests)
  L_PENALTY   where its penalty box's arguments start in ARGV, or false
  L_BLOCK     its counter's block record (a limit with a penalty box), or
              false
]]

--[[ layout block: one per state counted by a limit with a penalty box: the
  fields "<prefix>pu", "pc", "pf" of its key (Rust's limiter::Block)
  B_STATE     the state
  B_AT        how many names of the key's HMGET come before its own
  B_UNTIL     blocked before this time (ms)
  B_COUNT     offences of the streak
  B_FORGET    the streak is forgotten from this time (ms)
]]

--[[ layout state: one per distinct key and field prefix; each algorithm's
  own slots follow (see its file)
  S_ALG       the algorithm's function
  S_KEY       the key record
  S_AT        how many names of the key's HMGET come before its own (its
              first is at S_AT + 1 in the HMGET's reply, at K_FIELDS + S_AT
              in the key record)
  S_USED      what 'load' answered
  S_PENDING   the hits of the request's earlier limits on the same counter
  S_FIRST     the first limit counted on it
  S_PREFIX    its fields' prefix
  S_DIRTY     whether 'save' has something to write (what the operations
              kept back until every one was done)
]]

-- What an algorithm's function is asked: alg(op, st, l, x), where `st` is
-- a state (one per distinct key and field prefix), `l` one limit of the
-- request counted on it (several limits may share a state) and `x` the
-- operation's own argument.
--   'prefix' st = duration, l = param (both as ARGV has them): the prefix of
--           the counter's fields
--   'new'   st = key record, l = the first limit counted on it, x = prefix:
--           a new state whose fields are appended to the key's HMGET
--           (S_AT: how many names come before them)
--   'load'  x = that HMGET's reply: the state as stored, brought to `now`
--           (what left the window forgotten); returns what is in use, or
--           nil when that depends on the limit. It sets every value of the
--           state that depends on the key, so that batch.lua's next run of
--           the same limit at the same now loads another key into it
--   'used'  how much of l's capacity is in use (asked when 'load' said nil)
--   'fits'  whether x hits fit l (asked when 'load' said nil; otherwise a
--           limit fits when used + x <= requests)
--   'add'   counts x hits: returns the slot (-1 when nothing counted) and
--           the time until which the HASH must live, or 0 when that has not
--           moved since the HASH's expiry ("x") last covered it
--   'give'  gives x hits back (a refund), never below empty; returns 'used'
--   'report' ms until headroom next grows, and ms during which no hit can
--           fit (exact or shorter)
--   'save'  writes what was kept back until every operation was done;
--           x = until when the HASH lives, where the call knows it
--           without parsing "x" (where it moves the expiry, or "x" as
--           batch.lua read it for that), or nil: a sliding window's markers
--           keep it, or else what they held
--   'undo'  refund.lua's: st = the key's name, l = the limit's place in
--           refund.lua's ARGV, x = prefix: takes back the hits decide.lua
--           counted in the slot it answered, as if they had never been
--           counted; returns 1 if there was something to take back, else 0

-- Queues `field = value` for the key's one HSET (values already strings).
local function write(k, field, value)
  local at = K_FIELDS - 1 + k[K_READS] + k[K_WRITES]
  k[at + 1], k[at + 2] = field, value
  k[K_WRITES] = k[K_WRITES] + 2
end

-- Requests of one counter decided in turn (decide.lua's coalesced ones,
-- a run of batch.lua), as if every earlier admitted one were counted: what
-- separate calls in that order would decide. Their weights are args[from]
-- to args[to] (ARGV's strings, or the numbers batch.lua unpacked);
-- `counted` is what is counted before them; `used` what 'load' answered,
-- or false (each then asks 'fits'). reply[at + i - from] is 0 for a request
-- that fits (and counts), 1 for one that does not. Returns the hits
-- counted, those before them included.
local function in_turn(alg, st, l, used, counted, args, from, to, reply, at)
  local requests = l[L_REQUESTS]
  for i = from, to do
    local h = args[i] + 0
    local fits
    if used then
      fits = used + counted + h <= requests
    else
      fits = alg('fits', st, l, counted + h)
    end
    if fits then
      counted = counted + h
    end
    reply[at + i - from] = fits and 0 or 1
  end
  return counted
end

-- Exact floor division of non-negative integers below 2^53: a double
-- quotient can round up onto the next integer, never down past it.
local function idiv(a, b)
  local q = floor(a / b)
  if q * b > a then
    q = q - 1
  elseif (q + 1) * b <= a then
    q = q + 1
  end
  return q
end
