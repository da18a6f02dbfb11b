--[[ calendar_window (src/limiter/algorithm/calendar_window.rs): a fixed
window that is a calendar period (day, week, month, year) in a time zone.
Lua has no time zones: the caller names the period containing its clock's
now as its limit's arguments (requests, E - S, 4, S: the period [S, E)),
and the script keeps to the rule of the Rust state: the stored period is
counted in until now (the script's clock) reaches its end, then the
caller's is.

With Redis's clock (the default), a caller's clock a few ms behind at a
period's end names the period Redis has left: then the next one is meant
(its end estimated as one more period of the same length, corrected by the
next caller whose clock names it). A caller ahead names the next period
while Redis's stored one still runs: the stored one is kept. Either way a
counter never goes back to an earlier period.

Fields (prefix "D:k:", D the unit's nominal length: a day, week, 30-day
month or 365-day year, from E - S, so that the counter keeps its name from
one period to the next): "D:k:w" the period's start, "D:k:e" its end,
"D:k:c" the hits in it.
]]

--[[ layout calendar after state:
  CW_START        the counted period's start (ms)
  CW_END          its end
  CW_HITS         its hits
  CW_GUESSED      whether CW_END is an estimate (the caller's clock behind)
]]

--[[ layout calendar_fields: the names 'new' appends to the key's HMGET
  CWF_START       "w"
  CWF_END         "e"
  CWF_HITS        "c"
]]

-- Built only when the request names this algorithm.
local calendar_window
calendar_window = uses_calendar and function(op, st, l, x)
  if op == 'load' then
    local i = st[S_AT]
    local w, e = x[i + CWF_START], x[i + CWF_END]
    if w and e and now < e + 0 then
      -- The stored period still runs. When both name the same period, the
      -- caller's end is the right one unless it is an estimate.
      if w + 0 ~= st[CW_START] or st[CW_GUESSED] then
        st[CW_START], st[CW_END] = w + 0, e + 0
      end
      st[CW_HITS] = (x[i + CWF_HITS] or 0) + 0
    else
      st[CW_HITS] = 0
    end
    return st[CW_HITS]
  elseif op == 'add' then
    local hits = min(x, MAX_HITS - st[CW_HITS])
    if hits == 0 then
      return -1, 0
    end
    st[CW_HITS] = st[CW_HITS] + hits
    local k, at = st[S_KEY], K_FIELDS - 1 + st[S_AT]
    local w = K_FIELDS - 1 + k[K_READS] + k[K_WRITES]
    k[w + 1], k[w + 2] = k[at + CWF_START], fmt('%d', st[CW_START])
    k[w + 3], k[w + 4] = k[at + CWF_END], fmt('%d', st[CW_END])
    k[w + 5], k[w + 6] = k[at + CWF_HITS], fmt('%d', st[CW_HITS])
    k[K_WRITES] = k[K_WRITES] + 6
    -- The HASH lives to the period's end (the driver moves its expiry only
    -- when that is later than it is).
    return st[CW_START], st[CW_END]
  elseif op == 'report' then
    local reset = max(st[CW_END] - now, 0)
    if st[CW_HITS] >= l[L_REQUESTS] then
      return reset, reset
    end
    return reset, 0
  elseif op == 'give' then
    st[CW_HITS] = max(st[CW_HITS] - x, 0)
    local k = st[S_KEY]
    write(k, st[S_PREFIX] .. 'w', fmt('%d', st[CW_START]))
    write(k, st[S_PREFIX] .. 'e', fmt('%d', st[CW_END]))
    write(k, st[S_PREFIX] .. 'c', fmt('%d', st[CW_HITS]))
    return st[CW_HITS]
  elseif op == 'new' then
    local k, n = st, st[K_READS]
    local at = K_FIELDS - 1 + n
    k[at + CWF_START], k[at + CWF_END], k[at + CWF_HITS] = x .. 'w', x .. 'e', x .. 'c'
    k[K_READS] = n + CWF_HITS -- its last field
    local start, len = ARGV[l[L_ARG] + 3] + 0, l[L_DURATION]
    local guessed = now >= start + len
    if guessed then
      -- The caller's clock is behind Redis's: the period after its own.
      start = start + len
    end
    return {
      [S_ALG] = calendar_window, [S_KEY] = k, [S_AT] = n, [S_USED] = 0, [S_PENDING] = 0,
      [S_FIRST] = 0, [S_PREFIX] = x, [S_DIRTY] = false, [CW_START] = start, [CW_END] = start + len,
      [CW_HITS] = 0, [CW_GUESSED] = guessed,
    }
  elseif op == 'prefix' then
    -- st = E - S (a string): the unit's nominal length, which names the
    -- counter whatever the period's own length (a day 23 to 25 hours, a
    -- week 7 days, a month 28 to 31, a year 365 or 366).
    local len, day = st + 0, 86400000
    local nominal = len < 2 * day and day or len < 8 * day and 7 * day
      or len < 32 * day and 30 * day or 365 * day
    return fmt('%d', nominal) .. ':k:'
  elseif op == 'undo' then
    -- refund.lua (which builds every algorithm): the hits counted in the
    -- period decide.lua answered come back if it is still the stored one,
    -- as a fixed window's do (the same "w" and "c").
    return fixed_window('undo', st, l, x)
  end
end
