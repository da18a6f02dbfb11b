-- RLQS: one replica's streams' demand for one bucket in, every live
-- stream's demand (all replicas) out. One call per bucket per report.
--
-- KEYS[1]  the bucket's hash: field "<replica>:<stream>", value
--          "<demand>:<expires at, ms>" (demand in micro-requests per second)
-- ARGV[1]  how long a field lives without a refresh, ms
-- ARGV[2]  the calling replica's field prefix ("<replica>:")
-- ARGV[3]  n, the number of fields to write
-- ARGV[4 .. 3+2n]  n pairs: field, demand
-- ARGV[4+2n ..]    fields to delete (streams that left the bucket)
--
-- Reply: the demands (integers) of the live fields of the other replicas.
-- Expired fields (a replica that died, a stream that stopped reporting)
-- are deleted on the way; the hash expires with its last field, so state
-- is bounded by the streams reporting now. Time is Redis's own (one clock
-- for every replica).
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local ttl = tonumber(ARGV[1])
local mine = ARGV[2]
local n = tonumber(ARGV[3])
for i = 0, n - 1 do
  redis.call('HSET', KEYS[1], ARGV[4 + 2 * i], ARGV[5 + 2 * i] .. ':' .. (now + ttl))
end
for i = 4 + 2 * n, #ARGV do
  redis.call('HDEL', KEYS[1], ARGV[i])
end
local all = redis.call('HGETALL', KEYS[1])
local out = {}
local live = 0
for i = 1, #all, 2 do
  local demand, expires = string.match(all[i + 1], '^(%d+):(%d+)$')
  if demand == nil or tonumber(expires) < now then
    redis.call('HDEL', KEYS[1], all[i])
  else
    live = live + 1
    if string.sub(all[i], 1, #mine) ~= mine then
      out[#out + 1] = tonumber(demand)
    end
  end
end
if live == 0 then
  redis.call('DEL', KEYS[1])
else
  redis.call('PEXPIRE', KEYS[1], ttl)
end
return out
