--[[ sliding_window (src/limiter/algorithm/sliding_window.rs): buckets of P
ms over a window of D ms; the bucket straddling the window's start counts in
proportion to the part of it still inside (rounded up).

Fields (prefix "D:P:"): "D:P:<bucket>" hits of a non-empty bucket (bucket =
time / P), "D:P:t" their sum, "D:P:o" oldest bucket, "D:P:n" newest. The
buckets at the window's start (`oldest`) and at now (`cur`) are read with
the markers; another bucket is read only when the clock stepped back or a
refund reaches it.

State slots from 8: D, P, oldest, cur, t, o, n, hits of bucket `oldest`,
hits of bucket `cur`, other buckets read (a table, made when needed), `cur`
formatted (its field's name ends with it, and a marker that moves to `cur`
takes it as its value: a string.format costs more than the arithmetic).
]]

-- Built only when the request names this algorithm. What the common path
-- does not use is reached through its global, not captured: every upvalue
-- a function captures costs on every call (see prelude.lua).
local sliding_window
sliding_window = uses_sliding and function(op, st, l, x)
  if op == 'count' then
    -- What the window holds: its live buckets, and the straddling one in
    -- proportion to the part of it still inside.
    local t, p, c = st[12], st[9], st[15]
    local inside = (st[10] + 1) * p - (now - st[8])
    if t > 0 and st[13] == st[10] and c and inside < p then
      return t - c + math.ceil(c * inside / p)
    end
    return t
  elseif op == 'load' then
    local i, oldest = st[3], st[10]
    -- A missing field is false; the others are parsed by arithmetic (see
    -- prelude.lua).
    local t, o, n = (x[i] or 0) + 0, x[i + 1], x[i + 2]
    local c_oldest, c_cur = x[i + 3], x[i + 4]
    o, n = o and o + 0, n and n + 0
    st[12], st[13], st[14] = t, o, n
    st[15], st[16] = c_oldest and c_oldest + 0, c_cur and c_cur + 0
    if t > 0 and o < oldest then
      -- Buckets o..n, some of which left the window: read the span once (at
      -- most one bucket per bucket of the window since the previous call),
      -- take the old ones off the total and delete them.
      local k, f = st[2], st[7]
      local names = {}
      for b = o, n do
        names[b - o + 1] = f .. fmt('%d', b)
      end
      local counts = redis.call('HMGET', k[1], unpack(names))
      local del, first = k[4] or {}, nil
      k[4] = del
      for j = 1, #names do
        local c = counts[j]
        c = c and c + 0
        if c then
          if o + j - 1 < oldest or (c == 0 and not first) then
            -- Gone from the window, or emptied by a refund.
            t = t - c
            del[#del + 1] = names[j]
          elseif not first then
            first = o + j - 1
          end
        end
      end
      if t > 0 and first then
        st[12], st[13] = t, first
        write(k, f .. 't', fmt('%d', t))
        write(k, f .. 'o', fmt('%d', first))
      else
        st[12], st[13], st[14] = 0, nil, nil
        del[#del + 1], del[#del + 2], del[#del + 3] = f .. 't', f .. 'o', f .. 'n'
        return 0
      end
      t, o = st[12], st[13]
    end
    -- What the window holds (as 'count', inline on this path).
    local p, c = st[9], st[15]
    local inside = (oldest + 1) * p - (now - st[8])
    if t > 0 and o == oldest and c and inside < p then
      return t - c + math.ceil(c * inside / p)
    end
    return t
  elseif op == 'add' then
    local t = st[12]
    local hits = math.min(x, MAX_HITS - t)
    if hits == 0 then
      return -1, 0
    end
    local k, b = st[2], st[11]
    if t > 0 and st[14] >= b then
      b = st[14] -- the clock stepped back: add to the newest bucket
    end
    -- The field names read by 'new' are reused: making a string costs more
    -- than the arithmetic.
    local at, c = 7 + st[3], nil
    if b == st[11] then
      c = (st[16] or 0) + hits
      st[16] = c
      if b == st[10] then
        st[15] = c -- P is not shorter than D: one bucket is both
      end
      -- The total is the bucket's count when it is the only one.
      local w, cs = 7 + k[2] + k[3], fmt('%d', c)
      k[w + 1], k[w + 2], k[w + 3] = k[at + 4], cs, k[at]
      k[w + 4] = c == t + hits and cs or fmt('%d', t + hits)
      k[3] = k[3] + 4
    else
      c = (sliding_window('bucket', st, nil, b) or 0) + hits
      sliding_window('put', st, c, b)
      write(k, st[7] .. fmt('%d', b), fmt('%d', c))
      write(k, k[at], fmt('%d', t + hits))
    end
    -- The markers are written only when they change; so is the HASH's
    -- expiry, which then moves (a new newest bucket).
    local grew = t == 0 or st[14] ~= b
    if grew then
      local sb = b == st[11] and st[18] or fmt('%d', b)
      if t == 0 then
        st[13] = b
        write(k, k[at + 1], sb)
      end
      st[14] = b
      write(k, k[at + 2], sb)
    end
    st[12] = t + hits
    return b, grew and (b + 1) * st[9] + st[8] or 0
  elseif op == 'report' then
    -- The reset: when the oldest bucket leaves the window. Then for how
    -- long no hit at all can fit; exact or shorter, and never past the
    -- reset nor, for an empty counter, the next bucket (see Rust's
    -- full_for).
    local requests, d, p, oldest, t, o, c = l[3], st[8], st[9], st[10], st[12], st[13], st[15]
    if t == 0 then
      local reset = (st[11] + 1) * p + d - now
      if requests == 0 then
        return reset, (math.floor(now / p) + 1) * p - now
      end
      return reset, 0
    end
    local reset = (o + 1) * p + d - now
    local inside = (oldest + 1) * p - (now - d)
    if requests == 0 then
      return reset, reset
    elseif o == oldest and c and inside < p then
      local others = t - c
      if others >= requests then
        return reset, inside
      end
      -- (requests - 1 - others) * p / c rounded down, exactly (a double
      -- quotient can round onto the next integer; token_bucket.lua's idiv,
      -- not built for a sliding window alone, as a closure costs more)
      local a = (requests - 1 - others) * p
      local q = math.floor(a / c)
      if q * c > a then
        q = q - 1
      elseif (q + 1) * c <= a then
        q = q + 1
      end
      return reset, inside - math.min(q, inside)
    elseif t >= requests then
      return reset, math.max(o * p + d - now, 0)
    end
    return reset, 0
  elseif op == 'new' then
    local k, d = st, l[4]
    local p = ARGV[l[5] + 3] + 0
    local oldest, cur = math.floor((now - d) / p), math.floor(now / p)
    local n = k[2]
    k[8 + n], k[9 + n], k[10 + n] = x .. 't', x .. 'o', x .. 'n'
    local sc = fmt('%d', cur)
    k[11 + n], k[12 + n] = x .. fmt('%d', oldest), x .. sc
    k[2] = n + 5
    return { sliding_window, k, n + 1, 0, 0, 0, x, d, p, oldest, cur, 0, false, false, false, false, false, sc }
  elseif op == 'prefix' then
    return st .. ':' .. l .. ':'
  elseif op == 'give' then
    -- The newest buckets first (see Rust's State::refund).
    local k, f, b, hits = st[2], st[7], st[14], x
    while hits > 0 and st[12] > 0 and b and b >= st[13] do
      local c = sliding_window('bucket', st, nil, b)
      if c and c > 0 then
        local take = math.min(c, hits)
        c, hits, st[12] = c - take, hits - take, st[12] - take
        -- Written even when 0 (deletes run before writes and could undo
        -- an earlier write of this request); an empty bucket counts nothing.
        sliding_window('put', st, c, b)
        write(k, f .. fmt('%d', b), fmt('%d', c))
      end
      b = b - 1
    end
    -- A total of 0 is an empty window whatever `o` and `n` say.
    write(k, f .. 't', fmt('%d', st[12]))
    return sliding_window('count', st)
  elseif op == 'bucket' then
    -- Hits of bucket x: known for `cur` and `oldest`, read once otherwise.
    if x == st[11] then
      return st[16]
    elseif x == st[10] then
      return st[15]
    end
    local more = st[17]
    if not more then
      more = {}
      st[17] = more
    end
    local c = more[x]
    if c == nil then
      c = redis.call('HGET', st[2][1], st[7] .. fmt('%d', x))
      c = c and c + 0
      more[x] = c
    end
    return c or nil
  elseif op == 'put' then
    -- Bucket x now holds l hits.
    if x == st[11] then
      st[16] = l
    end
    if x == st[10] then
      st[15] = l
    end
    if x ~= st[11] and x ~= st[10] then
      st[17][x] = l
    end
  end
end
