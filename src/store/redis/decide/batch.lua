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
ARGV[3]   how many distinct limits the runs count on; then each limit once,
          as decide.lua takes a limit (requests, duration_ms, algorithm,
          param).
Last, the runs, packed in one string of little-endian 8-byte integers: per
run its limit (1 for the first listed, ...), n, and the n requests' weights.
(Three arguments a request cost Redis a string to make and intern and a
slot of ARGV to fill, and this script a number to parse: struct.unpack
makes them numbers at once, in one table.)

Each run is decided as decide.lua decides one coalesced call: each request
in turn, as if every earlier admitted one were counted (what separate calls
in that order would decide), all counted at once, one read and one write
of the key. Runs follow each other: a run reads what the earlier ones
wrote.

Reply, per run: used (before the run), reset, full, slot (after it, as
decide.lua's), then per request 1 if it was over (not admitted), 0 if
counted; all packed in one string as little-endian 8-byte integers
(struct.pack: one value for Redis to send and for the caller to parse
instead of five a request, each of which cost the caller's RESP parser
about 900 instructions; and less for Redis than a reply array).

Cost: what depends only on a limit and now (its numbers, the prefix and
names of its fields, the state's constants) is made once per limit, not per
run: a run takes over the records of its limit's run before (an
algorithm's 'load' sets every value of its state that depends on the key).
A table's array part is sized when it is made (a slot past it costs a hash
insert and a rehash: callgrind, see BENCHMARKS.md).
]]


local algs = ARGV[2]
local uses_sliding = algs:find('0', 1, true) ~= nil
local uses_fixed = algs:find('1', 1, true) ~= nil
local uses_bucket = algs:find('2', 1, true) ~= nil
-- @@ algorithms @@

-- The limits, by the number the runs name them with, and each one's
-- algorithm.
local limits, alg_of, a = {}, {}, 4
for j = 1, ARGV[3] + 0 do
  local code = ARGV[a + 2]
  local l = {
    [L_ITEM] = false, [L_STATE] = false, [L_REQUESTS] = ARGV[a] + 0, [L_DURATION] = ARGV[a + 1] + 0,
    [L_ARG] = a,
  }
  limits[j] = l
  alg_of[l] = code == '0' and sliding_window or code == '1' and fixed_window or token_bucket
  a = a + 4
end
local packed = ARGV[a]
local runs = { struct.unpack('<' .. string.rep('i8', #packed / 8), packed) }

-- Runs take 2 values and answer 4 besides one per request: the reply has
-- #packed / 8 + 2 * #KEYS values, its slots made at once.
local size = #packed / 8 + 2 * #KEYS
local reply, r, p = { unpack(KEYS, 1, size) }, 0, 1
for i = 1, #KEYS do
  local key, l, n = KEYS[i], limits[runs[p]], runs[p + 1]
  local alg, before, k, st = alg_of[l], l[L_STATE], nil, nil
  -- Records as decide.lua's single path makes them (see prelude.lua: 16
  -- slots after K_FIELDS).
  if before then
    -- The records of the limit's run before, for this key: its fields have
    -- the same names.
    k = before[S_KEY]
    k[K_NAME], k[K_WRITES], k[K_DELETES], k[K_UNTIL], k[K_STORED] = key, 0, false, 0, 0
    st = before
  else
    k = {
      [K_NAME] = key, [K_READS] = 1, [K_WRITES] = 0, [K_DELETES] = false, [K_UNTIL] = 0,
      [K_STORED] = 0, [K_FIRST] = 1, [K_FIELDS] = 'x',
      false, false, false, false, false, false, false, false, false, false, false, false, false, false, false, false,
    }
    st = alg('new', k, l, alg('prefix', ARGV[l[L_ARG] + 1], ARGV[l[L_ARG] + 3]))
  end
  l[L_STATE] = st
  local v = call('HMGET', key, unpack(k, K_FIELDS, K_FIELDS - 1 + k[K_READS]))
  k[K_STORED] = v[1]
  local loaded = alg('load', st, nil, v)
  local used = loaded or alg('used', st, l)
  reply[r + 1], reply[r + 2], reply[r + 3], reply[r + 4] = used, 0, 0, -1
  local counted = in_turn(alg, st, l, loaded, 0, runs, p + 2, p + 1 + n, reply, r + 5)
  if counted > 0 then
    local slot, until_ms = alg('add', st, l, counted)
    reply[r + 4] = slot
    if until_ms > k[K_UNTIL] then
      k[K_UNTIL] = until_ms
    end
  end
  reply[r + 2], reply[r + 3] = alg('report', st, l)

  -- decide.lua's writes (see the end of driver.lua), for this key.
  if k[K_DELETES] then
    call('HDEL', key, unpack(k[K_DELETES]))
  end
  local extend = k[K_UNTIL] > 0 and k[K_UNTIL] + 1000 > (k[K_STORED] or 0) + 0
  local at, xs
  if extend then
    at = k[K_UNTIL] + 1000 + floor((k[K_UNTIL] - now) / 2)
    xs = fmt('%d', at)
    write(k, 'x', xs)
  end
  if k[K_WRITES] > 0 then
    call('HSET', key, unpack(k, K_FIELDS + k[K_READS], K_FIELDS - 1 + k[K_READS] + k[K_WRITES]))
  end
  if extend then
    if ARGV[1] == '' then
      call('PEXPIREAT', key, xs)
    else
      call('PEXPIRE', key, fmt('%d', at - now))
    end
  end
  r, p = r + 4 + n, p + 2 + n
end
return struct.pack('<' .. string.rep('i8', size), unpack(reply, 1, size))
