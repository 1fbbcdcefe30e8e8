-- ratewatch: helpers shared by every algorithm file (loaded first).
--
-- Every number is a Lua double. Times are integer microseconds since the
-- Unix epoch (below 2^53, so exact); they are formatted with '%.17g', which
-- prints integers without an exponent and floats so that they parse back to
-- the same bits.

local ALG = {}

-- The algorithms this call names. Redis runs the whole script on every
-- call, and defining all six algorithms' functions cost more Redis CPU than
-- deciding a token bucket, so each algorithm file defines its functions only
-- when the call's arguments name it (no parameter, key or member is ever an
-- algorithm name, so over-matching cannot happen).
local NEED = {}
for i = 1, #ARGV do
  NEED[ARGV[i]] = true
end

-- A number as a string that parses back to the same double.
local function fmt(x)
  return string.format('%.17g', x)
end

-- `ceil_us` of src/algorithm/mod.rs: non-positive becomes 0, else ceil.
local function ceil_us(x)
  if x <= 0 then return 0 end
  return math.ceil(x)
end

-- An exact remainder of non-negative integers (fmod never rounds).
local function imod(a, b)
  return math.fmod(a, b)
end

-- Integer division of non-negative integers below 2^53.
local function idiv(a, b)
  return math.floor(a / b)
end

-- Saturating subtraction of unsigned integers.
local function sat_sub(a, b)
  if a > b then return a - b end
  return 0
end

-- Expiry in whole milliseconds, rounded up so a key never dies before its
-- state stops mattering, and at least 1 ms (PEXPIRE 0 would delete it).
local function expire_us(key, ttl_us)
  local ms = math.ceil(ttl_us / 1000)
  if ms < 1 then ms = 1 end
  redis.call('PEXPIRE', key, ms)
end
