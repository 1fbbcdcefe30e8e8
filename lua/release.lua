-- ratewatch: give back one request's in-flight slots (atomic, idempotent).
--
-- KEYS[i]   the in-flight sets the request took a slot in (one hash tag)
-- ARGV[1]   the holder id
--
-- Returns how many slots were still held (0 when a release repeats, or
-- the holders had already expired).
local n = 0
for i = 1, #KEYS do
  -- A key of another type holds no slot.
  local r = redis.pcall('ZREM', KEYS[i], ARGV[1])
  if type(r) == 'number' then n = n + r end
end
return n
