-- ratewatch: helpers shared by every algorithm file (loaded first).
--
-- Every number is a Lua double. Times are integer microseconds since the
-- Unix epoch (below 2^53, so exact).
--
-- State layout: every limit but the sliding log keeps ONE string per key,
-- written with its expiry in the same SET. GCRA and the leaky bucket keep a
-- decimal integer (Redis stores it as an integer, no string at all); the
-- token bucket and the window counters keep fixed-width binary records
-- (`struct.pack`, big endian) whose length tells them apart:
--
--   token bucket     15 bytes  '>dI7'     tokens (the double's exact bits), last (µs)
--   fixed window     12 bytes  '>I7I5'    start (µs), count
--   sliding window   11 bytes  '>I7I2I2'  start (µs), count, prev (both < 65536)
--                    17 bytes  '>I7I5I5'  the same, larger counts
--
-- A value of any other type or length (an older layout, or another
-- algorithm under the same key) reads as absent: the limit decides as a
-- fresh one and its next write replaces the value.

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

-- An integer (µs, a count) as the decimal string that parses back to it.
local function fmt(x)
  return string.format('%d', x)
end

-- A number for the reply that Rust reads back to the same double: an
-- integer reply when it is a whole number (exact below 2^53), else the
-- double's eight bytes, big endian.
local function exact(x)
  if x == math.floor(x) and x < 9007199254740992 then return x end
  return struct.pack('>d', x)
end

-- The string held at `key`, or nil when it is absent or of another type.
local function get_string(key)
  local v = redis.pcall('GET', key)
  if type(v) == 'string' then return v end
  return nil
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
-- state stops mattering, and at least 1 ms (PX 0 is refused).
local function px(ttl_us)
  local ms = math.ceil(ttl_us / 1000)
  if ms < 1 then ms = 1 end
  return ms
end

-- Writes `value` at `key` with its expiry, in one command.
local function set_px(key, value, ttl_us)
  redis.call('SET', key, value, 'PX', fmt(px(ttl_us)))
end
