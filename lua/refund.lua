-- ratewatch: give back what an admitted decision charged, when another
-- part of the same request (another cluster slot) blocked it. Loaded after
-- common.lua and the six algorithm files (one script).
--
-- KEYS[i]   the key of limit i that the decision wrote
-- ARGV[1]   cost the decision charged (units, integer), or 'i' when each
--           limit's block starts with its own cost
-- then per limit i, in order: [its cost if ARGV[1] is 'i'], algorithm
--           name, p1, p2, p3 (as for decide),
--           the window start the decision wrote (µs, or 0), the number m of
--           sliding-log members it added, then those m members
--
-- Token buckets get `cost` tokens back (capped at capacity), window
-- counters lose `cost` if still in the same window, a TAT moves back by
-- cost × interval, and a sliding log loses exactly the members added.
-- Expiries are kept. Returns the number of limits refunded.

local per_item = ARGV[1] == 'i'
local cost = 0
if not per_item then cost = tonumber(ARGV[1]) end
local at = 2
for i = 1, #KEYS do
  if per_item then
    cost = tonumber(ARGV[at])
    at = at + 1
  end
  local refund = REFUND[ARGV[at]]
  if not refund then
    return redis.error_reply('ratewatch: unknown algorithm ' .. tostring(ARGV[at]))
  end
  local p1, p2, p3 = tonumber(ARGV[at + 1]), tonumber(ARGV[at + 2]), tonumber(ARGV[at + 3])
  local start = tonumber(ARGV[at + 4])
  local m = tonumber(ARGV[at + 5])
  local members = {}
  for j = 1, m do members[j] = ARGV[at + 5 + j] end
  refund(KEYS[i], p1, p2, p3, cost, start, members)
  at = at + 6 + m
end
return #KEYS
