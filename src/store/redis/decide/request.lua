--[[ The request as ARGV gives it: one item per key of KEYS, and its limits.
Parsed before the algorithms are defined, so that only the functions of the
algorithms it names are built (see prelude.lua on what a function costs).
]]

-- One record per distinct key (one HMGET, one HSET), one per item, one per
-- limit (records: see prelude.lua); the states are planned by the driver.
local items, limits, nl, a = {}, {}, 0, 3
local uses_sliding, uses_fixed, uses_bucket, uses_log = false, false, false, false
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
