--[[ Sluice: check every limit of one request and, if it is admitted, count
every one of them — atomically, in one call. The arithmetic is the same as
src/limiter/algorithm/*.rs, operation for operation (Lua numbers are IEEE
doubles like Rust's f64), so the Redis and memory stores agree to the hit.

Assembled at build time (build.rs) from src/store/redis/decide/, in this
order: prelude.lua (this contract, the clock, the records), request.lua (ARGV parsed: items, limits, which algorithms),
sliding_window.lua, fixed_window.lua, token_bucket.lua, sliding_log.lua (one
algorithm each, mirroring src/limiter/algorithm/; concurrency is a sliding
log there as here), driver.lua (the reads, the check of every limit, the
admission rule, the counting, the reply, the writes). Each part's own header
says what it reads and writes. To load it by hand:
  cat src/store/redis/decide/{prelude,request,sliding_window,fixed_window,token_bucket,sliding_log,driver}.lua

KEYS[i]   the HASH of the i-th limited identity of the request.

ARGV[1]   now, in ms since the Unix epoch; "" reads Redis TIME instead, so
          every replica uses one clock.
ARGV[2]   "all":  every item of the request is in this call; admission is
                  decided here (no enforcing item over, and not every quota
                  item over).
          "part": Redis Cluster, the request spans several slots; this part
                  is counted when none of its enforcing items is over, and
                  the caller decides overall (and refunds what it must).
Then, per item, in KEYS order: role (0 enforce, 1 shadow, 2 quota; plus 4
when the item counts always, even when the request or the item is refused;
3 for a refund, whose hits are given back), hits, number of limits; and per
limit: requests, duration_ms, algorithm, param:
  0 sliding_window  param = precision_ms
  1 fixed_window    param = 0
  2 token_bucket    param = burst
  3 sliding_log     param = 0; 1 for concurrency (a log of leased slots,
                    window = lease, fields "D:c:…")
A whole call of one enforcing item (role 0) with one limit may carry more
requests of that key and limit, coalesced by the caller (see
src/store/redis/coalesce.rs): after the limit, one weight per request.
Each is decided in turn after the first, as if every earlier admitted one
were counted, which is what separate calls in that order would decide.

Reply: { applied (1|0), then per limit:
                  used, pending, over, reset, full, slot
          and, for "part" only, reset_before, full_before }
  used     how much of the limit is in use before this request (after it,
           for a refund, whose pending is then 0)
  pending  hits of earlier limits of this request on the same counter
  over     1 if this limit's hits (with the pending ones) do not fit
  reset    ms until headroom next grows, after this request
  full     ms from now during which no hit at all can fit (0 if one can),
           after this request: what a local cache may answer without
           asking Redis
  slot     where the hits went (bucket, window, or log time; -1 if none),
           for refund.lua
  *_before the same two before this request: the caller of a refunded
           part reports them. A whole request is never refunded, so its
           reply leaves them out (every value costs Redis and the caller).
        then, per coalesced request, 1 if it was over (not admitted), 0 if
        it was counted; the first request's reset, full and slot are those
        after all of them (what is stored when the reply leaves).

Fields of a HASH: each algorithm's file lists its own, under a prefix
"D:…:" (D = duration_ms) that keeps every counter of the identity apart, and
  "x"   when the HASH expires (ms, by the script's clock). The TTL is
        moved only when a limit needs it longer, never on every hit, and
        then half as far again (see the writes at the end of driver.lua).

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

-- Records are arrays, their slots listed where each is made: a table's
-- hash part costs about three times its array part to fill and to collect,
-- and the records are made anew on every call.
--   key    { name, #fields, #writes, deletes (or false), expiry wanted
--            (ms), expiry stored ("x", as read), first item, then the
--            field names its HMGET reads (from 8), then the field, value
--            pairs its HSET writes (after the names: every name is planned
--            before anything is written) }
--   item   { key record, role code (ARGV, one digit), hits, over }
--   limit  { item, state, requests, duration_ms, where it starts in ARGV }
--          (the driver's single path makes no item, and its one limit has
--          neither item nor state: only the driver reads those)
--   state  { algorithm, key record, where its fields start in the key's
--            HMGET, used, pending, first limit on it, field prefix, then
--            the algorithm's own slots (from 8; see its file) }
-- `used` is what 'load' answered; `pending` the hits of the request's
-- earlier limits on the same counter.

-- What an algorithm's function is asked: alg(op, st, l, x), where `st` is
-- a state (one per distinct key and field prefix), `l` one limit of the
-- request counted on it (several limits may share a state) and `x` the
-- operation's own argument.
--   'prefix' st = duration, l = param (both as ARGV has them): the prefix of
--           the counter's fields
--   'new'   st = key record, l = the first limit counted on it, x = prefix:
--           a new state whose fields are appended to the key's HMGET (its
--           slot 3: where they start in that HMGET's reply; the names are at
--           7 + that in the key record)
--   'load'  x = that HMGET's reply: the state as stored, brought to `now`
--           (what left the window forgotten); returns what is in use, or
--           nil when that depends on the limit
--   'used'  how much of l's capacity is in use (asked when 'load' said nil)
--   'fits'  whether x hits fit l (asked when 'load' said nil; otherwise a
--           limit fits when used + x <= requests)
--   'add'   counts x hits: returns the slot (-1 when nothing counted) and
--           the time until which the HASH must live, or 0 when that has not
--           moved since the HASH's expiry ("x") last covered it
--   'give'  gives x hits back (a refund), never below empty; returns 'used'
--   'report' ms until headroom next grows, and ms during which no hit can
--           fit (exact or shorter)
--   'save'  writes what was kept back until every operation was done

local now
if ARGV[1] == '' then
  local t = call('TIME')
  now = t[1] * 1000 + floor(t[2] / 1000)
else
  now = ARGV[1] + 0
end
local whole = ARGV[2] == 'all'

-- Queues `field = value` for the key's one HSET (values already strings).
local function write(k, field, value)
  local at = 7 + k[2] + k[3]
  k[at + 1], k[at + 2] = field, value
  k[3] = k[3] + 2
end
