--[[ fixed_window (src/limiter/algorithm/fixed_window.rs): windows of D ms
aligned to the Unix epoch, as envoyproxy/ratelimit counts.

Fields (prefix "D:f:"): "D:f:w" the window index (time / D), "D:f:c" hits in
it.
]]

--[[ layout fixed after state:
  FW_DURATION     D
  FW_NOW          the window of now
  FW_STORED       the stored window, or nil
  FW_HITS         its hits (0 when it is not the window of now)
]]

--[[ layout fixed_fields: the names 'new' appends to the key's HMGET, from
  the state's S_AT
  FWF_WINDOW      "w"
  FWF_HITS        "c"
]]

-- Built only when the request names this algorithm; what only a rare path
-- uses is reached through its global (an upvalue costs on every call).
local fixed_window
fixed_window = uses_fixed and function(op, st, l, x)
  if op == 'load' then
    local i = st[S_AT]
    local w = x[i + FWF_WINDOW]
    st[FW_STORED], st[FW_HITS] = w and w + 0, (x[i + FWF_HITS] or 0) + 0
    if st[FW_STORED] ~= st[FW_NOW] then
      st[FW_HITS] = 0
    end
    return st[FW_HITS]
  elseif op == 'add' then
    local hits = min(x, MAX_HITS - st[FW_HITS])
    if hits == 0 then
      return -1, 0
    end
    -- The HASH's expiry moves only with a new (or emptied) window.
    local grew = st[FW_STORED] ~= st[FW_NOW] or st[FW_HITS] == 0
    st[FW_STORED], st[FW_HITS] = st[FW_NOW], st[FW_HITS] + hits
    -- The field names read by 'new' are reused; writes queued inline.
    local k, at = st[S_KEY], K_FIELDS - 1 + st[S_AT]
    local w = K_FIELDS - 1 + k[K_READS] + k[K_WRITES]
    k[w + 1], k[w + 2] = k[at + FWF_WINDOW], fmt('%d', st[FW_STORED])
    k[w + 3], k[w + 4] = k[at + FWF_HITS], fmt('%d', st[FW_HITS])
    k[K_WRITES] = k[K_WRITES] + 4
    return st[FW_STORED], grew and (st[FW_STORED] + 1) * st[FW_DURATION] or 0
  elseif op == 'report' then
    local reset = (st[FW_NOW] + 1) * st[FW_DURATION] - now
    if st[FW_STORED] == st[FW_NOW] and st[FW_HITS] >= l[L_REQUESTS] then
      return reset, reset
    end
    return reset, 0
  elseif op == 'give' then
    st[FW_STORED], st[FW_HITS] = st[FW_NOW], math.max(st[FW_HITS] - x, 0)
    write(st[S_KEY], st[S_PREFIX] .. 'w', fmt('%d', st[FW_STORED]))
    write(st[S_KEY], st[S_PREFIX] .. 'c', fmt('%d', st[FW_HITS]))
    return st[FW_HITS]
  elseif op == 'new' then
    local k, n = st, st[K_READS]
    local at = K_FIELDS - 1 + n
    k[at + FWF_WINDOW], k[at + FWF_HITS] = x .. 'w', x .. 'c'
    k[K_READS] = n + FWF_HITS -- its last field
    return {
      [S_ALG] = fixed_window, [S_KEY] = k, [S_AT] = n, [S_USED] = 0, [S_PENDING] = 0,
      [S_FIRST] = 0, [S_PREFIX] = x, [S_DIRTY] = false, [FW_DURATION] = l[L_DURATION],
      [FW_NOW] = math.floor(now / l[L_DURATION]), [FW_STORED] = false, [FW_HITS] = 0,
    }
  elseif op == 'prefix' then
    return st .. ':f:'
  elseif op == 'undo' then
    -- refund.lua: the hits counted in the window decide.lua answered come
    -- back, if it is still the stored one.
    local key, f, slot, hits = st, x, ARGV[l + 4] + 0, ARGV[l + 5] + 0
    local s = redis.call('HMGET', key, f .. 'w', f .. 'c')
    if s[1] and s[1] + 0 == slot then
      redis.call('HSET', key, f .. 'c', fmt('%d', math.max(0, (s[2] or 0) - hits)))
      return 1
    end
    return 0
  end
end
