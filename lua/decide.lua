-- ratewatch: decide every limit of one request, atomically, all or nothing.
-- Loaded after common.lua and the six algorithm files (one script).
--
-- KEYS[i]        the key of limit i (all share one hash tag on a cluster)
-- ARGV[1]        now in µs since epoch, or '' to use the server's TIME
-- ARGV[2]        cost: units each limit is asked for (integer), or 'i':
--                limit i is asked for ARGV[3+5n+i] units (n limits), so
--                the groups of one decision-service request keep their
--                own costs (0 checks without charging; 'c' checks that
--                one unit is left and charges nothing)
-- ARGV[3]        '1' to peek (decide, write nothing), '0' to charge, or
--                'r' to charge a call in which a key appears more than
--                once (the same counter named by several limits): each
--                limit's state is written as soon as it is decided, so a
--                later limit of its key decides on it and every copy is
--                charged in order; if the call does not admit, every key
--                written is put back as it was (DUMP before, RESTORE after)
-- ARGV[4+5(i-1)] limit i: algorithm name (token_bucket, sliding_window,
--                sliding_log, fixed_window, gcra, leaky_bucket,
--                concurrency)
-- ARGV[5+5(i-1)] '1' if limit i is shadow (reported, never blocks)
-- ARGV[6..8+5(i-1)] p1, p2, p3: the algorithm's parameters (see its file)
--
-- Only if every non-shadow limit admits (and not peeking) is each admitting
-- limit's new state written, with an expiry of its step's TTL. A key holding
-- another algorithm's or an older layout's state decides as fresh and is
-- replaced by the write (see common.lua), instead of failing with WRONGTYPE
-- until it expires.
--
-- Returns ONE bulk string (each reply element costs Redis CPU to send and
-- the client about a thousand instructions to parse, so the whole answer
-- is one fixed-width binary record, big endian, that Rust reads in place):
--   '>BI8'       allowed (1/0), now (µs)
--   then per limit i '>BdI8I8': head, remaining (the double's exact
--   bits), reset_after_us, retry_after_us, then by head:
--   head = allowed (1/0) + 2 × what follows:
--     0  nothing
--     1  '>I8' delay_us (an admitted leaky-bucket request must wait)
--     2  '>I8' the window start written (µs; window counters)
--     3  '>I4' the number m of sliding-log members written, then each
--        member as '>I4' its length and its bytes
--     4  '>I8' the number of expired in-flight holders the write dropped
-- A limit's state was written if and only if the call and the limit
-- allowed and it was not a peek.

local now
if ARGV[1] ~= '' then
  now = tonumber(ARGV[1])
else
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000000 + tonumber(t[2])
end
-- A cost of 1, the usual one, without a conversion (tonumber is dear here).
local cost = 1
local costs = false
if ARGV[2] == 'i' then
  costs = 3 + 5 * #KEYS
elseif ARGV[2] ~= '1' then
  cost = tonumber(ARGV[2])
end
local peek = ARGV[3] == '1'
-- Only a call whose keys repeat (rare) writes as it decides: W keeps what
-- each limit's write answered, SAVED each written key's former value.
local chain = ARGV[3] == 'r'
local W, SAVED
if chain then W, SAVED = {}, {} end

-- Each limit's answer in 8 slots of one table (a table per limit cost
-- more), sized for one limit: allowed, remaining, reset, retry, ttl, value
-- (the new state, or the sliding log's writer), kind and extra (see
-- common.lua).
local S = { false, false, false, false, false, false, false, false }
local allowed = true

-- Writes the state of admitted limit i (its answer in S from s + 1) and
-- returns the head of its reply (see above), its extra field and the
-- sliding-log members it added.
local function write(i, s)
  local kind = S[s + 7]
  if kind == 3 then
    return 7, nil, S[s + 6](KEYS[i], S[s + 5], S[s + 8])
  elseif kind == 4 then
    return 9, S[s + 6](KEYS[i], S[s + 5], S[s + 8]), nil
  elseif S[s + 6] then
    -- One string and its expiry in one command: whole milliseconds,
    -- rounded up so a key never dies before its state stops mattering,
    -- and at least 1 (PX 0 is refused). Formatted here: Redis formats a
    -- Lua number with '%.17g', dearer.
    local ms = math.ceil(S[s + 5] / 1000)
    if ms < 1 then ms = 1 end
    redis.call('SET', KEYS[i], S[s + 6], 'PX', string.format('%d', ms))
    if kind == 2 then
      return 5, S[s + 8], nil
    end
  end
  if kind == 1 then
    return 3, S[s + 8], nil
  end
  return 1, nil, nil
end
for i = 1, #KEYS do
  local base = 4 + 5 * (i - 1)
  local decide = ALG[ARGV[base]]
  if not decide or decide == true then
    return redis.error_reply('ratewatch: unknown algorithm ' .. tostring(ARGV[base]))
  end
  -- Parameters go as ARGV strings: each algorithm converts the ones it
  -- uses (tonumber is dear here).
  local c = cost
  local check = false
  if costs then
    c = ARGV[costs + i]
    check = c == 'c'
    c = check and 1 or tonumber(c)
  end
  local ok, remaining, reset, retry, ttl, value, kind, extra =
    decide(KEYS[i], ARGV[base + 2], ARGV[base + 3], ARGV[base + 4], now, c)
  if check and ok then
    -- Decided at one unit, charged none: nothing to write.
    remaining, value, kind, extra = remaining + 1, false, 0, nil
  end
  local s = 8 * (i - 1)
  S[s + 1], S[s + 2], S[s + 3], S[s + 4] = ok, remaining, reset, retry
  S[s + 5], S[s + 6], S[s + 7], S[s + 8] = ttl, value, kind, extra
  if not ok and ARGV[base + 1] ~= '1' then
    allowed = false
  end
  if chain and ok then
    local key = KEYS[i]
    if SAVED[key] == nil then
      SAVED[key] = { redis.call('DUMP', key), redis.call('PTTL', key) }
    end
    W[3 * i - 2], W[3 * i - 1], W[3 * i] = write(i, s)
  end
end
if chain and not allowed then
  -- Nothing of a refused call stays charged.
  for key, was in pairs(SAVED) do
    if was[1] then
      local ttl = was[2]
      if ttl < 0 then ttl = 0 end
      redis.call('RESTORE', key, ttl, was[1], 'REPLACE')
    else
      redis.call('DEL', key)
    end
  end
end

-- The reply, one string: a limit's record in one struct.pack (one C call,
-- no table per reply element).
local out = struct.pack('>BI8', allowed and 1 or 0, now)
for i = 1, #KEYS do
  local s = 8 * (i - 1)
  local head, extra, added = 0, nil, nil
  if S[s + 1] then
    local kind = S[s + 7]
    head = 1
    if kind == 1 then
      head, extra = 3, S[s + 8]
    end
    if chain then
      if allowed then
        head, extra, added = W[3 * i - 2], W[3 * i - 1], W[3 * i]
      end
    elseif allowed and not peek then
      head, extra, added = write(i, s)
    end
  end
  if extra then
    out = out .. struct.pack('>BdI8I8I8', head, S[s + 2], S[s + 3], S[s + 4], extra)
  elseif added then
    local m = #added
    local members = {}
    for j = 1, m do
      members[2 * j - 1] = struct.pack('>I4', #added[j])
      members[2 * j] = added[j]
    end
    out = out .. struct.pack('>BdI8I8I4', head, S[s + 2], S[s + 3], S[s + 4], m)
      .. table.concat(members)
  else
    out = out .. struct.pack('>BdI8I8', head, S[s + 2], S[s + 3], S[s + 4])
  end
end
return out
