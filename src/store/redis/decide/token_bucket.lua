--[[ token_bucket (src/limiter/algorithm/token_bucket.rs): GCRA over one
theoretical arrival time, counted in ticks of 1/requests ms so that a token
is exactly D ticks (exact integer arithmetic). What is in use depends on the
limit's own numbers, so it is answered per limit ('used'), not per state.

Fields (prefix "D:b<burst>:"): "D:b<burst>:a" the theoretical arrival time,
whole ms, and "D:b<burst>:r" its remainder in ticks.
]]

--[[ layout bucket after state:
  TB_BURST        the burst
  TB_ARRIVAL      the theoretical arrival time (ms)
  TB_REST         its remainder (ticks)
]]

--[[ layout bucket_fields: the names 'new' appends to the key's HMGET, from
  the state's S_AT
  TBF_ARRIVAL     "a"
  TBF_REST        "r"
]]

-- Exact ceiling division of non-negative integers below 2^53.
local ceil_div = uses_bucket and function(a, b)
  local q = idiv(a, b)
  if q * b < a then
    q = q + 1
  end
  return q
end

-- Built only when the request names this algorithm.
local token_bucket
token_bucket = uses_bucket and function(op, st, l, x)
  if op == 'undo' then
    -- refund.lua: the arrival time moves back by the hits' tokens (hits × D
    -- ticks of 1/requests ms), borrowing whole milliseconds from its base;
    -- 'add' never moved it more than MAX_AHEAD ticks.
    -- (Asked first: l is a number here, not a limit.)
    local key, f = st, x
    local requests, d = ARGV[l] + 0, ARGV[l + 1] + 0
    local slot, hits = ARGV[l + 4] + 0, ARGV[l + 5] + 0
    local s = redis.call('HMGET', key, f .. 'a', f .. 'r')
    local base, ticks = s[1] and s[1] + 0, (s[2] or 0) + 0
    if not (base and requests > 0 and slot >= 0) then
      return 0
    end
    local need = min(hits, floor(MAX_AHEAD / d)) * d
    if ticks < need then
      local borrow = ceil_div(need - ticks, requests)
      base, ticks = base - borrow, ticks + borrow * requests
    end
    redis.call('HSET', key, f .. 'a', fmt('%d', base), f .. 'r', fmt('%d', ticks - need))
    return 1
  end
  local requests, d = l and l[L_REQUESTS], l and l[L_DURATION]
  if op == 'ahead' then
    -- How far the arrival time is ahead of now, in ticks (0 when the
    -- bucket is full).
    local arrival = st[TB_ARRIVAL]
    if requests > 0 and (arrival > now or (arrival == now and st[TB_REST] > 0)) then
      return (arrival - now) * requests + st[TB_REST]
    end
    return 0
  elseif op == 'used' then
    if requests == 0 or d == 0 then
      return 0
    end
    return min(ceil_div(token_bucket('ahead', st, l), d), st[TB_BURST])
  elseif op == 'fits' then
    if x == 0 then
      -- A check: refused only while in debt past the burst.
      return requests == 0 or token_bucket('ahead', st, l) <= st[TB_BURST] * d
    end
    if requests == 0 or x > st[TB_BURST] then
      return false
    end
    return token_bucket('ahead', st, l) + x * d <= st[TB_BURST] * d
  elseif op == 'add' then
    if requests == 0 then
      return -1, 0
    end
    local a, hits = token_bucket('ahead', st, l), x
    if a == 0 then
      st[TB_ARRIVAL], st[TB_REST] = now, 0
    end
    if d > 0 then
      hits = min(hits, idiv(max(MAX_AHEAD - a, 0), d))
    end
    if hits == 0 then
      return -1, 0
    end
    local total = st[TB_REST] + hits * d
    local ms = idiv(total, requests)
    st[TB_ARRIVAL], st[TB_REST] = st[TB_ARRIVAL] + ms, total - ms * requests
    write(st[S_KEY], st[S_PREFIX] .. 'a', fmt('%d', st[TB_ARRIVAL]))
    write(st[S_KEY], st[S_PREFIX] .. 'r', fmt('%d', st[TB_REST]))
    if st[TB_REST] > 0 then
      return 0, st[TB_ARRIVAL] + 1
    end
    return 0, st[TB_ARRIVAL]
  elseif op == 'give' then
    if requests == 0 or x == 0 then
      return token_bucket('used', st, l)
    end
    local a, back = token_bucket('ahead', st, l), x * d
    if a == 0 then
      return 0 -- a full bucket: nothing to give back, nothing written
    end
    if back >= a then
      st[TB_ARRIVAL], st[TB_REST] = now, 0
    else
      local left = a - back
      local ms = idiv(left, requests)
      st[TB_ARRIVAL], st[TB_REST] = now + ms, left - ms * requests
    end
    write(st[S_KEY], st[S_PREFIX] .. 'a', fmt('%d', st[TB_ARRIVAL]))
    write(st[S_KEY], st[S_PREFIX] .. 'r', fmt('%d', st[TB_REST]))
    return token_bucket('used', st, l)
  elseif op == 'report' then
    -- The reset: when the next token comes; full until then if no hit fits.
    local a, reset = token_bucket('ahead', st, l), 0
    if a > 0 and d > 0 then
      local tokens = ceil_div(a, d)
      reset = ceil_div(a - (tokens - 1) * d, requests)
    end
    if token_bucket('fits', st, l, 1) then
      return reset, 0
    end
    return reset, reset
  elseif op == 'load' then
    local i = st[S_AT]
    st[TB_ARRIVAL], st[TB_REST] = (x[i + TBF_ARRIVAL] or 0) + 0, (x[i + TBF_REST] or 0) + 0
    return nil -- in use: per limit, see 'used'
  elseif op == 'new' then
    local k, n = st, st[K_READS]
    local at = K_FIELDS - 1 + n
    k[at + TBF_ARRIVAL], k[at + TBF_REST] = x .. 'a', x .. 'r'
    k[K_READS] = n + TBF_REST -- its last field
    return {
      [S_ALG] = token_bucket, [S_KEY] = k, [S_AT] = n, [S_USED] = 0, [S_PENDING] = 0,
      [S_FIRST] = 0, [S_PREFIX] = x, [S_DIRTY] = false, [TB_BURST] = ARGV[l[L_ARG] + 3] + 0,
      [TB_ARRIVAL] = 0, [TB_REST] = 0,
    }
  elseif op == 'prefix' then
    return st .. ':b' .. l .. ':'
  end
end
