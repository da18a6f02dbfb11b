--[[ Sluice: check every limit of one request and, if it is admitted, count
every one of them — atomically, in one call. The arithmetic is the same as
src/limiter/algorithm/*.rs, operation for operation (Lua numbers are IEEE
doubles like Rust's f64), so the Redis and memory stores agree to the hit.

KEYS[i]   the HASH of the i-th limited identity of the request.

ARGV[1]   now, in ms since the Unix epoch; "" reads Redis TIME instead, so
          every replica uses one clock.
ARGV[2]   "all":  every item of the request is in this call; admission is
                  decided here (no enforcing item over, and not every quota
                  item over).
          "part": Redis Cluster, the request spans several slots; this part
                  is counted when none of its enforcing items is over, and
                  the caller decides overall (and refunds what it must).
Then, per item, in KEYS order: role (0 enforce, 1 shadow, 2 quota), hits,
number of limits; and per limit: requests, duration_ms, algorithm
(0 sliding_window, 1 fixed_window), precision_ms (0 for fixed_window).

Reply: { applied (1|0), now, then per limit: used, pending, over (1|0), reset_ms, slot }
  used     weighted hits in the window before this request
  pending  hits of earlier limits of this request on the same counter
  over     used + pending + hits > requests
  slot     the bucket or window index the hits went to (-1 if none), for refunds

Fields of a HASH, per limit (D = duration_ms, P = precision_ms):
  sliding_window  "D:P:<bucket>" hits of a non-empty bucket (bucket = time / P)
                  "D:P:t" sum of the buckets, "D:P:o" oldest bucket, "D:P:n" newest
  fixed_window    "D:f:w" window index (time / D), "D:f:c" hits in it
  "x"             when the HASH may expire (ms, script time). The TTL is moved
                  only when a limit needs it longer: once per bucket or window,
                  never on every hit.
Cost: one call does O(limits) work plus, per sliding limit, at most one step
per bucket that left the window since the previous call — bounded by the
window's bucket count, never by the request rate.
]]

local floor, ceil = math.floor, math.ceil

local now
if ARGV[1] == '' then
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000 + floor(tonumber(t[2]) / 1000)
else
  now = tonumber(ARGV[1])
end
local whole = ARGV[2] == 'all'

-- Parse the request.
local items, limits, a = {}, {}, 3
for i = 1, #KEYS do
  local item = { key = KEYS[i], role = tonumber(ARGV[a]), hits = tonumber(ARGV[a + 1]), limits = {} }
  local count = tonumber(ARGV[a + 2])
  a = a + 3
  for _ = 1, count do
    local l = {
      item = item,
      requests = tonumber(ARGV[a]),
      d = tonumber(ARGV[a + 1]),
      sliding = ARGV[a + 2] == '0',
      p = tonumber(ARGV[a + 3]),
    }
    a = a + 4
    item.limits[#item.limits + 1] = l
    limits[#limits + 1] = l
  end
  items[i] = item
end

-- The state of one counter, loaded once per call and shared by every limit
-- of the request that names the same counter.
local states = {}

local function sliding_load(key, d, p)
  local f = d .. ':' .. p .. ':'
  local s = redis.call('HMGET', key, f .. 't', f .. 'o', f .. 'n')
  local st = { f = f, t = tonumber(s[1]) or 0, o = tonumber(s[2]), n = tonumber(s[3]) }
  local oldest = floor((now - d) / p)
  if st.t > 0 and st.o < oldest then
    -- Forget buckets that left the window (at most one per bucket of it).
    for b = st.o, math.min(oldest - 1, st.n) do
      local c = redis.call('HGET', key, f .. b)
      if c then
        st.t = st.t - tonumber(c)
        redis.call('HDEL', key, f .. b)
      end
    end
    if st.t > 0 then
      for b = oldest, st.n do
        if redis.call('HEXISTS', key, f .. b) == 1 then
          st.o = b
          break
        end
      end
      redis.call('HSET', key, f .. 't', st.t, f .. 'o', st.o)
    else
      st.t, st.o, st.n = 0, nil, nil
      redis.call('HDEL', key, f .. 't', f .. 'o', f .. 'n')
    end
  end
  return st
end

local function sliding_used(key, st, d, p)
  if st.t == 0 then
    return 0
  end
  local oldest = floor((now - d) / p)
  local inside = (oldest + 1) * p - (now - d)
  if st.o == oldest and inside < p then
    local c = tonumber(redis.call('HGET', key, st.f .. st.o))
    return st.t - c + ceil(c * inside / p)
  end
  return st.t
end

local function fixed_load(key, d)
  local f = d .. ':f:'
  local s = redis.call('HMGET', key, f .. 'w', f .. 'c')
  local w = floor(now / d)
  local c = 0
  if tonumber(s[1]) == w then
    c = tonumber(s[2]) or 0
  end
  return { f = f, w = w, c = c }
end

-- Pass 1: check every limit as if every earlier limit of the request had
-- been counted (a request may name one counter twice).
local enforce_over, quota_seen, quota_all_over = false, false, true
for _, item in ipairs(items) do
  local item_over = false
  for _, l in ipairs(item.limits) do
    local id = item.key .. '\n' .. l.d .. ':' .. (l.sliding and l.p or 'f')
    local st = states[id]
    if not st then
      if l.sliding then
        st = sliding_load(item.key, l.d, l.p)
      else
        st = fixed_load(item.key, l.d)
      end
      st.pending = 0
      if l.sliding then
        st.used = sliding_used(item.key, st, l.d, l.p)
      else
        st.used = st.c
      end
      states[id] = st
    end
    l.st = st
    l.pending = st.pending
    l.over = st.used + st.pending + item.hits > l.requests
    st.pending = st.pending + item.hits
    item_over = item_over or l.over
  end
  if item.role == 0 then
    enforce_over = enforce_over or item_over
  elseif item.role == 2 then
    quota_seen = true
    quota_all_over = quota_all_over and item_over
  end
end
local applied = not enforce_over
if whole and quota_seen and quota_all_over then
  applied = false
end

-- Pass 2: count everything, or nothing.
local expiry = {}
local reply = { applied and 1 or 0, now }
for _, l in ipairs(limits) do
  local st, item, slot = l.st, l.item, -1
  local key, hits = item.key, item.hits
  if applied and hits > 0 then
    if l.sliding then
      local b = floor(now / l.p)
      if st.t > 0 and st.n >= b then
        b = st.n -- the clock stepped back: add to the newest bucket
      end
      redis.call('HINCRBY', key, st.f .. b, hits)
      if st.t == 0 then
        st.o = b
      end
      st.n, st.t, slot = b, st.t + hits, b
      redis.call('HSET', key, st.f .. 't', st.t, st.f .. 'o', st.o, st.f .. 'n', st.n)
    else
      st.c, slot = st.c + hits, st.w
      redis.call('HSET', key, st.f .. 'w', st.w, st.f .. 'c', st.c)
    end
    local until_ms
    if l.sliding then
      until_ms = (st.n + 1) * l.p + l.d
    else
      until_ms = (st.w + 1) * l.d
    end
    if until_ms > (expiry[key] or 0) then
      expiry[key] = until_ms
    end
  end
  local reset
  if l.sliding then
    local b = st.o
    if st.t == 0 then
      b = floor(now / l.p)
    end
    reset = (b + 1) * l.p + l.d - now
  else
    reset = (floor(now / l.d) + 1) * l.d - now
  end
  reply[#reply + 1] = st.used
  reply[#reply + 1] = l.pending
  reply[#reply + 1] = l.over and 1 or 0
  reply[#reply + 1] = reset
  reply[#reply + 1] = slot
end

for key, until_ms in pairs(expiry) do
  local current = tonumber(redis.call('HGET', key, 'x')) or 0
  if until_ms > current then
    -- One second of slack covers clock differences between replicas in
    -- "local" time mode.
    redis.call('PEXPIRE', key, until_ms - now + 1000)
    redis.call('HSET', key, 'x', until_ms)
  end
end

return reply
