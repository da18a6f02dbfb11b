--[[ The clock of a decision call, read once: ARGV[1] is now in ms since the
Unix epoch, or "" to read Redis TIME, so that every replica uses one clock.
decide.lua and batch.lua both take it so (refund.lua is given its time),
and move a HASH's expiry by it.
]]
local now
if ARGV[1] == '' then
  local t = call('TIME')
  now = t[1] * 1000 + floor(t[2] / 1000)
else
  now = ARGV[1] + 0
end

-- When a HASH's expiry must move, and to where. It must live until
-- `until_ms` (0: that has not moved) and one second more, which covers clock
-- differences between replicas in "local" time mode; `stored` is its "x" as
-- read (until when it lives, or false). When that falls short it moves half
-- as far again, so that a counter that keeps getting hits moves it about
-- once per half window rather than with every new bucket (a PEXPIRE costs
-- as much as an HSET): an idle HASH lives at most half its longest window
-- and a second longer than it must. The time is rounded up to a whole
-- second, so that the calls of one second write the same "x" and mostly the
-- same markers: Lua keeps one copy of equal strings, and a string it
-- already holds costs no allocation nor collection (callgrind, a call each:
-- 1,400 instructions fewer for the default sliding window, 1,400 more for
-- a token bucket, which moves its expiry on almost every call; see the
-- benchmarks log). Returns the new expiry and its text (for "x"), or nil
-- when it need not move.
local function expiry(until_ms, stored)
  if until_ms > 0 and until_ms + 1000 > (stored or 0) + 0 then
    local at = ceil((until_ms + 1000 + (until_ms - now) / 2) / 1000) * 1000
    return at, fmt('%d', at)
  end
end

-- The command that moves a HASH's expiry to `at` (`text` formatted), and its
-- argument (`call(command, key, arg)`); run after the HASH's HSET (a PEXPIRE
-- on a key that does not exist yet does nothing).
local function expire_command(at, text)
  if ARGV[1] == '' then
    -- Redis's clock is the script's: the time "x" holds is the expiry.
    return 'PEXPIREAT', text
  end
  return 'PEXPIRE', fmt('%d', at - now)
end
