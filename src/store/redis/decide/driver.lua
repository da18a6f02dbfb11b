--[[ The request: read every counter once, check every limit (pass 1),
decide admission (Rust's limiter::admits), count or not and report (pass
2), write. Each algorithm answers through its function (see the operations
and the records in prelude.lua).

A request of one key with one limit (every descriptor with one limit, the
default's shape) takes the single path through the reads and both passes:
the same steps for one item and one limit, without the limit records and
the loops over them, which cost more than the limit's own arithmetic
(callgrind: 126,000 -> 108,000 instructions for the default sliding
window). Admission and the writes are one code for both paths.
]]

-- The reply: applied, then per limit from r + 1 (r = (j - 1) * width +
-- 1): used, pending, over, reset, full, slot ("after" values; see
-- prelude.lua), and for a Cluster part reset_before and full_before. Every
-- value costs Redis and the caller's parser.
local width = whole and 6 or 8
-- `only` is the single path's key record; `one_*` its item, algorithm,
-- state, limit and use between the passes (it makes no item record).
local reply, only, one_role, one_hits, one_over, one_alg, one_st, one_l, one_used, one_loaded
if single then
  local role, hits, code = ARGV[3], ARGV[4] + 0, ARGV[8]
  local alg = code == '0' and sliding_window or code == '1' and fixed_window
    or code == '2' and token_bucket or sliding_log
  -- The key record as request.lua makes it; the limit record without its
  -- item (no algorithm reads it).
  only = { KEYS[1], 1, 0, false, 0, 0, 1, 'x', false, false, false, false, false, false, false, false, false }
  local l = { false, false, ARGV[6] + 0, ARGV[7] + 0, 6 }
  local st = alg('new', only, l, alg('prefix', ARGV[7], ARGV[9]))

  -- Read and pass 1: nothing is pending on the counter.
  local v = call('HMGET', KEYS[1], unpack(only, 8, 7 + only[2]))
  only[6] = v[1]
  local loaded = alg('load', st, nil, v)
  local used, over = loaded or alg('used', st, l), false
  if role ~= '3' then -- a refund only gives back
    if loaded then
      over = used + hits > l[3]
    else
      over = not alg('fits', st, l, hits)
    end
  end

  one_role, one_hits, one_over = role, hits, over
  one_alg, one_st, one_l, one_used, one_loaded = alg, st, l, used, loaded
else
  -- Plan the reads: one state per distinct counter (a counter named twice,
  -- by two limits with one window, is one state).
  for j = 1, nl do
    local l = limits[j]
    local arg, k = l[5], l[1][1]
    local code = ARGV[arg + 2]
    local alg = code == '0' and sliding_window or code == '1' and fixed_window
      or code == '2' and token_bucket or sliding_log
    local f = alg('prefix', ARGV[arg + 1], ARGV[arg + 3])
    local st
    for i = 1, j - 1 do
      local other = limits[i][2]
      if other[2] == k and other[7] == f then
        st = other
        break
      end
    end
    if not st then
      st = alg('new', k, l, f)
      st[6] = j
    end
    l[2] = st
  end

  -- Read: one HMGET per key; then every state takes its values and is
  -- brought to now.
  for i = 1, #KEYS do
    local k = items[i][1]
    if k[7] == i and k[2] > 1 then
      local v = call('HMGET', k[1], unpack(k, 8, 7 + k[2]))
      k[6] = v[1] -- parsed only if some counter needs the HASH to live longer
      for j = 1, nl do
        local st = limits[j][2]
        if st[6] == j and st[2] == k then
          st[4] = st[1]('load', st, nil, v)
        end
      end
    end
  end

  -- Pass 1: check every limit as if every earlier limit of the request had
  -- been counted (a request may name one counter twice). What each limit
  -- reports goes straight into the reply (its layout: above).
  reply = { 0 }
  for j = 2, 1 + width * nl do
    reply[j] = 0 -- in order, so that the reply stays one array
  end
  for j = 1, nl do
    local l, r = limits[j], (j - 1) * width + 1
    local st, item = l[2], l[1]
    local used, over = st[4] or st[1]('used', st, l), false
    reply[r + 1], reply[r + 2] = used, st[5]
    if item[2] ~= '3' then -- a refund only gives back
      local hits = st[5] + item[3]
      if st[4] then
        over = used + hits > l[3]
      else
        over = not st[1]('fits', st, l, hits)
      end
      st[5] = hits
      item[4] = item[4] or over
    end
    reply[r + 3] = over and 1 or 0
  end
end

-- Admission, the one place this script writes the rule (Rust's
-- limiter::admits): no enforcing item over, and not every quota item over.
-- Refunds take no part. A Cluster part ("part") leaves the quota rule to
-- its caller, who sees every part.
local enforce_over, quota_seen, quota_all_over = false, false, true
for i = 1, #KEYS do
  local role, over = one_role, one_over
  if not single then
    role, over = items[i][2], items[i][4]
  end
  if role == '0' or role == '4' then
    enforce_over = enforce_over or over
  elseif role == '2' or role == '6' then
    quota_seen, quota_all_over = true, quota_all_over and over
  end
end
local applied = not enforce_over and not (whole and quota_seen and quota_all_over)

-- Pass 2 and the reply.
if single then
  local role, hits, over = one_role, one_hits, one_over
  local alg, st, l, used = one_alg, one_st, one_l, one_used
  -- "Before" (a Cluster part's only) is the counter as read, unless what
  -- the request did stands whatever it decides (a refund, an always-counted
  -- debit: role codes 3 and up): then it is "after".
  local reset_before, full_before
  if not whole and role < '3' then
    reset_before, full_before = alg('report', st, l)
  end
  local slot, counted = -1, 0
  if role == '3' then
    used = alg('give', st, l, hits)
  elseif applied or role >= '4' then
    counted = hits
  end
  reply = { applied and 1 or 0, used, 0, over and 1 or 0, 0, 0, -1 }
  -- Coalesced requests (a whole call's ARGV from 10; see prelude.lua): each
  -- decided in turn, as if every earlier admitted one were counted (an
  -- enforcing request alone is admitted exactly when it fits), and all
  -- counted at once below.
  for i = 10, #ARGV do
    local h = ARGV[i] + 0
    local fits
    if one_loaded then
      fits = used + counted + h <= l[3]
    else
      fits = alg('fits', st, l, counted + h)
    end
    if fits then
      counted = counted + h
    end
    reply[i - 2] = fits and 0 or 1
  end
  if counted > 0 then
    local until_ms
    slot, until_ms = alg('add', st, l, counted)
    if until_ms > only[5] then
      only[5] = until_ms
    end
  end
  local reset, full = alg('report', st, l)
  reply[5], reply[6], reply[7] = reset, full, slot
  if not whole then
    reply[8], reply[9] = reset_before or reset, full_before or full
  end
  if alg == sliding_log and st[14] then
    sliding_log('save', st)
  end
else
  reply[1] = applied and 1 or 0
  -- Pass 2: count everything, or nothing, and report. Two phases, in request
  -- order within each: first what stands whatever the request decides (refunds
  -- and always-counted debits: role codes 3 and up), then the debits counted
  -- only with an admitted request. Every store counts in this order, so a
  -- counter shared by both kinds reports the same anywhere.
  for phase = 1, 2 do
    for j = 1, nl do
      local l = limits[j]
      local st, item = l[2], l[1]
      if (phase == 1) == (item[2] >= '3') then
        local slot, hits, r = -1, item[3], (j - 1) * width + 1
        if item[2] == '3' then
          reply[r + 1], reply[r + 2] = st[1]('give', st, l, hits), 0
        elseif hits > 0 and (applied or item[2] >= '4') then
          local until_ms
          slot, until_ms = st[1]('add', st, l, hits)
          if until_ms > st[2][5] then
            st[2][5] = until_ms
          end
        end
        reply[r + 4], reply[r + 5] = st[1]('report', st, l)
        reply[r + 6] = slot
      end
    end
    -- "Before" values matter only for a Cluster part that may be refunded (it
    -- then stands as after the first phase): a whole request reports "after"
    -- only.
    if phase == 1 and not whole then
      for j = 1, nl do
        local l, r = limits[j], (j - 1) * width + 1
        if l[1][2] >= '3' then
          reply[r + 7], reply[r + 8] = reply[r + 4], reply[r + 5]
        else
          reply[r + 7], reply[r + 8] = l[2][1]('report', l[2], l)
        end
      end
    end
  end

  -- What a state kept back until every operation was done (a sliding log).
  for j = 1, nl do
    local st = limits[j][2]
    if st[6] == j and st[1] == sliding_log and st[14] then
      sliding_log('save', st)
    end
  end
end

-- Write: at most one HDEL, one HSET and one PEXPIRE(AT) per key.
for i = 1, #KEYS do
  local k = single and only or items[i][1]
  if k[7] == i then -- once per key
    if k[4] then
      call('HDEL', k[1], unpack(k[4]))
    end
    -- The HASH must live until k[5] and one second more (which covers
    -- clock differences between replicas in "local" time mode); "x" says
    -- until when it does. When that must move, it moves half as far again
    -- (the same for every shape), so that a counter that keeps getting hits
    -- moves it about once per half window rather than with every new
    -- bucket (a PEXPIRE costs as much as an HSET): an idle HASH lives at
    -- most half its longest window longer than it must.
    local extend = k[5] > 0 and k[5] + 1000 > (k[6] or 0) + 0
    local at, xs
    if extend then
      at = k[5] + 1000 + floor((k[5] - now) / 2)
      xs = fmt('%d', at)
      write(k, 'x', xs)
    end
    -- HSET first: PEXPIRE on a key that does not exist yet does nothing.
    if k[3] > 0 then
      call('HSET', k[1], unpack(k, 8 + k[2], 7 + k[2] + k[3]))
    end
    if extend then
      if ARGV[1] == '' then
        -- Redis's clock is the script's: the time "x" holds is the expiry.
        call('PEXPIREAT', k[1], xs)
      else
        call('PEXPIRE', k[1], fmt('%d', at - now))
      end
    end
  end
end

return reply
