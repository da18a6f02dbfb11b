--[[ Sluice: take back hits that decide.lua counted in "part" mode, when the
request as a whole was rejected by another slot of a Redis Cluster.

KEYS[i]   the HASH of the i-th identity to refund.
ARGV      per item, in KEYS order: number of limits; then per limit:
          requests, duration_ms, algorithm, param (as in decide.lua), slot
          (what decide.lua returned), hits.
Reply:    {n}, n the number of limits refunded (a list, as every script's
          reply is read).

Hits already gone from the window have nothing left to refund. Emptied
buckets and log entries are deleted and the markers kept exact, so the state
is as if the hits had never been counted (a token bucket gets its tokens
back).
]]

local floor = math.floor

-- Exact ceil division of non-negative integers below 2^53.
local function ceil_div(a, b)
  local q = floor(a / b)
  if q * b > a then
    q = q - 1
  elseif (q + 1) * b <= a then
    q = q + 1
  end
  if q * b < a then
    q = q + 1
  end
  return q
end

local function sliding(key, f, slot, hits)
  local c = tonumber(redis.call('HGET', key, f .. slot))
  if not c then
    return 0
  end
  local take = math.min(c, hits)
  local s = redis.call('HMGET', key, f .. 't', f .. 'o', f .. 'n')
  local t, o, n = tonumber(s[1]) - take, tonumber(s[2]), tonumber(s[3])
  if c - take > 0 then
    redis.call('HSET', key, f .. slot, c - take, f .. 't', t)
  elseif t <= 0 then
    redis.call('HDEL', key, f .. slot, f .. 't', f .. 'o', f .. 'n')
  else
    redis.call('HDEL', key, f .. slot)
    if slot == o then
      for b = o + 1, n do
        if redis.call('HEXISTS', key, f .. b) == 1 then
          o = b
          break
        end
      end
    end
    if slot == n then
      for b = n - 1, o, -1 do
        if redis.call('HEXISTS', key, f .. b) == 1 then
          n = b
          break
        end
      end
    end
    redis.call('HSET', key, f .. 't', t, f .. 'o', o, f .. 'n', n)
  end
  return 1
end

local function log(key, f, slot, hits)
  local raw = redis.call('HGET', key, f .. 'e')
  if not raw then
    return 0
  end
  local parts, done = {}, 0
  for t, h in string.gmatch(raw, '(%d+):(%d+)') do
    t, h = tonumber(t), tonumber(h)
    if t == slot and done == 0 then
      h = h - math.min(h, hits)
      done = 1
    end
    if h > 0 then
      parts[#parts + 1] = string.format('%d:%d', t, h)
    end
  end
  if #parts > 0 then
    redis.call('HSET', key, f .. 'e', table.concat(parts, ','))
  else
    redis.call('HDEL', key, f .. 'e')
  end
  return done
end

local refunded, a = 0, 1
for i = 1, #KEYS do
  local key = KEYS[i]
  local count = tonumber(ARGV[a])
  a = a + 1
  for _ = 1, count do
    local requests, d, alg, param = tonumber(ARGV[a]), ARGV[a + 1], ARGV[a + 2], ARGV[a + 3]
    local slot, hits = tonumber(ARGV[a + 4]), tonumber(ARGV[a + 5])
    a = a + 6
    if alg == '0' then
      refunded = refunded + sliding(key, d .. ':' .. param .. ':', slot, hits)
    elseif alg == '1' then
      local f = d .. ':f:'
      local s = redis.call('HMGET', key, f .. 'w', f .. 'c')
      if tonumber(s[1]) == slot then
        redis.call('HSET', key, f .. 'c', math.max(0, (tonumber(s[2]) or 0) - hits))
        refunded = refunded + 1
      end
    elseif alg == '2' then
      -- Move the arrival time back by hits tokens (hits × D ticks of
      -- 1/requests ms), borrowing whole milliseconds from its base.
      local f = d .. ':b' .. param .. ':'
      local s = redis.call('HMGET', key, f .. 'a', f .. 'r')
      local base, ticks = tonumber(s[1]), tonumber(s[2]) or 0
      if base and requests > 0 and slot >= 0 then
        -- decide.lua never moves it more than 2^52 ticks (MAX_AHEAD).
        local most = floor(4503599627370496 / tonumber(d))
        local need = math.min(hits, most) * tonumber(d)
        if ticks < need then
          local borrow = ceil_div(need - ticks, requests)
          base, ticks = base - borrow, ticks + borrow * requests
        end
        redis.call('HSET', key, f .. 'a', base, f .. 'r', ticks - need)
        refunded = refunded + 1
      end
    else
      refunded = refunded + log(key, d .. (param == '1' and ':c:' or ':l:'), slot, hits)
    end
  end
end
return { refunded }
