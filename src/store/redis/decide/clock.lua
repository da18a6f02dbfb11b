--[[ The clock of a decision call, read once: ARGV[1] is now in ms since the
Unix epoch, or "" to read Redis TIME, so that every replica uses one clock.
decide.lua and batch.lua both take it so (refund.lua is given its time).
]]
local now
if ARGV[1] == '' then
  local t = call('TIME')
  now = t[1] * 1000 + floor(t[2] / 1000)
else
  now = ARGV[1] + 0
end
