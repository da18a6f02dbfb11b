--[[ A prototype, for benches/redis_instructions.sh only (the store never
loads it): what Redis would spend per decision if the decisions that arrive
together shared one script call, whatever their identities. Every key of
KEYS is a request of its own with one enforcing sliding-window limit
(ARGV[6..9], as decide.lua takes it), weights ARGV[4] then ARGV[10..], and
each is decided in turn by decide.lua's single path, reading what the
earlier ones wrote. The harness assembles it as prelude.lua, this file with
sliding_window.lua in place of the marker below; no refunds, no other
algorithm or role, no Cluster parts.
]]
local single, uses_sliding, uses_fixed, uses_bucket, uses_log = false, true, false, false, false
-- @@ sliding_window @@
local alg = sliding_window
local prefix = alg('prefix', ARGV[7], ARGV[9])
local requests = ARGV[6] + 0
local reply = { 1 }
for m = 1, #KEYS do
  local key = KEYS[m]
  local hits = (m == 1 and ARGV[4] or ARGV[8 + m]) + 0
  local k = { key, 1, 0, false, 0, 0, 1, 'x', false, false, false, false, false, false, false, false, false }
  local l = { false, false, requests, ARGV[7] + 0, 6 }
  local st = alg('new', k, l, prefix)
  local v = call('HMGET', key, unpack(k, 8, 7 + k[2]))
  k[6] = v[1]
  local used = alg('load', st, nil, v)
  local over = used + hits > requests
  local slot = -1
  if not over then
    local until_ms
    slot, until_ms = alg('add', st, l, hits)
    if until_ms > k[5] then
      k[5] = until_ms
    end
  end
  local reset, full = alg('report', st, l)
  local r = #reply
  reply[r + 1], reply[r + 2], reply[r + 3] = used, 0, over and 1 or 0
  reply[r + 4], reply[r + 5], reply[r + 6] = reset, full, slot
  -- decide.lua's writes, for this key.
  local extend = k[5] > 0 and k[5] + 1000 > (k[6] or 0) + 0
  local at, xs
  if extend then
    at = k[5] + 1000 + floor((k[5] - now) / 2)
    xs = fmt('%d', at)
    write(k, 'x', xs)
  end
  if k[3] > 0 then
    call('HSET', k[1], unpack(k, 8 + k[2], 7 + k[2] + k[3]))
  end
  if extend then
    if ARGV[1] == '' then
      call('PEXPIREAT', k[1], xs)
    else
      call('PEXPIRE', k[1], fmt('%d', at - now))
    end
  end
end
return reply
