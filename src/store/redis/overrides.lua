--[[ Sluice: limits set at run time (the admin /overrides API). Every
override of every domain is one field of one HASH, so that one HGETALL loads
them all; a counter beside it changes on every write, so that replicas poll
one GET and reload only on change. Both keys carry the same hash tag (one
Cluster slot).

KEYS[1]   the HASH: field = the descriptor's canonical name, value = the
          override as JSON (with its domain and expires_at_ms). The
          version counter is KEYS[1] .. ':version' (the same hash tag, so
          the same Cluster slot).
ARGV[1]   the operation:
  version                      -> {version}
  load                         -> the JSON text {"version":V,"all":[…]}
  put FIELD JSON DOMAIN MAX NOW -> {"full":false,"before":OLD|null}, or
                                  {"full":true} when DOMAIN has MAX live
                                  overrides and FIELD is not one of them
  delete FIELD                 -> {"before":OLD|null}
Text replies are padded with spaces to a multiple of 8 bytes: the store
reads a string reply as packed 8-byte integers, and JSON ignores the
padding.
]]

local function text(s)
  local pad = (8 - #s % 8) % 8
  return s .. string.rep(' ', pad)
end

local op = ARGV[1]
local version_key = KEYS[1] .. ':version'

if op == 'version' then
  return { tonumber(redis.call('GET', version_key) or '0') }
end

if op == 'load' then
  local version = tonumber(redis.call('GET', version_key) or '0')
  local values = redis.call('HVALS', KEYS[1])
  return text('{"version":' .. version .. ',"all":[' .. table.concat(values, ',') .. ']}')
end

if op == 'put' then
  local field, value, domain = ARGV[2], ARGV[3], ARGV[4]
  local max, now = tonumber(ARGV[5]), tonumber(ARGV[6])
  local before = redis.call('HGET', KEYS[1], field)
  if not before then
    -- A new descriptor: drop expired overrides, then count the domain's.
    local all = redis.call('HGETALL', KEYS[1])
    local count = 0
    for i = 1, #all, 2 do
      local o = cjson.decode(all[i + 1])
      if type(o.expires_at_ms) == 'number' and o.expires_at_ms <= now then
        redis.call('HDEL', KEYS[1], all[i])
      elseif o.domain == domain then
        count = count + 1
      end
    end
    if count >= max then
      return text('{"full":true}')
    end
  end
  redis.call('HSET', KEYS[1], field, value)
  redis.call('INCR', version_key)
  return text('{"full":false,"before":' .. (before or 'null') .. '}')
end

if op == 'delete' then
  local before = redis.call('HGET', KEYS[1], ARGV[2])
  if before then
    redis.call('HDEL', KEYS[1], ARGV[2])
    redis.call('INCR', version_key)
  end
  return text('{"before":' .. (before or 'null') .. '}')
end

return redis.error_reply('overrides.lua: unknown operation ' .. tostring(op))
