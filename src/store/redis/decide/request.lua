--[[ The request as ARGV gives it: one item per key of KEYS, and its limits.
Parsed before the algorithms are defined, so that only the functions of the
algorithms it names are built (see prelude.lua on what a function costs).
]]

-- One key with one limit (every descriptor with one limit, the default's
-- shape) takes the driver's single path, which makes no item and limit
-- records: only the algorithm it names is noted here.
local single = #KEYS == 1 and ARGV[5] == '1'

-- Otherwise one record per distinct key (one HMGET, one HSET), one per item,
-- one per limit (records: see prelude.lua); the states are planned by the
-- driver.
local items, limits, nl, a = false, false, 0, 3
local uses_sliding, uses_fixed, uses_bucket, uses_log = false, false, false, false
if single then
  local alg = ARGV[8]
  uses_sliding, uses_fixed, uses_bucket = alg == '0', alg == '1', alg == '2'
  uses_log = not (uses_sliding or uses_fixed or uses_bucket)
else
  items, limits = {}, {}
  for i = 1, #KEYS do
    local key, k = KEYS[i], nil
    for j = 1, i - 1 do
      if items[j][1][1] == key then
        k = items[j][1]
        break
      end
    end
    if not k then
      -- Sized for one sliding window: a table that grows is reallocated.
      k = { key, 1, 0, false, 0, 0, i, 'x', false, false, false, false, false, false, false, false, false }
    end
    -- The role code is one digit, compared as a string: 0 enforce, 1 shadow,
    -- 2 quota, 3 refund, plus 4 when counted always.
    items[i] = { k, ARGV[a], ARGV[a + 1] + 0, false }
    local count = ARGV[a + 2] + 0
    a = a + 3
    for _ = 1, count do
      local alg = ARGV[a + 2]
      if alg == '0' then
        uses_sliding = true
      elseif alg == '1' then
        uses_fixed = true
      elseif alg == '2' then
        uses_bucket = true
      else
        uses_log = true
      end
      nl = nl + 1
      limits[nl] = { items[i], false, ARGV[a] + 0, ARGV[a + 1] + 0, a }
      a = a + 4
    end
  end
end
