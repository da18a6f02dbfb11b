--[[ sliding_log (src/limiter/algorithm/sliding_log.rs): exact, one entry
per time hits were counted, capped at the limit so that its cost stays
bounded. Also the concurrency limit: a log of leased slots whose window is
the lease (prefix "D:c:" rather than "D:l:").

Fields: "D:l:e" (or "D:c:e") entries "time:hits,time:hits,…", oldest first;
written once per call, whatever changed them ('save').

State slots from 8: D, the limit (of the first limit on it), the stored
entries, their times and hits (tables), the total, whether to write.
]]

-- Built only when the request names this algorithm.
local sliding_log
sliding_log = uses_log and function(op, st, l, x)
  if op == 'load' then
    local raw = x[st[3]]
    if raw then
      local start, times, hits, total = now - st[8], st[11], st[12], 0
      for t, h in string.gmatch(raw, '(%d+):(%d+)') do
        t, h = t + 0, h + 0
        if t > start then
          times[#times + 1], hits[#hits + 1] = t, h
          total = total + h
        else
          st[14] = true
        end
      end
      st[13] = total
    end
    sliding_log('trim', st)
    return st[13]
  elseif op == 'trim' then
    -- Forgets the oldest hits beyond the limit (only shadow or quota mode
    -- log beyond it). Done when reading, not when adding, so that
    -- refund.lua can take back exactly what an add put in.
    local times, hits = st[11], st[12]
    while st[13] > st[9] and #times > 0 do
      local excess = st[13] - st[9]
      st[14] = true
      if hits[1] <= excess then
        st[13] = st[13] - hits[1]
        table.remove(times, 1)
        table.remove(hits, 1)
      else
        hits[1] = hits[1] - excess
        st[13] = st[13] - excess
      end
    end
  elseif op == 'add' then
    local hits = min(x, MAX_HITS - st[13])
    if hits == 0 then
      return -1, 0
    end
    local times, counts = st[11], st[12]
    local last, t = #times, now
    if last > 0 and times[last] >= now then
      t = times[last]
      counts[last] = counts[last] + hits
    else
      times[last + 1], counts[last + 1] = now, hits
    end
    st[13], st[14] = st[13] + hits, true
    return t, times[#times] + st[8]
  elseif op == 'give' then
    sliding_log('trim', st) -- as Rust's refund reads the log first
    local times, hits, left = st[11], st[12], x
    while left > 0 and #times > 0 do
      local last = #times
      local take = min(hits[last], left)
      hits[last], left, st[13] = hits[last] - take, left - take, st[13] - take
      if hits[last] == 0 then
        times[last], hits[last] = nil, nil
      end
    end
    st[14] = true
    return st[13]
  elseif op == 'report' then
    local reset = (st[11][1] or now) + st[8] - now
    if st[13] > 0 and st[13] == l[3] then
      return reset, reset
    end
    return reset, 0
  elseif op == 'save' then
    local k, f, times = st[2], st[7], st[11]
    if #times > 0 then
      local parts = {}
      for j = 1, #times do
        parts[j] = fmt('%d:%d', times[j], st[12][j])
      end
      write(k, f .. 'e', table.concat(parts, ','))
    else
      local del = k[4] or {}
      k[4] = del
      del[#del + 1] = f .. 'e'
    end
  elseif op == 'new' then
    local k, n = st, st[2]
    k[8 + n] = x .. 'e'
    k[2] = n + 1
    return { sliding_log, k, n + 1, 0, 0, 0, x, l[4], l[3], false, {}, {}, 0, false }
  elseif op == 'prefix' then
    return st .. (l == '1' and ':c:' or ':l:')
  end
end
