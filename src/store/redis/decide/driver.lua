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

-- An offence of limit l on its counter's block b (Rust's Block::offend):
-- the streak goes on unless forgotten, the block starts now, its fields are
-- written, and the HASH lives until the streak is forgotten. Penalty
-- arguments are bounded by the rules (a year, a factor of 1,000), so every
-- product is an exact double.
local offend = uses_penalty and function(b, l)
  local p, count = l[L_PENALTY], 1
  if now < b[B_FORGET] then
    count = b[B_COUNT] + 1
  end
  local block, escalate, most = ARGV[p] + 0, ARGV[p + 1] + 0, ARGV[p + 2] + 0
  if escalate > 1 then
    for _ = 2, count do
      if block >= most then
        break
      end
      block = block * escalate
    end
  end
  b[B_UNTIL], b[B_COUNT] = now + min(block, most), count
  b[B_FORGET] = b[B_UNTIL] + ARGV[p + 3]
  local k, f = b[B_STATE][S_KEY], b[B_STATE][S_PREFIX]
  write(k, f .. 'pu', fmt('%d', b[B_UNTIL]))
  write(k, f .. 'pc', fmt('%d', count))
  write(k, f .. 'pf', fmt('%d', b[B_FORGET]))
  if b[B_FORGET] > k[K_UNTIL] then
    k[K_UNTIL] = b[B_FORGET]
  end
end

-- The reply: applied, then per limit j at r + R_USED… (r = (j - 1) *
-- width): used, pending, over, reset, full, slot ("after" values; see
-- request.lua), and for a Cluster part reset_before and full_before. Every
-- value costs Redis and the caller's parser.
local width = whole and 6 or 8
-- `only` is the single path's key record; `one_*` its item, algorithm,
-- state, limit and use between the passes (it makes no item record).
local reply, only, one_role, one_hits, one_over, one_alg, one_st, one_l, one_used, one_loaded
if single then
  local role, hits, code = ARGV[3], ARGV[4] + 0, ARGV[8]
  local alg = code == '0' and sliding_window or code == '1' and fixed_window
    or code == '2' and token_bucket or code == '4' and calendar_window or sliding_log
  -- The key record as request.lua makes it; the limit record without its
  -- item (no algorithm reads it).
  only = {
    [K_NAME] = KEYS[1], [K_READS] = 1, [K_WRITES] = 0, [K_DELETES] = false, [K_UNTIL] = 0,
    [K_STORED] = 0, [K_FIRST] = 1, [K_FIELDS] = 'x',
    false, false, false, false, false, false, false, false, false, false, false, false, false, false,
    false, false,
  }
  local l = {
    [L_ITEM] = false, [L_STATE] = false, [L_REQUESTS] = ARGV[6] + 0, [L_DURATION] = ARGV[7] + 0,
    [L_ARG] = 6,
  }
  local st = alg('new', only, l, alg('prefix', ARGV[7], ARGV[9]))

  -- Read and pass 1: nothing is pending on the counter.
  local v = call('HMGET', KEYS[1], unpack(only, K_FIELDS, K_FIELDS - 1 + only[K_READS]))
  only[K_STORED] = v[1]
  local loaded = alg('load', st, nil, v)
  local used, over = loaded or alg('used', st, l), false
  if role ~= '3' then -- a refund only gives back
    if loaded then
      over = used + hits > l[L_REQUESTS]
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
    local arg, k = l[L_ARG], l[L_ITEM][I_KEY]
    local code = ARGV[arg + 2]
    local alg = code == '0' and sliding_window or code == '1' and fixed_window
      or code == '2' and token_bucket or code == '4' and calendar_window or sliding_log
    local f = alg('prefix', ARGV[arg + 1], ARGV[arg + 3])
    local st
    for i = 1, j - 1 do
      local other = limits[i][L_STATE]
      if other[S_KEY] == k and other[S_PREFIX] == f then
        st = other
        break
      end
    end
    if not st then
      st = alg('new', k, l, f)
      st[S_FIRST] = j
    end
    l[L_STATE] = st
    if l[L_PENALTY] then
      -- The counter's block: one per state, its fields read with the key's.
      local b
      for i = 1, j - 1 do
        b = limits[i][L_BLOCK]
        if b and b[B_STATE] == st then
          break
        end
        b = false
      end
      if not b then
        local n = k[K_READS]
        k[K_FIELDS + n], k[K_FIELDS + n + 1], k[K_FIELDS + n + 2] = f .. 'pu', f .. 'pc', f .. 'pf'
        k[K_READS] = n + 3
        b = { [B_STATE] = st, [B_AT] = n, [B_UNTIL] = 0, [B_COUNT] = 0, [B_FORGET] = 0 }
      end
      l[L_BLOCK] = b
    end
  end

  -- Read: one HMGET per key; then every state takes its values and is
  -- brought to now.
  for i = 1, #KEYS do
    local k = items[i][I_KEY]
    if k[K_FIRST] == i and k[K_READS] > 1 then
      local v = call('HMGET', k[K_NAME], unpack(k, K_FIELDS, K_FIELDS - 1 + k[K_READS]))
      k[K_STORED] = v[1] -- parsed only if some counter needs the HASH to live longer
      for j = 1, nl do
        local st = limits[j][L_STATE]
        if st[S_FIRST] == j and st[S_KEY] == k then
          st[S_USED] = st[S_ALG]('load', st, nil, v)
        end
        local b = uses_penalty and limits[j][L_BLOCK]
        if b and st[S_KEY] == k then
          local at = b[B_AT]
          b[B_UNTIL], b[B_COUNT] = (v[at + 1] or 0) + 0, (v[at + 2] or 0) + 0
          b[B_FORGET] = (v[at + 3] or 0) + 0
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
    local l, r = limits[j], (j - 1) * width
    local st, item = l[L_STATE], l[L_ITEM]
    local used, over = st[S_USED] or st[S_ALG]('used', st, l), false
    reply[r + R_USED], reply[r + R_PENDING] = used, st[S_PENDING]
    if item[I_ROLE] ~= '3' then -- a refund only gives back
      local hits = st[S_PENDING] + item[I_HITS]
      if st[S_USED] then
        over = used + hits > l[L_REQUESTS]
      else
        over = not st[S_ALG]('fits', st, l, hits)
      end
      st[S_PENDING] = hits
      local b = l[L_BLOCK]
      if b and b[B_UNTIL] > now then
        over = 2 -- blocked: over whatever the weight
      end
      item[I_OVER] = item[I_OVER] or over
    end
    reply[r + R_OVER] = over == 2 and 2 or over and 1 or 0
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
    role, over = items[i][I_ROLE], items[i][I_OVER]
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
  reply = {
    [R_APPLIED] = applied and 1 or 0, [R_USED] = used, [R_PENDING] = 0,
    [R_OVER] = over and 1 or 0, [R_RESET] = 0, [R_FULL] = 0, [R_SLOT] = -1,
  }
  -- Coalesced requests (a whole call's ARGV from 10; see prelude.lua): each
  -- decided in turn, as if every earlier admitted one were counted (an
  -- enforcing request alone is admitted exactly when it fits), and all
  -- counted at once below.
  counted = in_turn(alg, st, l, one_loaded and used, counted, ARGV, 10, #ARGV, reply, R_SLOT + 1)
  if counted > 0 then
    local until_ms
    slot, until_ms = alg('add', st, l, counted)
    if until_ms > only[K_UNTIL] then
      only[K_UNTIL] = until_ms
    end
  end
  local reset, full = alg('report', st, l)
  reply[R_RESET], reply[R_FULL], reply[R_SLOT] = reset, full, slot
  if not whole then
    reply[R_RESET_BEFORE], reply[R_FULL_BEFORE] = reset_before or reset, full_before or full
  end
else
  reply[R_APPLIED] = applied and 1 or 0
  -- Pass 2: count everything, or nothing, and report. Two phases, in request
  -- order within each: first what stands whatever the request decides (refunds
  -- and always-counted debits: role codes 3 and up), then the debits counted
  -- only with an admitted request. Every store counts in this order, so a
  -- counter shared by both kinds reports the same anywhere.
  for phase = 1, 2 do
    for j = 1, nl do
      local l = limits[j]
      local st, item = l[L_STATE], l[L_ITEM]
      if (phase == 1) == (item[I_ROLE] >= '3') then
        local slot, hits, r = -1, item[I_HITS], (j - 1) * width
        if item[I_ROLE] == '3' then
          reply[r + R_USED], reply[r + R_PENDING] = st[S_ALG]('give', st, l, hits), 0
        elseif hits > 0 and (applied or item[I_ROLE] >= '4') and reply[r + R_OVER] ~= 2 then
          local until_ms
          slot, until_ms = st[S_ALG]('add', st, l, hits)
          if until_ms > st[S_KEY][K_UNTIL] then
            st[S_KEY][K_UNTIL] = until_ms
          end
        end
        reply[r + R_RESET], reply[r + R_FULL] = st[S_ALG]('report', st, l)
        reply[r + R_SLOT] = slot
        local b = l[L_BLOCK]
        if b and item[I_ROLE] ~= '3' and reply[r + R_OVER] > 0 then
          if reply[r + R_OVER] == 1 then
            offend(b, l)
            reply[r + R_OVER] = 2
          end
          -- Reported before and after: a refund never lifts a block.
          local left = b[B_UNTIL] - now
          reply[r + R_RESET], reply[r + R_FULL] = left, left
          if not whole then
            reply[r + R_RESET_BEFORE], reply[r + R_FULL_BEFORE] = left, left
          end
        end
      end
    end
    -- "Before" values matter only for a Cluster part that may be refunded (it
    -- then stands as after the first phase): a whole request reports "after"
    -- only.
    if phase == 1 and not whole then
      for j = 1, nl do
        local l, r = limits[j], (j - 1) * width
        if l[L_ITEM][I_ROLE] >= '3' then
          reply[r + R_RESET_BEFORE], reply[r + R_FULL_BEFORE] = reply[r + R_RESET], reply[r + R_FULL]
        else
          reply[r + R_RESET_BEFORE], reply[r + R_FULL_BEFORE] = l[L_STATE][S_ALG]('report', l[L_STATE], l)
        end
      end
    end
  end
end

-- Write: at most one HDEL, one HSET and one PEXPIRE(AT) per key (when and
-- where the expiry moves: see clock.lua).
for i = 1, #KEYS do
  local k = single and only or items[i][I_KEY]
  if k[K_FIRST] == i then -- once per key
    local at, text = expiry(k[K_UNTIL], k[K_STORED])
    -- What its states kept back until every operation was done (given
    -- where the expiry moves; a 'save' may delete as well as write).
    if single then
      if one_st[S_DIRTY] then
        one_alg('save', one_st, nil, at)
      end
    else
      for j = 1, nl do
        local st = limits[j][L_STATE]
        if st[S_FIRST] == j and st[S_KEY] == k and st[S_DIRTY] then
          st[S_ALG]('save', st, nil, at)
        end
      end
    end
    if k[K_DELETES] then
      call('HDEL', k[K_NAME], unpack(k[K_DELETES]))
    end
    if at then
      write(k, 'x', text)
    end
    if k[K_WRITES] > 0 then
      call('HSET', k[K_NAME], unpack(k, K_FIELDS + k[K_READS], K_FIELDS - 1 + k[K_READS] + k[K_WRITES]))
    end
    if at then
      local command, arg = expire_command(at, text)
      call(command, k[K_NAME], arg)
    end
  end
end

return reply
