--[[ fixed_window (src/limiter/algorithm/fixed_window.rs): windows of D ms
aligned to the Unix epoch, as envoyproxy/ratelimit counts.

Fields (prefix "D:f:"): "D:f:w" the window index (time / D), "D:f:c" hits in
it.

State slots from 8: D, the window of now, the stored window, its hits.
]]

-- Built only when the request names this algorithm; what only a rare path
-- uses is reached through its global (an upvalue costs on every call).
local fixed_window
fixed_window = uses_fixed and function(op, st, l, x)
  if op == 'load' then
    local w = x[st[3]]
    st[10], st[11] = w and w + 0, (x[st[3] + 1] or 0) + 0
    if st[10] ~= st[9] then
      st[11] = 0
    end
    return st[11]
  elseif op == 'add' then
    local hits = min(x, MAX_HITS - st[11])
    if hits == 0 then
      return -1, 0
    end
    -- The HASH's expiry moves only with a new (or emptied) window.
    local grew = st[10] ~= st[9] or st[11] == 0
    st[10], st[11] = st[9], st[11] + hits
    -- The field names read by 'new' are reused; writes queued inline.
    local k, at = st[2], st[3]
    local w = 7 + k[2] + k[3]
    k[w + 1], k[w + 2], k[w + 3], k[w + 4] = k[7 + at], fmt('%d', st[10]), k[8 + at], fmt('%d', st[11])
    k[3] = k[3] + 4
    return st[10], grew and (st[10] + 1) * st[8] or 0
  elseif op == 'report' then
    local reset = (st[9] + 1) * st[8] - now
    if st[10] == st[9] and st[11] >= l[3] then
      return reset, reset
    end
    return reset, 0
  elseif op == 'give' then
    st[10], st[11] = st[9], math.max(st[11] - x, 0)
    write(st[2], st[7] .. 'w', fmt('%d', st[10]))
    write(st[2], st[7] .. 'c', fmt('%d', st[11]))
    return st[11]
  elseif op == 'new' then
    local k, n = st, st[2]
    k[8 + n], k[9 + n] = x .. 'w', x .. 'c'
    k[2] = n + 2
    return { fixed_window, k, n + 1, 0, 0, 0, x, l[4], math.floor(now / l[4]), false, 0 }
  elseif op == 'prefix' then
    return st .. ':f:'
  end
end
