--[[ The request: what decide.lua is given and what it answers, the clock,
and ARGV parsed. Parsed before the algorithms are defined, so that only the
functions of the algorithms it names are built (see prelude.lua on what a
function costs).

KEYS[i]   the HASH of the i-th limited identity of the request.

ARGV[1]   now, in ms since the Unix epoch; "" reads Redis TIME instead, so
          every replica uses one clock.
ARGV[2]   "all":  every item of the request is in this call; admission is
                  decided here (no enforcing item over, and not every quota
                  item over).
          "part": Redis Cluster, the request spans several slots; this part
                  is counted when none of its enforcing items is over, and
                  the caller decides overall (and refunds what it must).
Then, per item, in KEYS order: role (0 enforce, 1 shadow, 2 quota; plus 4
when the item counts always, even when the request or the item is refused;
3 for a refund, whose hits are given back), hits, number of limits; and per
limit: requests, duration_ms, algorithm, param:
  0 sliding_window  param = precision_ms
  1 fixed_window    param = 0
  2 token_bucket    param = burst
  3 sliding_log     param = 0; 1 for concurrency (a log of leased slots,
                    window = lease, fields "D:c:…")
  4 calendar        duration_ms = the period's length (E - S), param = its
                    start S: the calendar period containing the caller's
                    now (see calendar_window.lua)
An item with a limit that has a penalty box gives its number of limits
negated, and each of its limits four more arguments after its own: block,
escalate, max_block, forget_after (ms; all 0 for a limit without one; see
the driver's blocks). Such an item never takes the single path.
A whole call of one enforcing item (role 0) with one limit may carry more
requests of that key and limit, coalesced by the caller (see
src/store/redis/coalesce.rs): after the limit, one weight per request.
Each is decided in turn after the first, as if every earlier admitted one
were counted, which is what separate calls in that order would decide.

Reply: { applied (1|0), then per limit:
                  used, pending, over, reset, full, slot
          and, for "part" only, reset_before, full_before }
  used     how much of the limit is in use before this request (after it,
           for a refund, whose pending is then 0)
  pending  hits of earlier limits of this request on the same counter
  over     1 if this limit's hits (with the pending ones) do not fit; 2 if
           its counter is in the limit's penalty box (blocked before the
           request, or by it), reset and full then being the block's
           remaining time
  reset    ms until headroom next grows, after this request
  full     ms from now during which no hit at all can fit (0 if one can),
           after this request: what a local cache may answer without
           asking Redis
  slot     where the hits went (bucket, window, or log time; -1 if none),
           for refund.lua
  *_before the same two before this request: the caller of a refunded
           part reports them. A whole request is never refunded, so its
           reply leaves them out (every value costs Redis and the caller).
        then, per coalesced request, 1 if it was over (not admitted), 0 if
        it was counted; the first request's reset, full and slot are those
        after all of them (what is stored when the reply leaves).

The reply's values for limit j are at (j - 1) * width + the names below (a
whole request's width is 6, a Cluster part's 8; see driver.lua):
]]

--[[ layout reply: the first limit's values (a coalesced call's answers
  follow R_SLOT)
  R_APPLIED       1 if the request was counted, else 0 (the reply's first)
  R_USED          used
  R_PENDING       pending
  R_OVER          over
  R_RESET         reset
  R_FULL          full
  R_SLOT          slot
  R_RESET_BEFORE  reset_before (a Cluster part's)
  R_FULL_BEFORE   full_before (a Cluster part's)
]]

local whole = ARGV[2] == 'all'

-- One key with one limit (every descriptor with one limit, the default's
-- shape) takes the driver's single path, which makes no item and limit
-- records: only the algorithm it names is noted here.
local single = #KEYS == 1 and ARGV[5] == '1'

-- Otherwise one record per distinct key (one HMGET, one HSET), one per item,
-- one per limit (records: see prelude.lua); the states are planned by the
-- driver.
local items, limits, nl, a = false, false, 0, 3
local uses_sliding, uses_fixed, uses_bucket, uses_log, uses_calendar = false, false, false, false, false
local uses_penalty = false
if single then
  local alg = ARGV[8]
  uses_sliding, uses_fixed, uses_bucket, uses_calendar = alg == '0', alg == '1', alg == '2', alg == '4'
  uses_log = not (uses_sliding or uses_fixed or uses_bucket or uses_calendar)
else
  items, limits = {}, {}
  for i = 1, #KEYS do
    local key, k = KEYS[i], nil
    for j = 1, i - 1 do
      if items[j][I_KEY][K_NAME] == key then
        k = items[j][I_KEY]
        break
      end
    end
    if not k then
      -- Sized for one sliding window: a table that grows is reallocated.
      k = {
        [K_NAME] = key, [K_READS] = 1, [K_WRITES] = 0, [K_DELETES] = false, [K_UNTIL] = 0,
        [K_STORED] = 0, [K_FIRST] = i, [K_FIELDS] = 'x',
        false, false, false, false, false, false, false, false, false,
      }
    end
    -- The role code is one digit, compared as a string: 0 enforce, 1 shadow,
    -- 2 quota, 3 refund, plus 4 when counted always.
    items[i] = { [I_KEY] = k, [I_ROLE] = ARGV[a], [I_HITS] = ARGV[a + 1] + 0, [I_OVER] = false }
    local count, width = ARGV[a + 2] + 0, 4
    a = a + 3
    if count < 0 then
      count, width, uses_penalty = -count, 8, true
    end
    for _ = 1, count do
      local alg = ARGV[a + 2]
      if alg == '0' then
        uses_sliding = true
      elseif alg == '1' then
        uses_fixed = true
      elseif alg == '2' then
        uses_bucket = true
      elseif alg == '4' then
        uses_calendar = true
      else
        uses_log = true
      end
      nl = nl + 1
      limits[nl] = {
        [L_ITEM] = items[i], [L_STATE] = false, [L_REQUESTS] = ARGV[a] + 0,
        [L_DURATION] = ARGV[a + 1] + 0, [L_ARG] = a,
        [L_PENALTY] = width == 8 and ARGV[a + 4] ~= '0' and a + 4, [L_BLOCK] = false,
      }
      a = a + width
    end
  end
end
