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
Then, per item, in KEYS order: role (0 enforce, 1 shadow, 2 quota; plus 4
when the item counts always, even when the request or the item is refused;
3 for a refund, whose hits are given back), hits, number of limits; and per limit: requests, duration_ms, algorithm, param:
  0 sliding_window  param = precision_ms
  1 fixed_window    param = 0
  2 token_bucket    param = burst
  3 sliding_log     param = 0; 1 for concurrency (a log of leased slots,
                    window = lease, fields "D:c:…")

Reply: { applied (1|0), now, then per limit:
                  used, pending, over, reset_before, reset_after, full_before, full_after, slot }
  used     how much of the limit is in use before this request (after it,
           for a refund, whose pending is then 0)
  pending  hits of earlier limits of this request on the same counter
  over     1 if this limit's hits (with the pending ones) do not fit
    reset_*  ms until headroom next grows, before this request and after it
           (the caller of a refunded part reports the former)
    full_*   ms from now during which no hit at all can fit (0 if one can),
           before and after this request: what a local cache may answer
           without asking Redis
  slot     where the hits went (bucket, window, or log time; -1 if none),
           for refund.lua

Fields of a HASH, per limit (D = duration_ms):
  sliding_window  "D:P:<bucket>" hits of a non-empty bucket (bucket = time / P),
                  "D:P:t" their sum, "D:P:o" oldest bucket, "D:P:n" newest
  fixed_window    "D:f:w" window index (time / D), "D:f:c" hits in it
  token_bucket    "D:b<burst>:a" theoretical arrival time, whole ms, and
                  "D:b<burst>:r" its remainder in ticks of 1/requests ms (one
                  token is exactly D ticks: exact integer GCRA)
  sliding_log     "D:l:e" entries "time:hits,time:hits,…", oldest first
  "x"             when the HASH may expire (ms). The TTL is moved only when a
                  limit needs it longer, never on every hit.

Cost: one HMGET and one HSET per key; a sliding window adds one bounded
HMGET and one HDEL when buckets leave its window (once per bucket), and a
sliding log parses at most `requests` entries. Never proportional to the
request rate.

Two paths compute the same thing: `fast` (whole requests whose keys are
distinct and whose limits are sliding or fixed windows on distinct
counters: flat tables, few allocations) and the general path below it
(everything). Both call the same arithmetic (sliding_count,
sliding_full_for, sweep); the store conformance suite checks both against
the Rust algorithms.
]]

local floor, ceil, max, min = math.floor, math.ceil, math.max, math.min

-- A counter holds at most 2^53 - 1 hits, and a token bucket's debt stops
-- 2^52 ticks ahead of now (Rust's MAX_HITS and MAX_BUCKET_TICKS): what would
-- pass is not counted, so every number here stays an exact double.
local MAX_HITS, MAX_AHEAD = 9007199254740991, 4503599627370496

local now
if ARGV[1] == '' then
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000 + floor(tonumber(t[2]) / 1000)
else
  now = tonumber(ARGV[1])
end
local whole = ARGV[2] == 'all'

-- Exact floor division of non-negative integers below 2^53 (a double
-- quotient can round onto the next integer).
local function idiv(a, b)
  local q = floor(a / b)
  if q * b > a then
    q = q - 1
  elseif (q + 1) * b <= a then
    q = q + 1
  end
  return q
end

local function ceil_div(a, b)
  local q = idiv(a, b)
  if q * b < a then
    q = q + 1
  end
  return q
end

-- The sliding window's arithmetic, shared by both paths. `c` is the count
-- of the bucket straddling the window's start (`oldest`), `inside` how many
-- of its milliseconds are still in the window.

-- What the window holds: its live buckets, and the straddling one in
-- proportion to the part of it still inside (rounded up).
local function sliding_count(t, o, oldest, c, inside, p)
  if t > 0 and o == oldest and c and inside < p then
    return t - c + ceil(c * inside / p)
  end
  return t
end

-- For how long no hit at all can fit; exact or shorter, and never past the
-- oldest bucket's expiry (the reset) nor, for an empty counter, the next
-- bucket (see Rust's full_for).
local function sliding_full_for(requests, t, o, oldest, c, inside, p, d)
  if requests == 0 then
    if t == 0 then
      return (floor(now / p) + 1) * p - now
    end
    return (o + 1) * p + d - now
  elseif t == 0 then
    return 0
  elseif o == oldest and c and inside < p then
    local others = t - c
    if others >= requests then
      return inside
    end
    return inside - min(idiv((requests - 1 - others) * p, c), inside)
  elseif t >= requests then
    return max(o * p + d - now, 0)
  end
  return 0
end

-- Buckets o..n of the window at `key` with prefix `f`, some of which left it
-- (o < oldest): reads the span once (at most one bucket per bucket of the
-- window since the previous call), takes the old ones off the total `t` and
-- lists their fields in `del`. Returns the new t, o, n; when nothing is
-- left, 0, nil, nil with the markers listed in `del` too.
local function sweep(key, f, t, o, n, oldest, del)
  local names = {}
  for b = o, n do
    names[b - o + 1] = string.format('%s%d', f, b)
  end
  local counts = redis.call('HMGET', key, unpack(names))
  local first
  for k, name in ipairs(names) do
    local c = tonumber(counts[k])
    if c then
      if o + k - 1 < oldest or (c == 0 and not first) then
        -- Gone from the window, or emptied by a refund.
        t = t - c
        del[#del + 1] = name
      elseif not first then
        first = o + k - 1
      end
    end
  end
  if t > 0 and first then
    return t, first, n
  end
  del[#del + 1], del[#del + 2], del[#del + 3] = f .. 't', f .. 'o', f .. 'n'
  return 0, nil, nil
end

-- Fast path: the whole request in this call, each descriptor on its own key,
-- every limit a sliding or fixed window on its own counter (the common
-- shapes). Same state, same arithmetic and same reply as the general path
-- below, with flat preallocated tables instead of a table per limit and
-- state: in Redis's Lua, tables, closures and number-to-string conversions
-- cost more than the commands. It only reads until it knows it can finish,
-- and gives way to the general path when a key or counter is named twice,
-- another algorithm is asked for, the clock stepped back, or a precision is
-- not shorter than its window.
local function fast()
  local fmt = string.format
  -- Per limit, 13 slots from l * 13: sliding, requests, d, p, oldest, cur,
  -- field prefix, index of its first field in its key's HMGET, then t, o,
  -- n, whether buckets left the window, and its item. Tables are built at
  -- the size one limit needs: growing one reallocates it.
  local L = { false, false, false, false, false, false, false, false, false, false, false, false, false }
  -- Per item (key): what it reads and writes.
  local K, nl, a = {}, 0, 3
  local keys_seen = #KEYS > 1 and {}
  for i = 1, #KEYS do
    local key = KEYS[i]
    if keys_seen then
      if keys_seen[key] then
        return nil
      end
      keys_seen[key] = true
    end
    -- Always-counting items and refunds take the general path.
    if ARGV[a] > '2' then
      return nil
    end
    local count = tonumber(ARGV[a + 2])
    local fields, nf = { 'x', false, false, false, false, false }, 1
    local seen = count > 1 and {}
    K[i] = { key = key, role = ARGV[a], hits = tonumber(ARGV[a + 1]), fields = false,
      nf = 0, v = false, x = 0, set = false, m = 0, dels = false, expiry = 0, over = false }
    a = a + 3
    for _ = 1, count do
      local at = nl * 13
      local alg, d = ARGV[a + 2], tonumber(ARGV[a + 1])
      local f
      if alg == '0' then
        f = ARGV[a + 1] .. ':' .. ARGV[a + 3] .. ':'
      elseif alg == '1' then
        f = ARGV[a + 1] .. ':f:'
      else
        return nil
      end
      if seen then
        if seen[f] then
          return nil
        end
        seen[f] = true
      end
      L[at + 1], L[at + 2], L[at + 3], L[at + 7], L[at + 8] = alg == '0', tonumber(ARGV[a]), d, f, nf + 1
      L[at + 12], L[at + 13] = false, i
      if alg == '0' then
        local p = tonumber(ARGV[a + 3])
        local oldest, cur = floor((now - d) / p), floor(now / p)
        if oldest == cur then
          return nil
        end
        L[at + 4], L[at + 5], L[at + 6] = p, oldest, cur
        -- string.format('%d') is about twice as cheap as Lua's own
        -- number-to-string (a %.14g printf).
        fields[nf + 1], fields[nf + 2], fields[nf + 3] = f .. 't', f .. 'o', f .. 'n'
        fields[nf + 4], fields[nf + 5] = fmt('%s%d', f, oldest), fmt('%s%d', f, cur)
        nf = nf + 5
      else
        L[at + 6] = floor(now / d)
        fields[nf + 1], fields[nf + 2] = f .. 'w', f .. 'c'
        nf = nf + 2
      end
      nl, a = nl + 1, a + 4
    end
    K[i].fields, K[i].nf = fields, nf
  end
  for i = 1, #KEYS do
    local k = K[i]
    k.v = redis.call('HMGET', k.key, unpack(k.fields, 1, k.nf))
    k.x = tonumber(k.v[1]) or 0
  end

  -- Check every limit; give way before anything is written.
  local reply = { 0, now, 0, 0, 0, 0, 0, 0, 0, 0 }
  for l = 0, nl - 1 do
    local at, r = l * 13, 2 + l * 8
    local k = K[L[at + 13]]
    local requests, j, v = L[at + 2], L[at + 8], k.v
    local used
    if L[at + 1] then
      local p, d, oldest, cur, f = L[at + 4], L[at + 3], L[at + 5], L[at + 6], L[at + 7]
      local t, o, n = tonumber(v[j]) or 0, tonumber(v[j + 1]), tonumber(v[j + 2])
      if t > 0 and n > cur then
        return nil
      end
      if t > 0 and o < oldest then
        -- Written at the end, admitted or not, as the general path does.
        k.dels = k.dels or {}
        t, o, n = sweep(k.key, f, t, o, n, oldest, k.dels)
        L[at + 12] = true
      end
      L[at + 9], L[at + 10], L[at + 11] = t, o, n
      used = sliding_count(t, o, oldest, tonumber(v[j + 3]), (oldest + 1) * p - (now - d), p)
    else
      local c = tonumber(v[j + 1]) or 0
      if tonumber(v[j]) ~= L[at + 6] then
        c = 0
      end
      used = c
    end
    local over = used + k.hits > requests
    k.over = k.over or over
    reply[r + 1], reply[r + 2], reply[r + 3] = used, 0, over and 1 or 0
  end
  local enforce_over, quota_seen, quota_all_over = false, false, true
  for i = 1, #KEYS do
    local k = K[i]
    if k.role == '0' then
      enforce_over = enforce_over or k.over
    elseif k.role == '2' then
      quota_seen, quota_all_over = true, quota_all_over and k.over
    end
  end
  local applied = not enforce_over and not (quota_seen and quota_all_over)
  reply[1] = applied and 1 or 0

  -- Count (if admitted) and report. Only fields whose value changes are
  -- written: the oldest and newest bucket markers rarely do.
  for l = 0, nl - 1 do
    local at, r = l * 13, 2 + l * 8
    local k = K[L[at + 13]]
    local requests, d, f, j, v, hits = L[at + 2], L[at + 3], L[at + 7], L[at + 8], k.v, k.hits
    local set, m = k.set, k.m
    if not set then
      set = { false, false, false, false, false, false, false, false, false, false }
      k.set = set
    end
    local slot, reset, full = -1, 0, 0
    local counted = applied and hits > 0
    if L[at + 1] then
      local p, oldest, cur, t, o = L[at + 4], L[at + 5], L[at + 6], L[at + 9], L[at + 10]
      local swept = L[at + 12]
      local add = counted and min(hits, MAX_HITS - t) or 0
      if add > 0 then
        local scur = fmt('%d', cur)
        set[m + 1], set[m + 2] = f .. scur, fmt('%d', (tonumber(v[j + 4]) or 0) + add)
        set[m + 3], set[m + 4] = f .. 't', fmt('%d', t + add)
        m = m + 4
        if t == 0 then
          o = cur
        end
        if t == 0 or swept then
          set[m + 1], set[m + 2] = f .. 'o', fmt('%d', o)
          m = m + 2
        end
        if t == 0 or L[at + 11] ~= cur then
          set[m + 1], set[m + 2] = f .. 'n', scur
          m = m + 2
        end
        t, slot = t + add, cur
        k.expiry = max(k.expiry, (cur + 1) * p + d)
      elseif swept and t > 0 then
        set[m + 1], set[m + 2], set[m + 3], set[m + 4] = f .. 't', fmt('%d', t), f .. 'o', fmt('%d', o)
        m = m + 4
      end
      if t == 0 then
        reset = (cur + 1) * p + d - now
      else
        reset = (o + 1) * p + d - now
      end
      local inside = (oldest + 1) * p - (now - d)
      full = sliding_full_for(requests, t, o, oldest, tonumber(v[j + 3]), inside, p, d)
    else
      local window = L[at + 6]
      local w, c = tonumber(v[j]), tonumber(v[j + 1]) or 0
      if w ~= window then
        c = 0
      end
      local add = counted and min(hits, MAX_HITS - c) or 0
      if add > 0 then
        w, c, slot = window, c + add, window
        set[m + 1], set[m + 2], set[m + 3], set[m + 4] = f .. 'w', fmt('%d', w), f .. 'c', fmt('%d', c)
        m = m + 4
        k.expiry = max(k.expiry, (window + 1) * d)
      end
      reset = (window + 1) * d - now
      if w == window and c >= requests then
        full = reset
      end
    end
    k.m = m
    reply[r + 4], reply[r + 5], reply[r + 6], reply[r + 7], reply[r + 8] = reset, reset, full, full, slot
  end

  -- Per key: at most one HDEL, one HSET and one PEXPIRE.
  for i = 1, #KEYS do
    local k = K[i]
    if k.dels then
      redis.call('HDEL', k.key, unpack(k.dels))
    end
    local m = k.m
    if m > 0 then
      local extend = k.expiry > k.x
      if extend then
        k.set[m + 1], k.set[m + 2] = 'x', fmt('%d', k.expiry)
        m = m + 2
      end
      -- HSET first: PEXPIRE on a key that does not exist yet does nothing.
      redis.call('HSET', k.key, unpack(k.set, 1, m))
      if extend then
        redis.call('PEXPIRE', k.key, fmt('%d', k.expiry - now + 1000))
      end
    end
  end
  return reply
end

if whole and #KEYS > 0 then
  local reply = fast()
  if reply then
    return reply
  end
end

-- Per key: fields to read, states to fill, and writes to make at the end.
local keys, by_key = {}, {}
local function key_state(key)
  local k = by_key[key]
  if not k then
    k = { key = key, fields = { 'x' }, states = {}, set = {}, del = {}, expiry = 0 }
    by_key[key] = k
    keys[#keys + 1] = k
  end
  return k
end

local function write(k, field, value)
  k.set[#k.set + 1] = field
  k.set[#k.set + 1] = value
end

-- Parse the request and plan the reads: one state per distinct counter.
local items, limits, states, a = {}, {}, {}, 3
for i = 1, #KEYS do
  local k = key_state(KEYS[i])
  local code = tonumber(ARGV[a])
  local item = { k = k, role = code % 4, always = code >= 4, refund = code == 3,
    hits = tonumber(ARGV[a + 1]), limits = {} }
  local count = tonumber(ARGV[a + 2])
  a = a + 3
  for _ = 1, count do
    local l = {
      item = item,
      requests = tonumber(ARGV[a]),
      d = tonumber(ARGV[a + 1]),
      alg = tonumber(ARGV[a + 2]),
      param = tonumber(ARGV[a + 3]),
    }
    a = a + 4
    local f
    if l.alg == 0 then
      f = l.d .. ':' .. l.param .. ':'
    elseif l.alg == 1 then
      f = l.d .. ':f:'
    elseif l.alg == 2 then
      f = l.d .. ':b' .. l.param .. ':'
    else
      f = l.d .. (l.param == 1 and ':c:' or ':l:')
    end
    local id = KEYS[i] .. '\n' .. f
    local st = states[id]
    if not st then
      -- `at`: where this state's fields start in its key's HMGET reply.
      local fields = k.fields
      st = { f = f, k = k, alg = l.alg, d = l.d, param = l.param, requests = l.requests, pending = 0, at = #fields + 1 }
      states[id] = st
      k.states[#k.states + 1] = st
      local n = #fields
      if st.alg == 0 then
        local p = st.param
        st.p = p
        st.oldest = floor((now - st.d) / p)
        st.cur = floor(now / p)
        fields[n + 1], fields[n + 2], fields[n + 3] = f .. 't', f .. 'o', f .. 'n'
        fields[n + 4], fields[n + 5] = f .. st.oldest, f .. st.cur
      elseif st.alg == 1 then
        fields[n + 1], fields[n + 2] = f .. 'w', f .. 'c'
      elseif st.alg == 2 then
        fields[n + 1], fields[n + 2] = f .. 'a', f .. 'r'
      else
        fields[n + 1] = f .. 'e'
      end
    end
    l.st = st
    item.limits[#item.limits + 1] = l
    limits[#limits + 1] = l
  end
  items[i] = item
end

-- Read: one HMGET per key; each state takes its values by position.
for _, k in ipairs(keys) do
  local v = redis.call('HMGET', k.key, unpack(k.fields))
  k.x = tonumber(v[1]) or 0
  for _, st in ipairs(k.states) do
    local i = st.at
    if st.alg == 0 then
      st.t, st.o, st.n = tonumber(v[i]) or 0, tonumber(v[i + 1]), tonumber(v[i + 2])
      st.buckets = { [st.oldest] = tonumber(v[i + 3]), [st.cur] = tonumber(v[i + 4]) }
    elseif st.alg == 1 then
      st.w, st.c = tonumber(v[i]), tonumber(v[i + 1]) or 0
    elseif st.alg == 2 then
      st.base, st.ticks = tonumber(v[i]) or 0, tonumber(v[i + 1]) or 0
    elseif v[i] then
      st.raw = v[i]
    end
  end
end

-- Bring every state to `now` and compute what is in use.
local function sliding_used(st)
  local k, f, p, d = st.k, st.f, st.p, st.d
  if st.t > 0 and st.o < st.oldest then
    st.t, st.o, st.n = sweep(k.key, f, st.t, st.o, st.n, st.oldest, k.del)
    if st.t > 0 then
      write(k, f .. 't', st.t)
      write(k, f .. 'o', st.o)
    end
  end
  local inside = (st.oldest + 1) * p - (now - d)
  return sliding_count(st.t, st.o, st.oldest, st.buckets[st.oldest], inside, p)
end

-- Entries still in the window, without the oldest hits beyond the limit
-- (only shadow or quota mode log beyond it). Trimmed here, not when adding,
-- so that refund.lua can take back exactly what an add put in.
-- Forgets the oldest hits beyond the limit.
local function log_trim(st)
  while st.total > st.requests and #st.times > 0 do
    local excess = st.total - st.requests
    st.dirty = true
    if st.hits[1] <= excess then
      st.total = st.total - st.hits[1]
      table.remove(st.times, 1)
      table.remove(st.hits, 1)
    else
      st.hits[1] = st.hits[1] - excess
      st.total = st.total - excess
    end
  end
end

local function log_parse(st)
  st.times, st.hits, st.total = {}, {}, 0
  if st.raw then
    local start = now - st.d
    for t, h in string.gmatch(st.raw, '(%d+):(%d+)') do
      t, h = tonumber(t), tonumber(h)
      if t > start then
        st.times[#st.times + 1] = t
        st.hits[#st.hits + 1] = h
        st.total = st.total + h
      else
        st.dirty = true
      end
    end
  end
  log_trim(st)
  return st.total
end

for _, st in pairs(states) do
  if st.alg == 0 then
    st.used = sliding_used(st)
  elseif st.alg == 1 then
    if st.w ~= floor(now / st.d) then
      st.c = 0
    end
    st.used = st.c
  elseif st.alg == 2 then
    st.used = 0 -- per limit: it depends on the limit's own numbers
  else
    st.used = log_parse(st)
  end
end

-- Token buckets, in ticks of 1/requests ms: a token is exactly D ticks.
-- How far the arrival time is ahead of now (0 when the bucket is full).
local function ahead(l)
  local st = l.st
  if l.requests > 0 and (st.base > now or (st.base == now and st.ticks > 0)) then
    return (st.base - now) * l.requests + st.ticks
  end
  return 0
end

local function bucket_used(l)
  if l.requests == 0 or l.d == 0 then
    return 0
  end
  return min(ceil_div(ahead(l), l.d), l.st.param)
end

local function fits(l, hits)
  local st = l.st
  if st.alg == 2 then
    if hits == 0 then
      -- A check: refused only while in debt past the burst.
      return l.requests == 0 or ahead(l) <= st.param * l.d
    end
    if l.requests == 0 or hits > st.param then
      return false
    end
    return ahead(l) + hits * l.d <= st.param * l.d
  end
  return l.used + hits <= l.requests
end

-- Pass 1: check every limit as if every earlier limit of the request had
-- been counted (a request may name one counter twice).
local enforce_over, quota_seen, quota_all_over = false, false, true
for _, item in ipairs(items) do
  local item_over = false
  for _, l in ipairs(item.limits) do
    local st = l.st
    if st.alg == 2 then
      l.used = bucket_used(l)
    else
      l.used = st.used
    end
    l.pending = st.pending
    if item.refund then
      l.over = false -- a refund only gives back
    else
      l.over = not fits(l, st.pending + item.hits)
      st.pending = st.pending + item.hits
    end
    item_over = item_over or l.over
  end
  if item.refund then
    -- takes no part in admission
  elseif item.role == 0 then
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

-- Pass 2: count everything, or nothing, and report.
local function add(l, hits)
  local st, k = l.st, l.st.k
  if st.alg == 0 then
    hits = min(hits, MAX_HITS - st.t)
    if hits == 0 then
      return -1, 0
    end
    local b = st.cur
    if st.t > 0 and st.n >= b then
      b = st.n -- the clock stepped back: add to the newest bucket
    end
    local c = st.buckets[b]
    if c == nil and st.t > 0 and b ~= st.cur then
      c = tonumber(redis.call('HGET', k.key, st.f .. b))
    end
    c = (c or 0) + hits
    st.buckets[b] = c
    if st.t == 0 then
      st.o = b
    end
    st.n, st.t = b, st.t + hits
    write(k, st.f .. b, c)
    write(k, st.f .. 't', st.t)
    write(k, st.f .. 'o', st.o)
    write(k, st.f .. 'n', st.n)
    return b, (st.n + 1) * st.p + st.d
  elseif st.alg == 1 then
    hits = min(hits, MAX_HITS - st.c)
    if hits == 0 then
      return -1, 0
    end
    st.w = floor(now / st.d)
    st.c = st.c + hits
    write(k, st.f .. 'w', st.w)
    write(k, st.f .. 'c', st.c)
    return st.w, (st.w + 1) * st.d
  elseif st.alg == 2 then
    if l.requests == 0 then
      return -1, 0
    end
    local a = ahead(l)
    if a == 0 then
      st.base, st.ticks = now, 0
    end
    if l.d > 0 then
      hits = min(hits, idiv(max(MAX_AHEAD - a, 0), l.d))
    end
    if hits == 0 then
      return -1, 0
    end
    local total = st.ticks + hits * l.d
    local whole = idiv(total, l.requests)
    st.base, st.ticks = st.base + whole, total - whole * l.requests
    write(k, st.f .. 'a', st.base)
    write(k, st.f .. 'r', st.ticks)
    local full_at = st.base
    if st.ticks > 0 then
      full_at = full_at + 1
    end
    return 0, full_at
  else
    hits = min(hits, MAX_HITS - st.total)
    if hits == 0 then
      return -1, 0
    end
    local last = #st.times
    local t = now
    if last > 0 and st.times[last] >= now then
      t = st.times[last]
      st.hits[last] = st.hits[last] + hits
    else
      st.times[last + 1] = now
      st.hits[last + 1] = hits
    end
    st.total = st.total + hits
    st.dirty = true
    return t, st.times[#st.times] + st.d
  end
end

-- Gives `hits` back, never below empty (an is_negative_hits refund): the
-- newest buckets or log entries first, the tokens of a bucket, the count of
-- the current fixed window (see Rust's State::refund).
local function give(l, hits)
  local st, k = l.st, l.st.k
  if st.alg == 0 then
    local b = st.n
    while hits > 0 and st.t > 0 and b and b >= st.o do
      local c = st.buckets[b]
      if c == nil then
        c = tonumber(redis.call('HGET', k.key, st.f .. b))
      end
      if c and c > 0 then
        local take = min(c, hits)
        c, hits, st.t = c - take, hits - take, st.t - take
        -- Written even when 0 (deletes run before writes and could undo
        -- an earlier write of this request); an empty bucket counts nothing.
        st.buckets[b] = c
        write(k, st.f .. b, c)
      end
      b = b - 1
    end
    -- A total of 0 is an empty window whatever `o` and `n` say.
    write(k, st.f .. 't', st.t)
    local inside = (st.oldest + 1) * st.p - (now - st.d)
    return sliding_count(st.t, st.o, st.oldest, st.buckets[st.oldest], inside, st.p)
  elseif st.alg == 1 then
    st.c = max(st.c - hits, 0)
    st.w = floor(now / st.d)
    write(k, st.f .. 'w', st.w)
    write(k, st.f .. 'c', st.c)
    return st.c
  elseif st.alg == 2 then
    if l.requests == 0 or hits == 0 then
      return bucket_used(l)
    end
    local a, back = ahead(l), hits * l.d
    if back >= a then
      st.base, st.ticks = now, 0
    else
      local left = a - back
      local whole = idiv(left, l.requests)
      st.base, st.ticks = now + whole, left - whole * l.requests
    end
    write(k, st.f .. 'a', st.base)
    write(k, st.f .. 'r', st.ticks)
    return bucket_used(l)
  else
    log_trim(st) -- as Rust's refund reads the log first
    while hits > 0 and #st.times > 0 do
      local last = #st.times
      local take = min(st.hits[last], hits)
      st.hits[last], hits, st.total = st.hits[last] - take, hits - take, st.total - take
      if st.hits[last] == 0 then
        st.times[last], st.hits[last] = nil, nil
      end
    end
    st.dirty = true
    return st.total
  end
end

local function reset(l)
  local st = l.st
  if st.alg == 0 then
    local b = st.o
    if st.t == 0 then
      b = st.cur
    end
    return (b + 1) * st.p + st.d - now
  elseif st.alg == 1 then
    return (floor(now / st.d) + 1) * st.d - now
  elseif st.alg == 2 then
    local a = ahead(l)
    if a == 0 or l.d == 0 then
      return 0
    end
    local tokens = ceil_div(a, l.d)
    return ceil_div(a - (tokens - 1) * l.d, l.requests)
  else
    local oldest = st.times[1] or now
    return oldest + st.d - now
  end
end

-- For how long no hit can fit; exact or shorter (see Rust's full_for).
local function full_for(l)
  local st = l.st
  if st.alg == 0 then
    local inside = (st.oldest + 1) * st.p - (now - st.d)
    return sliding_full_for(l.requests, st.t, st.o, st.oldest, st.buckets[st.oldest], inside, st.p, st.d)
  elseif st.alg == 1 then
    if st.w == floor(now / st.d) and st.c >= l.requests then
      return reset(l)
    end
    return 0
  elseif st.alg == 2 then
    if fits(l, 1) then
      return 0
    end
    return reset(l)
  elseif st.total > 0 and st.total == l.requests then
    return reset(l)
  end
  return 0
end

-- Two phases, in request order within each: first the debits that stand
-- whatever the request decides (always-counted ones) and the refunds, then
-- the debits counted only with an admitted request. Every store counts in
-- this order, so a counter shared by both kinds reports the same anywhere.
local function standing(l)
  return l.item.refund or l.item.always
end

local slots, reset_after, full_after = {}, {}, {}
local function settle(j, l)
  local slot, hits = -1, l.item.hits
  if l.item.refund then
    l.used, l.pending = give(l, hits), 0
  elseif hits > 0 and (applied or l.item.always) then
    local until_ms
    slot, until_ms = add(l, hits)
    local k = l.st.k
    if until_ms > k.expiry then
      k.expiry = until_ms
    end
  end
  slots[j], reset_after[j], full_after[j] = slot, reset(l), full_for(l)
end

for j, l in ipairs(limits) do
  if standing(l) then
    settle(j, l)
  end
end
-- "Before" values matter only for a Cluster part that may be refunded (it
-- then stands as after the first phase): a whole request reports "after".
local reset_before, full_before = {}, {}
if not whole then
  for j, l in ipairs(limits) do
    if standing(l) then
      reset_before[j], full_before[j] = reset_after[j], full_after[j]
    else
      reset_before[j], full_before[j] = reset(l), full_for(l)
    end
  end
end
for j, l in ipairs(limits) do
  if not standing(l) then
    settle(j, l)
  end
end

local reply = { applied and 1 or 0, now }
for j, l in ipairs(limits) do
  reply[#reply + 1] = l.used
  reply[#reply + 1] = l.pending
  reply[#reply + 1] = l.over and 1 or 0
  reply[#reply + 1] = reset_before[j] or reset_after[j]
  reply[#reply + 1] = reset_after[j]
  reply[#reply + 1] = full_before[j] or full_after[j]
  reply[#reply + 1] = full_after[j]
  reply[#reply + 1] = slots[j]
end

-- Sliding logs are written once, whatever changed them.
for _, st in pairs(states) do
  if st.alg == 3 and st.dirty then
    if #st.times > 0 then
      local parts = {}
      for j = 1, #st.times do
        parts[j] = string.format('%d:%d', st.times[j], st.hits[j])
      end
      write(st.k, st.f .. 'e', table.concat(parts, ','))
    else
      st.k.del[#st.k.del + 1] = st.f .. 'e'
    end
  end
end

-- Write: at most one HDEL, one HSET and one PEXPIRE per key.
for _, k in ipairs(keys) do
  if #k.del > 0 then
    redis.call('HDEL', k.key, unpack(k.del))
  end
  local extend = k.expiry > k.x
  if extend then
    write(k, 'x', k.expiry)
  end
  if #k.set > 0 then
    redis.call('HSET', k.key, unpack(k.set))
  end
  -- After HSET: PEXPIRE on a key that does not exist yet does nothing. One
  -- second of slack covers clock differences between replicas in "local"
  -- time mode.
  if extend then
    redis.call('PEXPIRE', k.key, k.expiry - now + 1000)
  end
end

return reply
