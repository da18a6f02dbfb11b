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
Then the runs, packed in one string of little-endian doubles: per run its
limit (1 for the first listed, ...), n, and the n requests' weights. (Three
arguments a request cost Redis a string to make and intern and a slot of
ARGV to fill, and this script a number to parse: struct.unpack makes them
numbers at once, in one table; a double with less work than an 8-byte
integer.) Last, the struct format of the values it may pack for runs it
decides, '<' and a 'd' per value (two more per run than the runs have),
whose start is the runs' format (Lua's
string.rep makes such a string a byte at a time; Redis takes an argument
with a copy).

Each run is decided as decide.lua decides one coalesced call: each request
in turn, as if every earlier admitted one were counted (what separate calls
in that order would decide), all counted at once, one read and one write
of the key. Runs follow each other: a run reads what the earlier ones
wrote.

Reply: one string of little-endian doubles (one value for Redis to send
and for the caller to parse, where a reply array costs the caller's RESP
parser about 900 instructions a value): per run, in order, either of
- a quick run's (the sliding window's usual run, see the loop at the end):
  its markers as read, six doubles whose first (the hits held) is never
  negative, all 0 when the HASH has none. The run's answers follow from
  them alone (the caller decides it again, as the memory store would:
  what the script would have packed cost Redis a tenth of a decision's
  instructions, callgrind, see the benchmarks log);
- any other run's: -1 - used (before the run), reset, full, slot (after
  it, as decide.lua's), then per request 1 if it was over (not admitted),
  0 if counted;
then now (the call's clock, which the caller may not know).

Cost: what depends only on a limit and now (its numbers, the prefix and
names of its fields, the state's constants) is made once per limit, not per
run. A sliding window's usual run (the default's) takes the quick path,
written in locals (see the loop at the end); any other run takes over the
records of its limit's run before (an algorithm's 'load' sets every value
of its state that depends on the key). A table's array part is sized when
it is made (a slot past it costs a hash insert and a rehash: callgrind, see
BENCHMARKS.md).
]]


local algs = ARGV[2]
local uses_sliding = algs:find('0', 1, true) ~= nil
local uses_fixed = algs:find('1', 1, true) ~= nil
local uses_bucket = algs:find('2', 1, true) ~= nil
-- @@ algorithms @@

--[[ layout quick: what the runs of one sliding-window limit share on the
  quick path (see the loop below), made once a call and taken into locals
  in this order
  Q_MARKS       the name of its markers' field "m"
  Q_CUR_NAME    of the bucket of now
  Q_OLDEST      the bucket at the window's start
  Q_CUR         the bucket of now
  Q_PRECISION   P
  Q_REQUESTS    the limit's requests
  Q_INSIDE      the ms of bucket Q_OLDEST still inside the window
  Q_UNTIL       until when a HASH whose newest bucket is Q_CUR must live
  Q_LIVES       until when it lives once its expiry moves for that
                (clock.lua)
  Q_X           and that time's text, for "x"
  Q_EXPIRE      the command that moves it there
  Q_TTL         and its argument
]]

-- The limits, by the number the runs name them with, each one's
-- algorithm, and a sliding window's quick record.
local limits, alg_of, quick, a = {}, {}, {}, 4
for j = 1, ARGV[3] + 0 do
  local code = ARGV[a + 2]
  local l = {
    [L_ITEM] = false, [L_STATE] = false, [L_REQUESTS] = ARGV[a] + 0, [L_DURATION] = ARGV[a + 1] + 0,
    [L_ARG] = a,
  }
  limits[j] = l
  alg_of[l] = code == '0' and sliding_window or code == '1' and fixed_window or token_bucket
  if code == '0' then
    local d, p, f = l[L_DURATION], ARGV[a + 3] + 0, sliding_window('prefix', ARGV[a + 1], ARGV[a + 3])
    local oldest, cur = floor((now - d) / p), floor(now / p)
    local until_ms = (cur + 1) * p + d
    local lives, x = expiry(until_ms, false)
    local command, ttl = expire_command(lives, x)
    quick[j] = {
      [Q_MARKS] = f .. 'm', [Q_CUR_NAME] = f .. fmt('%d', cur), [Q_OLDEST] = oldest, [Q_CUR] = cur,
      [Q_PRECISION] = p, [Q_REQUESTS] = l[L_REQUESTS], [Q_INSIDE] = (oldest + 1) * p - (now - d),
      [Q_UNTIL] = until_ms, [Q_LIVES] = lives, [Q_X] = x, [Q_EXPIRE] = command, [Q_TTL] = ttl,
    }
  end
  a = a + 4
end
local packed, formats = ARGV[a], ARGV[a + 1]
local runs = { struct.unpack(formats:sub(1, 1 + #packed / 8), packed) }

-- The reply's parts, in order (see the header): each run's, then now,
-- slots made at once; and the values of general runs not yet packed into
-- a part (runs of other algorithms mostly follow each other: one pack for
-- them all, with now when they come last), made with the first such run,
-- with room for every run's.
local reply, p = { unpack(KEYS, 1, #KEYS + 1) }, 1
local values, r, quick_runs = nil, 0, 0

-- The quick path's locals: the quick record of the limit whose run came
-- last (runs of one limit follow each other), and struct's two functions
-- (a global's field is two table lookups a use, a local none).
local q_in, q_marks, q_cur_name, oldest, cur, prec, requests, inside, q_until, q_lives, q_x, q_expire, q_ttl
local pack, unpack_doubles = struct.pack, struct.unpack
-- The markers' reply for a HASH without them: six zeros, an empty counter
-- (a constant of the chunk, made when Redis loads it).
local EMPTY = '\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0'

-- The quick path's counts as the HASH holds them, remembered for the call:
-- its decisions mostly write the same few (small counts), and a table
-- lookup costs a fraction of a string.format (callgrind: see the benchmarks
-- log). `text_of[n] or text(n)` is count `n` as a bucket's field holds it.
local text_of = {}
local function text(n)
  local s = fmt('%d', n)
  text_of[n] = s
  return s
end

-- Any run the quick path leaves: the algorithm's function decides it, on
-- records as decide.lua's single path makes them. `marks` is the key's
-- markers when the quick path has read them (a sliding window's, without
-- "x": they say until when the HASH lives at least, and "x" is read only
-- when that falls short).
local function general_run(key, l, p, n, r, marks)
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
  local v = marks and { false, marks } or call('HMGET', key, unpack(k, K_FIELDS, K_FIELDS - 1 + k[K_READS]))
  local loaded = alg('load', st, nil, v)
  k[K_STORED] = marks and st[SW_SEEN] or v[1]
  local used = loaded or alg('used', st, l)
  values[r + 1], values[r + 2], values[r + 3], values[r + 4] = -1 - used, 0, 0, -1
  local counted = in_turn(alg, st, l, loaded, 0, runs, p + 2, p + 1 + n, values, r + 5)
  if counted > 0 then
    local slot, until_ms = alg('add', st, l, counted)
    values[r + 4] = slot
    if until_ms > k[K_UNTIL] then
      k[K_UNTIL] = until_ms
    end
  end
  values[r + 2], values[r + 3] = alg('report', st, l)
  local at, text = expiry(k[K_UNTIL], k[K_STORED])
  local x = false
  if marks and at then
    x = call('HGET', key, 'x') -- what the markers saw falls short
    k[K_STORED] = x
    at, text = expiry(k[K_UNTIL], x)
  end
  if st[S_DIRTY] then
    alg('save', st, nil, at or x)
  end

  -- decide.lua's writes (see the end of driver.lua), for this key.
  if k[K_DELETES] then
    call('HDEL', key, unpack(k[K_DELETES]))
  end
  if at then
    write(k, 'x', text)
  end
  if k[K_WRITES] > 0 then
    call('HSET', key, unpack(k, K_FIELDS + k[K_READS], K_FIELDS - 1 + k[K_READS] + k[K_WRITES]))
  end
  if at then
    local command, arg = expire_command(at, text)
    call(command, key, arg)
  end
end

-- The quick path: a sliding window's usual run (no bucket has left the
-- window since the counter's last write, the clock is not behind its
-- newest bucket) decided in locals, without the key and state records,
-- the algorithm's calls and the queue of writes, which cost a quarter of a
-- batched decision's instructions (callgrind: see BENCHMARKS.md). It is
-- sliding_window.lua's 'load', in_turn and 'add', then the writes of
-- general_run, operation for operation; its reply is the markers it read,
-- from which the caller reports (wire.rs). tests/redis/batch_model.rs holds
-- both paths to the memory store's answers.
for i = 1, #KEYS do
  local key, j, n = KEYS[i], runs[p], runs[p + 1]
  local q, v = quick[j], nil
  if q then
    if q ~= q_in then
      q_in = q
      q_marks, q_cur_name, oldest, cur, prec, requests, inside, q_until, q_lives, q_x, q_expire, q_ttl = unpack(q)
    end
    v = call('HGET', key, q_marks)
    local t, o, high, low_hits, high_hits, seen = 0, cur, cur, 0, 0, 0
    if v then
      t, o, high, low_hits, high_hits, seen = unpack_doubles(MARKERS, v)
      if t == 0 then
        o, high, low_hits, high_hits = cur, cur, 0, 0 -- refunded to nothing: empty
      end
    end
    if o >= oldest and high <= cur then
      -- 'load': what the window holds.
      local used = t
      if t > 0 and o == oldest and inside < prec then
        used = t - low_hits + ceil(low_hits * inside / prec)
      end
      -- in_turn, then 'add' into the bucket of now.
      local counted = 0
      for m = p + 2, p + 1 + n do
        local h = runs[m]
        if used + counted + h <= requests then
          counted = counted + h
        end
      end
      local moves, count, marks = false, nil, nil
      local hits = counted
      if hits > MAX_HITS - t then
        hits = MAX_HITS - t -- (math.min is a C call: this is a compare)
      end
      if hits > 0 then
        local c = (high == cur and high_hits or 0) + hits
        if (t == 0 or high ~= cur) and q_until + 1000 > seen then
          -- A new newest bucket the HASH may not live past (expiry's test
          -- on what the markers saw): "x" says.
          local x = call('HGET', key, 'x')
          if q_until + 1000 > (x or 0) + 0 then
            moves, seen = true, q_lives
          else
            seen = x
          end
        end
        if o == cur then
          low_hits = c -- one bucket is both
        end
        t = t + hits
        count, marks = text_of[c] or text(c), pack(MARKERS, t, o, cur, low_hits, c, seen)
      end
      -- The reply: the markers as read (the caller decides the run again
      -- from them, as the memory store would).
      if r > 0 then
        reply[i - 1] = pack(formats:sub(1, 1 + r), unpack(values, 1, r))
        r = 0
      end
      reply[i], quick_runs = v or EMPTY, quick_runs + 1
      -- The writes.
      if moves then
        call('HSET', key, q_cur_name, count, q_marks, marks, 'x', q_x)
        call(q_expire, key, q_ttl)
      elseif count then
        call('HSET', key, q_cur_name, count, q_marks, marks)
      end
      v = nil
    end
  end
  if v or not q then
    values = values or { unpack(KEYS, 1, #packed / 8 + 2 * #KEYS) }
    general_run(key, limits[j], p, n, r, v)
    r, reply[i] = r + 4 + n, ''
  end
  p = p + 2 + n
end
if r == 0 then
  reply[#KEYS + 1] = pack('<d', now)
else
  values[r + 1] = now
  reply[#KEYS + 1] = pack(formats:sub(1, 1 + r) .. 'd', unpack(values, 1, r + 1))
  if quick_runs == 0 then
    return reply[#KEYS + 1] -- the others are empty
  end
end
return table.concat(reply)
