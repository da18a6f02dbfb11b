--[[ Sluice: forget every counter of one identity (the admin endpoint's
DELETE /counters). One HASH holds all the limits of an identity, so deleting
it starts each of them from empty.

KEYS[1]   the identity's HASH.
ARGV      none.
Reply:    {1} when there was something to forget, {0} otherwise.
]]

return { redis.call('DEL', KEYS[1]) }
