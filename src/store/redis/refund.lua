--[[ Sluice: take back hits that decide.lua counted in "part" mode, when the
request as a whole was rejected by another slot of a Redis Cluster.

KEYS[i]   the HASH of the i-th identity to refund.
ARGV      per item, in KEYS order: number of limits; then per limit:
          duration_ms, algorithm (0 sliding_window, 1 fixed_window),
          precision_ms, slot (the bucket or window index decide.lua
          returned), hits.
Reply:    the number of limits refunded.

A bucket that already left the window has nothing left to refund. Emptied
buckets are deleted and the oldest/newest markers kept exact, so the state is
as if the hits had never been counted.
]]

local refunded, a = 0, 1
for i = 1, #KEYS do
  local key = KEYS[i]
  local count = tonumber(ARGV[a])
  a = a + 1
  for _ = 1, count do
    local d, sliding, p = ARGV[a], ARGV[a + 1] == '0', ARGV[a + 2]
    local slot, hits = tonumber(ARGV[a + 3]), tonumber(ARGV[a + 4])
    a = a + 5
    if sliding then
      local f = d .. ':' .. p .. ':'
      local c = tonumber(redis.call('HGET', key, f .. slot))
      if c then
        local take = math.min(c, hits)
        local s = redis.call('HMGET', key, f .. 't', f .. 'o', f .. 'n')
        local t, o, n = tonumber(s[1]) - take, tonumber(s[2]), tonumber(s[3])
        if c - take > 0 then
          redis.call('HINCRBY', key, f .. slot, -take)
          redis.call('HSET', key, f .. 't', t)
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
        refunded = refunded + 1
      end
    else
      local f = d .. ':f:'
      local s = redis.call('HMGET', key, f .. 'w', f .. 'c')
      if tonumber(s[1]) == slot then
        local c = math.max(0, (tonumber(s[2]) or 0) - hits)
        redis.call('HSET', key, f .. 'c', c)
        refunded = refunded + 1
      end
    end
  end
end
return refunded
