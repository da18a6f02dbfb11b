--[[ sliding_window (src/limiter/algorithm/sliding_window.rs): buckets of P
ms over a window of D ms; the bucket straddling the window's start counts in
proportion to the part of it still inside (rounded up).

Fields (prefix "D:P:"): "D:P:<bucket>" hits of a non-empty bucket (bucket =
time / P), and "D:P:m", the markers: six little-endian doubles
(struct.pack '<dddddd') holding the buckets' sum, the oldest and the newest
bucket, the hits of those two, and until when the HASH lives at least (its
"x" when the markers were last written: "x" only ever moves later, so
batch.lua's quick path reads "x" only when a new bucket needs the HASH to
live past that). A decision reads the markers alone (the buckets it needs
are the oldest, straddling the window's start, and the newest, where it
counts); another bucket is read only when buckets leave the window (once
per bucket), the clock stepped back or a refund reaches it. (One field of
six numbers instead of six fields of one: Redis finds, returns and stores
one field, the script makes one string and parses none; callgrind, see the
benchmarks log.) The markers are written once per call, by 'save',
whatever changed them.
]]

--[[ layout sliding after state:
  SW_DURATION     D
  SW_PRECISION    P
  SW_OLDEST       the bucket at the window's start
  SW_CUR          the bucket of now
  SW_TOTAL        the hits of every stored bucket
  SW_LOW          the oldest stored bucket (false when empty)
  SW_HIGH         the newest stored bucket (false when empty)
  SW_LOW_HITS     the hits of bucket SW_LOW
  SW_HIGH_HITS    the hits of bucket SW_HIGH
  SW_SEEN         until when the HASH lives at least (the markers' "x")
  SW_OTHERS       other buckets read: bucket -> hits (a table made when
                  needed)
  SW_CUR_NAME     the field of bucket SW_CUR (made once, with the state: a
                  string.format costs more than the arithmetic)
]]

-- The markers' struct format (see above): batch.lua's quick path reads and
-- writes them with it too.
local MARKERS = '<dddddd'

-- Built only when the request names this algorithm. What the common path
-- does not use is reached through its global, not captured: every upvalue
-- a function captures costs on every call (see prelude.lua). The ops are
-- tested in the order a decision asks them, the batch's per run first.
local sliding_window
sliding_window = uses_sliding and function(op, st, l, x)
  if op == 'load' then
    local oldest, marks = st[SW_OLDEST], x[st[S_AT] + 1]
    local t, o, n, low_hits, high_hits, seen = 0, false, false, 0, 0, 0
    if marks then
      t, o, n, low_hits, high_hits, seen = struct.unpack(MARKERS, marks)
      if t == 0 then
        o, n = false, false -- refunded to nothing: empty, whatever they say
      end
    end
    st[SW_TOTAL], st[SW_LOW], st[SW_HIGH], st[SW_LOW_HITS], st[SW_HIGH_HITS] = t, o, n, low_hits, high_hits
    st[SW_SEEN], st[SW_OTHERS], st[S_DIRTY] = seen, false, false
    if t > 0 and o < oldest then
      -- Buckets o..n, some of which left the window: read the span once (at
      -- most one bucket per bucket of the window since the previous call),
      -- take the old ones off the total and delete them.
      local k, f = st[S_KEY], st[S_PREFIX]
      local names = {}
      for b = o, n do
        names[b - o + 1] = f .. fmt('%d', b)
      end
      local counts = redis.call('HMGET', k[K_NAME], unpack(names))
      local del, first = k[K_DELETES] or {}, nil
      k[K_DELETES] = del
      for j = 1, #names do
        local c = counts[j]
        c = c and c + 0
        if c then
          if o + j - 1 < oldest or (c == 0 and not first) then
            -- Gone from the window, or emptied by a refund.
            t = t - c
            del[#del + 1] = names[j]
          elseif not first then
            first, low_hits = o + j - 1, c
          end
        end
      end
      if not (t > 0 and first) then
        st[SW_TOTAL], st[SW_LOW], st[SW_HIGH] = 0, false, false
        del[#del + 1] = f .. 'm'
        return 0
      end
      st[SW_TOTAL], st[SW_LOW], st[SW_LOW_HITS], st[S_DIRTY] = t, first, low_hits, true
      o = first
    end
    -- What the window holds (as 'count', inline on this path).
    local p = st[SW_PRECISION]
    local inside = (oldest + 1) * p - (now - st[SW_DURATION])
    if t > 0 and o == oldest and inside < p then
      return t - low_hits + math.ceil(low_hits * inside / p)
    end
    return t
  elseif op == 'add' then
    local t = st[SW_TOTAL]
    local hits = math.min(x, MAX_HITS - t)
    if hits == 0 then
      return -1, 0
    end
    local b, n, c = st[SW_CUR], st[SW_HIGH], hits
    if t == 0 then
      st[SW_LOW] = b
    elseif n >= b then
      b, c = n, st[SW_HIGH_HITS] + hits -- now's, or the clock stepped back: the newest
    end
    if b == st[SW_LOW] then
      st[SW_LOW_HITS] = c -- one bucket is both
    end
    st[SW_HIGH], st[SW_HIGH_HITS], st[SW_TOTAL], st[S_DIRTY] = b, c, t + hits, true
    write(st[S_KEY], b == st[SW_CUR] and st[SW_CUR_NAME] or st[S_PREFIX] .. fmt('%d', b), fmt('%d', c))
    -- The HASH's expiry moves only with a new newest bucket.
    if t == 0 or n ~= b then
      return b, (b + 1) * st[SW_PRECISION] + st[SW_DURATION]
    end
    return b, 0
  elseif op == 'report' then
    -- The reset: when the oldest bucket leaves the window. Then for how
    -- long no hit at all can fit; exact or shorter, and never past the
    -- reset nor, for an empty counter, the next bucket (see Rust's
    -- full_for).
    local requests, d, p = l[L_REQUESTS], st[SW_DURATION], st[SW_PRECISION]
    local t, o, c = st[SW_TOTAL], st[SW_LOW], st[SW_LOW_HITS]
    if t == 0 then
      local reset = (st[SW_CUR] + 1) * p + d - now
      if requests == 0 then
        return reset, (math.floor(now / p) + 1) * p - now
      end
      return reset, 0
    end
    local reset = (o + 1) * p + d - now
    local inside = (st[SW_OLDEST] + 1) * p - (now - d)
    if requests == 0 then
      return reset, reset
    elseif o == st[SW_OLDEST] and inside < p then
      local others = t - c
      if others >= requests then
        return reset, inside
      end
      -- Hits of the straddling bucket that may still leave before one
      -- fits: (requests - 1 - others) * p / c, rounded down.
      local q = idiv((requests - 1 - others) * p, c)
      return reset, inside - math.min(q, inside)
    elseif t >= requests then
      return reset, math.max(o * p + d - now, 0)
    end
    return reset, 0
  elseif op == 'save' then
    write(st[S_KEY], st[S_PREFIX] .. 'm', struct.pack(MARKERS, st[SW_TOTAL], st[SW_LOW], st[SW_HIGH], st[SW_LOW_HITS],
      st[SW_HIGH_HITS], x or st[SW_SEEN]))
  elseif op == 'new' then
    local k, d = st, l[L_DURATION]
    local p = ARGV[l[L_ARG] + 3] + 0
    local n = k[K_READS]
    k[K_FIELDS + n], k[K_READS] = x .. 'm', n + 1
    local cur = math.floor(now / p)
    return {
      [S_ALG] = sliding_window, [S_KEY] = k, [S_AT] = n, [S_USED] = 0, [S_PENDING] = 0,
      [S_FIRST] = 0, [S_PREFIX] = x, [S_DIRTY] = false, [SW_DURATION] = d, [SW_PRECISION] = p,
      [SW_OLDEST] = math.floor((now - d) / p), [SW_CUR] = cur, [SW_TOTAL] = 0, [SW_LOW] = false,
      [SW_HIGH] = false, [SW_LOW_HITS] = 0, [SW_HIGH_HITS] = 0, [SW_SEEN] = 0, [SW_OTHERS] = false,
      [SW_CUR_NAME] = x .. fmt('%d', cur),
    }
  elseif op == 'count' then
    -- What the window holds: its live buckets, and the straddling one in
    -- proportion to the part of it still inside.
    local t, p, c = st[SW_TOTAL], st[SW_PRECISION], st[SW_LOW_HITS]
    local inside = (st[SW_OLDEST] + 1) * p - (now - st[SW_DURATION])
    if t > 0 and st[SW_LOW] == st[SW_OLDEST] and inside < p then
      return t - c + math.ceil(c * inside / p)
    end
    return t
  elseif op == 'prefix' then
    return st .. ':' .. l .. ':'
  elseif op == 'give' then
    -- The newest buckets first (see Rust's State::refund).
    local k, f, b, hits, left = st[S_KEY], st[S_PREFIX], st[SW_HIGH], x, nil
    while hits > 0 and st[SW_TOTAL] > 0 and b >= st[SW_LOW] do
      local c = sliding_window('bucket', st, nil, b)
      if c and c > 0 then
        local take = math.min(c, hits)
        c, hits, st[SW_TOTAL], st[S_DIRTY] = c - take, hits - take, st[SW_TOTAL] - take, true
        -- Written even when 0 (deletes run before writes and could undo
        -- an earlier write of this request); an empty bucket counts nothing.
        sliding_window('put', st, c, b)
        write(k, f .. fmt('%d', b), fmt('%d', c))
        left = c > 0 and b or nil
      end
      b = b - 1
    end
    -- A total of 0 is an empty window whatever the markers say. Otherwise
    -- the newest marker moves down to the newest bucket left with hits, as
    -- Rust drops emptied buckets: a clock behind it then adds to that one.
    if st[SW_TOTAL] > 0 and b and b < st[SW_HIGH] then
      while not left and b >= st[SW_LOW] do
        local c = sliding_window('bucket', st, nil, b)
        left = c and c > 0 and b or nil
        b = b - 1
      end
      if left and left < st[SW_HIGH] then
        local c = sliding_window('bucket', st, nil, left)
        st[SW_HIGH], st[SW_HIGH_HITS] = left, c
      end
    end
    return sliding_window('count', st)
  elseif op == 'bucket' then
    -- Hits of bucket x: known for the markers' two, read once otherwise.
    if x == st[SW_HIGH] then
      return st[SW_HIGH_HITS]
    elseif x == st[SW_LOW] then
      return st[SW_LOW_HITS]
    end
    local more = st[SW_OTHERS]
    if not more then
      more = {}
      st[SW_OTHERS] = more
    end
    local c = more[x]
    if c == nil then
      c = redis.call('HGET', st[S_KEY][K_NAME], st[S_PREFIX] .. fmt('%d', x))
      c = c and c + 0
      more[x] = c
    end
    return c or nil
  elseif op == 'put' then
    -- Bucket x now holds l hits.
    if x == st[SW_HIGH] then
      st[SW_HIGH_HITS] = l
    end
    if x == st[SW_LOW] then
      st[SW_LOW_HITS] = l
    end
    if x ~= st[SW_HIGH] and x ~= st[SW_LOW] then
      st[SW_OTHERS][x] = l
    end
  elseif op == 'undo' then
    -- refund.lua: the hits counted in the bucket decide.lua answered come
    -- back; an emptied bucket goes, and the markers move to the buckets
    -- that are left.
    local key, f, slot, hits = st, x, ARGV[l + 4] + 0, ARGV[l + 5] + 0
    local name = f .. fmt('%d', slot)
    local v = redis.call('HMGET', key, name, f .. 'm')
    if not (v[1] and v[2]) then
      return 0
    end
    local t, o, n, low_hits, high_hits, seen = struct.unpack(MARKERS, v[2])
    local c = v[1] + 0
    local take = math.min(c, hits)
    c, t = c - take, t - take
    if t <= 0 then
      redis.call('HDEL', key, name, f .. 'm')
      return 1
    elseif c > 0 then
      redis.call('HSET', key, name, fmt('%d', c))
    else
      redis.call('HDEL', key, name)
    end
    -- The markers' buckets: this one's new count, or the next stored one
    -- when it went.
    if slot == o then
      low_hits = c
      for b = o + 1, c > 0 and o or n do
        local h = redis.call('HGET', key, f .. fmt('%d', b))
        if h then
          o, low_hits = b, h + 0
          break
        end
      end
    end
    if slot == n then
      high_hits = c
      for b = n - 1, c > 0 and n or o, -1 do
        local h = redis.call('HGET', key, f .. fmt('%d', b))
        if h then
          n, high_hits = b, h + 0
          break
        end
      end
    end
    redis.call('HSET', key, f .. 'm', struct.pack(MARKERS, t, o, n, low_hits, high_hits, seen))
    return 1
  end
end
