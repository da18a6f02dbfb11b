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

Built by build.rs (build/lua.rs) as decide.lua is: the marker lines below
stand for decide/prelude.lua and for the algorithms' parts, whose 'undo'
operation does the work (each algorithm's fields and arithmetic are written
once, in its own part).
]]

-- @@ prelude @@

-- Not decide.lua's request: every algorithm is built (a refund is rare, and
-- each 'undo' reads and writes its own fields), and no operation of a refund
-- reads the clock.
local now, uses_sliding, uses_fixed, uses_bucket, uses_log, uses_calendar = false, true, true, true, true, true

-- @@ algorithms @@

local refunded, a = 0, 1
for i = 1, #KEYS do
  local key = KEYS[i]
  local count = ARGV[a] + 0
  a = a + 1
  for _ = 1, count do
    local code = ARGV[a + 2]
    local alg = code == '0' and sliding_window or code == '1' and fixed_window
      or code == '2' and token_bucket or code == '4' and calendar_window or sliding_log
    refunded = refunded + alg('undo', key, a, alg('prefix', ARGV[a + 1], ARGV[a + 3]))
    a = a + 6
  end
end
return { refunded }
