--[[ sliding_log (src/limiter/algorithm/sliding_log.rs): exact, one entry
per time hits were counted, capped at the limit so that its cost stays
bounded. Also the concurrency limit: a log of leased slots whose window is
the lease (prefix "D:c:" rather than "D:l:").

Fields: "D:l:e" (or "D:c:e") entries "time:hits,time:hits,…", oldest first;
written once per call, whatever changed them ('save').
]]

--[[ layout log after state:
  SL_DURATION     D
  SL_LIMIT        the requests of the first limit on it
  SL_TIMES        the entries' times, oldest first (a table)
  SL_HITS         their hits (a table)
  SL_TOTAL        the sum of SL_HITS
]]

--[[ layout log_fields: the name 'new' appends to the key's HMGET, from the
  state's S_AT
  SLF_ENTRIES     "e"
]]

-- Built only when the request names this algorithm.
local sliding_log
sliding_log = uses_log and function(op, st, l, x)
  if op == 'load' then
    local raw = x[st[S_AT] + SLF_ENTRIES]
    if raw then
      sliding_log('parse', st, now - st[SL_DURATION], raw)
    end
    sliding_log('trim', st)
    return st[SL_TOTAL]
  elseif op == 'parse' then
    -- The entries x after time l, appended to st's (empty) ones; the
    -- entries must be written if some were older.
    local times, hits, total = st[SL_TIMES], st[SL_HITS], 0
    for t, h in string.gmatch(x, '(%d+):(%d+)') do
      t, h = t + 0, h + 0
      if t > l then
        times[#times + 1], hits[#hits + 1] = t, h
        total = total + h
      else
        st[S_DIRTY] = true
      end
    end
    st[SL_TOTAL] = total
  elseif op == 'format' then
    -- Entries st (times) and l (hits) as stored.
    local parts = {}
    for j = 1, #st do
      parts[j] = fmt('%d:%d', st[j], l[j])
    end
    return table.concat(parts, ',')
  elseif op == 'trim' then
    -- Forgets the oldest hits beyond the limit (only shadow or quota mode
    -- log beyond it). Done when reading, not when adding, so that
    -- refund.lua can take back exactly what an add put in.
    local times, hits = st[SL_TIMES], st[SL_HITS]
    while st[SL_TOTAL] > st[SL_LIMIT] and #times > 0 do
      local excess = st[SL_TOTAL] - st[SL_LIMIT]
      st[S_DIRTY] = true
      if hits[1] <= excess then
        st[SL_TOTAL] = st[SL_TOTAL] - hits[1]
        table.remove(times, 1)
        table.remove(hits, 1)
      else
        hits[1] = hits[1] - excess
        st[SL_TOTAL] = st[SL_TOTAL] - excess
      end
    end
  elseif op == 'add' then
    local hits = min(x, MAX_HITS - st[SL_TOTAL])
    if hits == 0 then
      return -1, 0
    end
    local times, counts = st[SL_TIMES], st[SL_HITS]
    local last, t = #times, now
    if last > 0 and times[last] >= now then
      t = times[last]
      counts[last] = counts[last] + hits
    else
      times[last + 1], counts[last + 1] = now, hits
    end
    st[SL_TOTAL], st[S_DIRTY] = st[SL_TOTAL] + hits, true
    return t, times[#times] + st[SL_DURATION]
  elseif op == 'give' then
    sliding_log('trim', st) -- as Rust's refund reads the log first
    local times, hits, left = st[SL_TIMES], st[SL_HITS], x
    while left > 0 and #times > 0 do
      local last = #times
      local take = min(hits[last], left)
      hits[last], left, st[SL_TOTAL] = hits[last] - take, left - take, st[SL_TOTAL] - take
      if hits[last] == 0 then
        times[last], hits[last] = nil, nil
      end
    end
    st[S_DIRTY] = true
    return st[SL_TOTAL]
  elseif op == 'report' then
    local reset = (st[SL_TIMES][1] or now) + st[SL_DURATION] - now
    if st[SL_TOTAL] > 0 and st[SL_TOTAL] == l[L_REQUESTS] then
      return reset, reset
    end
    return reset, 0
  elseif op == 'save' then
    local k, f = st[S_KEY], st[S_PREFIX]
    if #st[SL_TIMES] > 0 then
      write(k, f .. 'e', sliding_log('format', st[SL_TIMES], st[SL_HITS]))
    else
      local del = k[K_DELETES] or {}
      k[K_DELETES] = del
      del[#del + 1] = f .. 'e'
    end
  elseif op == 'new' then
    local k, n = st, st[K_READS]
    k[K_FIELDS - 1 + SLF_ENTRIES + n] = x .. 'e'
    k[K_READS] = n + SLF_ENTRIES -- its last field
    return {
      [S_ALG] = sliding_log, [S_KEY] = k, [S_AT] = n, [S_USED] = 0, [S_PENDING] = 0,
      [S_FIRST] = 0, [S_PREFIX] = x, [S_DIRTY] = false, [SL_DURATION] = l[L_DURATION],
      [SL_LIMIT] = l[L_REQUESTS], [SL_TIMES] = {}, [SL_HITS] = {}, [SL_TOTAL] = 0,
    }
  elseif op == 'prefix' then
    return st .. (l == '1' and ':c:' or ':l:')
  elseif op == 'undo' then
    -- refund.lua: the hits counted at the time decide.lua answered come
    -- back (from its entry, which goes when emptied).
    local key, f, slot, left = st, x, ARGV[l + 4] + 0, ARGV[l + 5] + 0
    local raw = redis.call('HGET', key, f .. 'e')
    if not raw then
      return 0
    end
    local log = {}
    log[SL_TIMES], log[SL_HITS] = {}, {}
    sliding_log('parse', log, -1, raw)
    local times, hits = log[SL_TIMES], log[SL_HITS]
    local done = 0
    for j = 1, #times do
      if times[j] == slot then
        hits[j], done = hits[j] - min(hits[j], left), 1
        if hits[j] == 0 then
          table.remove(times, j)
          table.remove(hits, j)
        end
        break
      end
    end
    if #times > 0 then
      redis.call('HSET', key, f .. 'e', sliding_log('format', times, hits))
    else
      redis.call('HDEL', key, f .. 'e')
    end
    return done
  end
end
