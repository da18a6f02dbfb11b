--[[ sliding_window (src/limiter/algorithm/sliding_window.rs): buckets of P
ms over a window of D ms; the bucket straddling the window's start counts in
proportion to the part of it still inside (rounded up).

Fields (prefix "D:P:"): "D:P:<bucket>" hits of a non-empty bucket (bucket =
time / P), "D:P:t" their sum, "D:P:o" oldest bucket, "D:P:n" newest. The
buckets at the window's start (`oldest`) and at now (`cur`) are read with
the markers; another bucket is read only when the clock stepped back or a
refund reaches it.
]]

--[[ layout sliding after state:
  SW_DURATION     D
  SW_PRECISION    P
  SW_OLDEST       the bucket at the window's start
  SW_CUR          the bucket of now
  SW_TOTAL        the hits of every stored bucket ("t")
  SW_LOW          the oldest stored bucket ("o"), or nil
  SW_HIGH         the newest stored bucket ("n"), or nil
  SW_OLDEST_HITS  the hits of bucket SW_OLDEST, or nil
  SW_CUR_HITS     the hits of bucket SW_CUR, or nil
  SW_OTHERS       other buckets read: bucket -> hits (a table made when
                  needed)
  SW_CUR_TEXT     SW_CUR formatted (its field's name ends with it, and a
                  marker that moves to it takes it as its value: a
                  string.format costs more than the arithmetic)
]]

--[[ layout sliding_fields: the names 'new' appends to the key's HMGET, from
  the state's S_AT (x[st[S_AT] + SWF_TOTAL] is the total in the HMGET's reply)
  SWF_TOTAL       "t"
  SWF_LOW         "o"
  SWF_HIGH        "n"
  SWF_OLDEST      bucket SW_OLDEST
  SWF_CUR         bucket SW_CUR
]]

-- Built only when the request names this algorithm. What the common path
-- does not use is reached through its global, not captured: every upvalue
-- a function captures costs on every call (see prelude.lua). The ops are
-- tested in the order a decision asks them, the batch's per run first.
local sliding_window
sliding_window = uses_sliding and function(op, st, l, x)
  if op == 'load' then
    local i, oldest = st[S_AT], st[SW_OLDEST]
    -- A missing field is false; the others are parsed by arithmetic (see
    -- prelude.lua).
    local t, o, n = (x[i + SWF_TOTAL] or 0) + 0, x[i + SWF_LOW], x[i + SWF_HIGH]
    local c_oldest, c_cur = x[i + SWF_OLDEST], x[i + SWF_CUR]
    o, n = o and o + 0, n and n + 0
    st[SW_TOTAL], st[SW_LOW], st[SW_HIGH] = t, o, n
    st[SW_OLDEST_HITS], st[SW_CUR_HITS] = c_oldest and c_oldest + 0, c_cur and c_cur + 0
    st[SW_OTHERS] = false
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
            first = o + j - 1
          end
        end
      end
      if t > 0 and first then
        st[SW_TOTAL], st[SW_LOW] = t, first
        write(k, f .. 't', fmt('%d', t))
        write(k, f .. 'o', fmt('%d', first))
      else
        st[SW_TOTAL], st[SW_LOW], st[SW_HIGH] = 0, nil, nil
        del[#del + 1], del[#del + 2], del[#del + 3] = f .. 't', f .. 'o', f .. 'n'
        return 0
      end
      t, o = st[SW_TOTAL], st[SW_LOW]
    end
    -- What the window holds (as 'count', inline on this path).
    local p, c = st[SW_PRECISION], st[SW_OLDEST_HITS]
    local inside = (oldest + 1) * p - (now - st[SW_DURATION])
    if t > 0 and o == oldest and c and inside < p then
      return t - c + math.ceil(c * inside / p)
    end
    return t
  elseif op == 'add' then
    local t = st[SW_TOTAL]
    local hits = math.min(x, MAX_HITS - t)
    if hits == 0 then
      return -1, 0
    end
    local k, b = st[S_KEY], st[SW_CUR]
    if t > 0 and st[SW_HIGH] >= b then
      b = st[SW_HIGH] -- the clock stepped back: add to the newest bucket
    end
    -- The field names read by 'new' are reused: making a string costs more
    -- than the arithmetic.
    local at, c = K_FIELDS - 1 + st[S_AT], nil
    if b == st[SW_CUR] then
      c = (st[SW_CUR_HITS] or 0) + hits
      st[SW_CUR_HITS] = c
      if b == st[SW_OLDEST] then
        st[SW_OLDEST_HITS] = c -- P is not shorter than D: one bucket is both
      end
      -- The total is the bucket's count when it is the only one.
      local w, cs = K_FIELDS - 1 + k[K_READS] + k[K_WRITES], fmt('%d', c)
      k[w + 1], k[w + 2], k[w + 3] = k[at + SWF_CUR], cs, k[at + SWF_TOTAL]
      k[w + 4] = c == t + hits and cs or fmt('%d', t + hits)
      k[K_WRITES] = k[K_WRITES] + 4
    else
      c = (sliding_window('bucket', st, nil, b) or 0) + hits
      sliding_window('put', st, c, b)
      write(k, st[S_PREFIX] .. fmt('%d', b), fmt('%d', c))
      write(k, k[at + SWF_TOTAL], fmt('%d', t + hits))
    end
    -- The markers are written only when they change; so is the HASH's
    -- expiry, which then moves (a new newest bucket).
    local grew = t == 0 or st[SW_HIGH] ~= b
    if grew then
      local sb = b == st[SW_CUR] and st[SW_CUR_TEXT] or fmt('%d', b)
      if t == 0 then
        st[SW_LOW] = b
        write(k, k[at + SWF_LOW], sb)
      end
      st[SW_HIGH] = b
      write(k, k[at + SWF_HIGH], sb)
    end
    st[SW_TOTAL] = t + hits
    return b, grew and (b + 1) * st[SW_PRECISION] + st[SW_DURATION] or 0
  elseif op == 'report' then
    -- The reset: when the oldest bucket leaves the window. Then for how
    -- long no hit at all can fit; exact or shorter, and never past the
    -- reset nor, for an empty counter, the next bucket (see Rust's
    -- full_for).
    local requests, d, p = l[L_REQUESTS], st[SW_DURATION], st[SW_PRECISION]
    local oldest, t, o, c = st[SW_OLDEST], st[SW_TOTAL], st[SW_LOW], st[SW_OLDEST_HITS]
    if t == 0 then
      local reset = (st[SW_CUR] + 1) * p + d - now
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
      -- Hits of the straddling bucket that may still leave before one
      -- fits: (requests - 1 - others) * p / c, rounded down.
      local q = idiv((requests - 1 - others) * p, c)
      return reset, inside - math.min(q, inside)
    elseif t >= requests then
      return reset, math.max(o * p + d - now, 0)
    end
    return reset, 0
  elseif op == 'new' then
    local k, d = st, l[L_DURATION]
    local p = ARGV[l[L_ARG] + 3] + 0
    local oldest, cur = math.floor((now - d) / p), math.floor(now / p)
    local n = k[K_READS]
    local at = K_FIELDS - 1 + n
    k[at + SWF_TOTAL], k[at + SWF_LOW], k[at + SWF_HIGH] = x .. 't', x .. 'o', x .. 'n'
    local sc = fmt('%d', cur)
    k[at + SWF_OLDEST], k[at + SWF_CUR] = x .. fmt('%d', oldest), x .. sc
    k[K_READS] = n + SWF_CUR -- its last field
    return {
      [S_ALG] = sliding_window, [S_KEY] = k, [S_AT] = n, [S_USED] = 0, [S_PENDING] = 0,
      [S_FIRST] = 0, [S_PREFIX] = x, [SW_DURATION] = d, [SW_PRECISION] = p,
      [SW_OLDEST] = oldest, [SW_CUR] = cur, [SW_TOTAL] = 0, [SW_LOW] = false, [SW_HIGH] = false,
      [SW_OLDEST_HITS] = false, [SW_CUR_HITS] = false, [SW_OTHERS] = false, [SW_CUR_TEXT] = sc,
    }
  elseif op == 'count' then
    -- What the window holds: its live buckets, and the straddling one in
    -- proportion to the part of it still inside.
    local t, p, c = st[SW_TOTAL], st[SW_PRECISION], st[SW_OLDEST_HITS]
    local inside = (st[SW_OLDEST] + 1) * p - (now - st[SW_DURATION])
    if t > 0 and st[SW_LOW] == st[SW_OLDEST] and c and inside < p then
      return t - c + math.ceil(c * inside / p)
    end
    return t
  elseif op == 'prefix' then
    return st .. ':' .. l .. ':'
  elseif op == 'give' then
    -- The newest buckets first (see Rust's State::refund).
    local k, f, b, hits, left = st[S_KEY], st[S_PREFIX], st[SW_HIGH], x, nil
    while hits > 0 and st[SW_TOTAL] > 0 and b and b >= st[SW_LOW] do
      local c = sliding_window('bucket', st, nil, b)
      if c and c > 0 then
        local take = math.min(c, hits)
        c, hits, st[SW_TOTAL] = c - take, hits - take, st[SW_TOTAL] - take
        -- Written even when 0 (deletes run before writes and could undo
        -- an earlier write of this request); an empty bucket counts nothing.
        sliding_window('put', st, c, b)
        write(k, f .. fmt('%d', b), fmt('%d', c))
        left = c > 0 and b or nil
      end
      b = b - 1
    end
    -- A total of 0 is an empty window whatever `o` and `n` say. Otherwise
    -- `n` moves down to the newest bucket left with hits, as Rust drops
    -- emptied buckets: a clock behind it then adds to that one.
    if st[SW_TOTAL] > 0 and b and b < st[SW_HIGH] then
      while not left and b >= st[SW_LOW] do
        local c = sliding_window('bucket', st, nil, b)
        left = c and c > 0 and b or nil
        b = b - 1
      end
      if left and left < st[SW_HIGH] then
        st[SW_HIGH] = left
        write(k, f .. 'n', fmt('%d', left))
      end
    end
    write(k, f .. 't', fmt('%d', st[SW_TOTAL]))
    return sliding_window('count', st)
  elseif op == 'bucket' then
    -- Hits of bucket x: known for `cur` and `oldest`, read once otherwise.
    if x == st[SW_CUR] then
      return st[SW_CUR_HITS]
    elseif x == st[SW_OLDEST] then
      return st[SW_OLDEST_HITS]
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
    if x == st[SW_CUR] then
      st[SW_CUR_HITS] = l
    end
    if x == st[SW_OLDEST] then
      st[SW_OLDEST_HITS] = l
    end
    if x ~= st[SW_CUR] and x ~= st[SW_OLDEST] then
      st[SW_OTHERS][x] = l
    end
  elseif op == 'undo' then
    -- refund.lua: the hits counted in the bucket decide.lua answered come
    -- back; an emptied bucket goes, and the markers move to the buckets
    -- that are left.
    local key, f, slot, hits = st, x, ARGV[l + 4] + 0, ARGV[l + 5] + 0
    local c = redis.call('HGET', key, f .. fmt('%d', slot))
    if not c then
      return 0
    end
    c = c + 0
    local take = math.min(c, hits)
    local s = redis.call('HMGET', key, f .. 't', f .. 'o', f .. 'n')
    local t, o, n = s[1] - take, s[2] + 0, s[3] + 0
    if c - take > 0 then
      redis.call('HSET', key, f .. fmt('%d', slot), fmt('%d', c - take), f .. 't', fmt('%d', t))
    elseif t <= 0 then
      redis.call('HDEL', key, f .. fmt('%d', slot), f .. 't', f .. 'o', f .. 'n')
    else
      redis.call('HDEL', key, f .. fmt('%d', slot))
      if slot == o then
        for b = o + 1, n do
          if redis.call('HEXISTS', key, f .. fmt('%d', b)) == 1 then
            o = b
            break
          end
        end
      end
      if slot == n then
        for b = n - 1, o, -1 do
          if redis.call('HEXISTS', key, f .. fmt('%d', b)) == 1 then
            n = b
            break
          end
        end
      end
      redis.call('HSET', key, f .. 't', fmt('%d', t), f .. 'o', fmt('%d', o), f .. 'n', fmt('%d', n))
    end
    return 1
  end
end
