--[[ token_bucket (src/limiter/algorithm/token_bucket.rs): GCRA over one
theoretical arrival time, counted in ticks of 1/requests ms so that a token
is exactly D ticks (exact integer arithmetic). What is in use depends on the
limit's own numbers, so it is answered per limit ('used'), not per state.

Fields (prefix "D:b<burst>:"): "D:b<burst>:a" the theoretical arrival time,
whole ms, and "D:b<burst>:r" its remainder in ticks.

State slots from 8: burst, arrival time (ms), remainder (ticks).
]]

-- Exact floor division of non-negative integers below 2^53 (a double
-- quotient can round onto the next integer).
local idiv = uses_bucket and function(a, b)
  local q = floor(a / b)
  if q * b > a then
    q = q - 1
  elseif (q + 1) * b <= a then
    q = q + 1
  end
  return q
end

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
  local requests, d = l and l[3], l and l[4]
  if op == 'ahead' then
    -- How far the arrival time is ahead of now, in ticks (0 when the
    -- bucket is full).
    if requests > 0 and (st[9] > now or (st[9] == now and st[10] > 0)) then
      return (st[9] - now) * requests + st[10]
    end
    return 0
  elseif op == 'used' then
    if requests == 0 or d == 0 then
      return 0
    end
    return min(ceil_div(token_bucket('ahead', st, l), d), st[8])
  elseif op == 'fits' then
    if x == 0 then
      -- A check: refused only while in debt past the burst.
      return requests == 0 or token_bucket('ahead', st, l) <= st[8] * d
    end
    if requests == 0 or x > st[8] then
      return false
    end
    return token_bucket('ahead', st, l) + x * d <= st[8] * d
  elseif op == 'add' then
    if requests == 0 then
      return -1, 0
    end
    local a, hits = token_bucket('ahead', st, l), x
    if a == 0 then
      st[9], st[10] = now, 0
    end
    if d > 0 then
      hits = min(hits, idiv(max(MAX_AHEAD - a, 0), d))
    end
    if hits == 0 then
      return -1, 0
    end
    local total = st[10] + hits * d
    local ms = idiv(total, requests)
    st[9], st[10] = st[9] + ms, total - ms * requests
    write(st[2], st[7] .. 'a', fmt('%d', st[9]))
    write(st[2], st[7] .. 'r', fmt('%d', st[10]))
    if st[10] > 0 then
      return 0, st[9] + 1
    end
    return 0, st[9]
  elseif op == 'give' then
    if requests == 0 or x == 0 then
      return token_bucket('used', st, l)
    end
    local a, back = token_bucket('ahead', st, l), x * d
    if back >= a then
      st[9], st[10] = now, 0
    else
      local left = a - back
      local ms = idiv(left, requests)
      st[9], st[10] = now + ms, left - ms * requests
    end
    write(st[2], st[7] .. 'a', fmt('%d', st[9]))
    write(st[2], st[7] .. 'r', fmt('%d', st[10]))
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
    st[9], st[10] = (x[st[3]] or 0) + 0, (x[st[3] + 1] or 0) + 0
    return nil -- in use: per limit, see 'used'
  elseif op == 'new' then
    local k, n = st, st[2]
    k[8 + n], k[9 + n] = x .. 'a', x .. 'r'
    k[2] = n + 2
    return { token_bucket, k, n + 1, 0, 0, 0, x, ARGV[l[5] + 3] + 0, 0, 0 }
  elseif op == 'prefix' then
    return st .. ':b' .. l .. ':'
  end
end
