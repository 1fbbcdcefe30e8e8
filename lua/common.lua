-- ratewatch: helpers shared by every algorithm file (loaded first).
--
-- Every number is a Lua double. Times are integer microseconds since the
-- Unix epoch (below 2^53, so exact).
--
-- State layout: every limit but the sliding log keeps ONE string per key,
-- written with its expiry in the same SET: fixed-width binary records
-- (`struct.pack`, big endian) whose length tells them apart:
--
--   token bucket     20 bytes  '>dI7I5'     tokens (the double's exact bits),
--                                           last (µs), capacity written with
--   fixed window     12 bytes  '>I7I5'      last (µs), count
--   sliding window   18 bytes  '>I7I2I2I7'  start (µs), count, prev (both
--                                           < 65536), last (µs)
--                    24 bytes  '>I7I5I5I7'  the same, larger counts
--   GCRA, leaky      12 bytes  '>I7I5'      TAT (µs), interval written with
--
-- `last` is when the latest unit was admitted, and the capacity or interval
-- what the state was written under: a reload that changes a limit's
-- parameters reads the state conservatively from them (see
-- src/algorithm/mod.rs, "Reloads"). The layouts before them are still
-- read, as written under unchanged parameters: a token bucket of 15 bytes
-- ('>dI7'), a sliding window of 11 or 17 ('>I7I2I2', '>I7I5I5') with
-- last = start, a fixed window's start where `last` is now (the same
-- window under an unchanged length), and a TAT as a decimal integer.
-- Records of equal length (fixed window, GCRA) never share a key: the
-- algorithm is part of every key's code.
--
-- A value of any other type or length (another algorithm under the same
-- key) reads as absent: the limit decides as a fresh one and its next write
-- replaces the value. (A TAT of a real clock has 16 digits, none of the
-- record lengths, and a record's bytes never spell a decimal number, so
-- neither reads as the other.)
--
-- Each algorithm's decide(key, p1, p2, p3, now, cost) (p1..p3 the ARGV
-- strings) only reads, and returns (values, not a table: a table per call
-- costs more than all of its arithmetic):
--   allowed, remaining, reset_us, retry_us, ttl_us, and when allowed:
--   value  the new state, which decide.lua writes with SET ... PX; for
--          the sliding log, its writer: value(key, ttl_us, extra)
--   kind   what `extra` is: nil nothing, 1 the delay of a shaped request,
--          2 the window start (reported once written), 3 the sliding log's
--          state for its writer
--
-- Redis runs a script's whole body on every call, and in its Lua each
-- table, closure, function call, tonumber and reply element costs about as
-- much as a few arithmetic lines: the files build only what the call needs
-- (measured with callgrind on redis-server, instructions per EVALSHA).

-- ALG[name] is first `true` for each algorithm this call names, then the
-- algorithm's file replaces it by its decide function (refund.lua finds
-- refund functions in REFUND). `ENTRY` (the script's first line, set by
-- src/store/script.rs) says where the names are: decide.lua passes them at
-- ARGV[4], [9], [14], ...; refund.lua (rare) somewhere among its
-- arguments, so every argument is marked (no parameter or member is an
-- algorithm name). Each table costs, so one does both jobs.
local ALG, REFUND
if ENTRY == 'decide' and ARGV[4] then
  ALG = { [ARGV[4]] = true } -- sized for one, the usual count
  for i = 9, #ARGV, 5 do ALG[ARGV[i]] = true end
else
  ALG, REFUND = {}, {}
  for i = 1, #ARGV do ALG[ARGV[i]] = true end
end

-- Redis runs a script's whole body on every call, so every function or
-- table defined here is built again per decision: each algorithm file
-- defines its functions only when the call names it, and what the others
-- share is not built for a token bucket alone, the commonest call.
local floor, fmod, format, sat_sub
if ALG.fixed_window or ALG.sliding_window or ALG.sliding_log or ALG.gcra
    or ALG.leaky_bucket or ALG.concurrency then
  floor, fmod, format = math.floor, math.fmod, string.format
  -- Saturating subtraction of unsigned integers.
  sat_sub = function(a, b)
    if a > b then return a - b end
    return 0
  end
end
