--[[ Sluice: decide many single-limit requests in one call, whatever their
identities (src/store/redis/coalesce.rs batches the requests bound for one
Redis, or one Cluster slot, that wait while a call to it is in flight).

Assembled at build time (build.rs) as prelude.lua, then this file with
sliding_window.lua, fixed_window.lua and token_bucket.lua in place of the
marker below; the script Redis loads is `batch.lua` in OUT_DIR.

Every request here has decide.lua's single-path shape: one key, one
enforcing limit, counted only when admitted. The caller groups them in
runs, one per key and limit (requests of one counter together, in their
order); KEYS[i] is the HASH of run i.

ARGV[1]   now, as decide.lua takes it ("" reads Redis TIME).
ARGV[2]   the algorithm codes the runs use ("0", "02", ...: 0 sliding
          window, 1 fixed window, 2 token bucket), so that only their
          functions are built.
Then per run: requests, duration_ms, algorithm, param (as decide.lua
takes a limit), n, and the n requests' weights.

Each run is decided as decide.lua decides one coalesced call: each request
in turn, as if every earlier admitted one were counted (what separate calls
in that order would decide), all counted at once, one read and one write
of the key. Runs follow each other: a run reads what the earlier ones
wrote.

Reply, per run: used (before the run), reset, full, slot (after it, as
decide.lua's), then per request 1 if it was over (not admitted), 0 if
counted.
]]


local algs = ARGV[2]
local uses_sliding = algs:find('0', 1, true) ~= nil
local uses_fixed = algs:find('1', 1, true) ~= nil
local uses_bucket = algs:find('2', 1, true) ~= nil
-- @@ algorithms @@

local reply, r, a = {}, 0, 3
for i = 1, #KEYS do
  local key, code, n = KEYS[i], ARGV[a + 2], ARGV[a + 4] + 0
  local alg = code == '0' and sliding_window or code == '1' and fixed_window or token_bucket
  -- Records as decide.lua's single path makes them (see prelude.lua).
  local k = { key, 1, 0, false, 0, 0, 1, 'x', false, false, false, false, false, false, false, false, false }
  local l = { false, false, ARGV[a] + 0, ARGV[a + 1] + 0, a }
  local st = alg('new', k, l, alg('prefix', ARGV[a + 1], ARGV[a + 3]))
  local v = call('HMGET', key, unpack(k, 8, 7 + k[2]))
  k[6] = v[1]
  local loaded = alg('load', st, nil, v)
  local used = loaded or alg('used', st, l)
  reply[r + 1], reply[r + 2], reply[r + 3], reply[r + 4] = used, 0, 0, -1
  local counted = 0
  for m = 1, n do
    local h = ARGV[a + 4 + m] + 0
    local fits
    if loaded then
      fits = used + counted + h <= l[3]
    else
      fits = alg('fits', st, l, counted + h)
    end
    if fits then
      counted = counted + h
    end
    reply[r + 4 + m] = fits and 0 or 1
  end
  if counted > 0 then
    local slot, until_ms = alg('add', st, l, counted)
    reply[r + 4] = slot
    if until_ms > k[5] then
      k[5] = until_ms
    end
  end
  reply[r + 2], reply[r + 3] = alg('report', st, l)

  -- decide.lua's writes (see the end of driver.lua), for this key.
  if k[4] then
    call('HDEL', key, unpack(k[4]))
  end
  local extend = k[5] > 0 and k[5] + 1000 > (k[6] or 0) + 0
  local at, xs
  if extend then
    at = k[5] + 1000 + floor((k[5] - now) / 2)
    xs = fmt('%d', at)
    write(k, 'x', xs)
  end
  if k[3] > 0 then
    call('HSET', key, unpack(k, 8 + k[2], 7 + k[2] + k[3]))
  end
  if extend then
    if ARGV[1] == '' then
      call('PEXPIREAT', key, xs)
    else
      call('PEXPIRE', key, fmt('%d', at - now))
    end
  end
  r, a = r + 4 + n, a + 5 + n
end
return reply
