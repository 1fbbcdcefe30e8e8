-- ratewatch: leaky bucket (src/algorithm/leaky_bucket.rs): a queue that
-- drains at a fixed rate. Its state is the time the queue is empty, and its
-- arithmetic is GCRA's with `burst = capacity` and a maximum delay (0
-- polices, above 0 shapes: an admitted request is told to wait delay_us).
--
-- KEYS[i]   a decimal integer: when the queue drains (µs since epoch)
-- ARGV      p1 = drain interval (µs per unit, integer)
--           p2 = capacity (units the queue holds, integer)
--           p3 = maximum delay (µs, integer; 0 polices)
-- now       µs since epoch; cost = units requested (0 peeks)
-- decide    returns (common.lua): allowed, remaining (units), reset_us,
--           retry_us, delay_us, ttl_us = drain time
-- refund    moves the drain time back by cost × interval; keeps the expiry

if ALG.leaky_bucket then -- defined only for calls that name it (common.lua)
ALG.leaky_bucket = ALG.gcra
if REFUND then REFUND.leaky_bucket = REFUND.gcra end
end -- if ALG.leaky_bucket
