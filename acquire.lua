-- acquire.lua: take the lock when it is free (a first acquisition).
--
-- KEYS[1]  the lock key
-- KEYS[2]  optional: the fencing counter of KEYS[1] (same hash slot, no TTL)
-- ARGV[1]  the new owner's id (random, unique to this hold)
-- ARGV[2]  the lease in milliseconds
--
-- Reply: when the lock was taken (KEYS[1] now holds ARGV[1] with a lease of
--        ARGV[2] ms): status "OK", or with KEYS[2] an array {"OK", token}.
--        The token is the larger of the counter's last value plus one and
--        the server's clock in microseconds, and becomes the counter's
--        value: it increases on every acquisition, and keeps increasing
--        after a failover that lost the last increments, as long as the new
--        primary's clock is not behind by more than the failover took.
--        Otherwise an integer: the holder's remaining lease in ms (PTTL),
--        -1 when the key has no expiry.
local taken = redis.call("SET", KEYS[1], ARGV[1], "NX", "PX", ARGV[2])
if taken then
    if KEYS[2] then
        local now = redis.call("TIME")
        local token = math.max(tonumber(redis.call("GET", KEYS[2]) or "0") + 1,
            tonumber(now[1]) * 1000000 + tonumber(now[2]))
        redis.call("SET", KEYS[2], string.format("%.0f", token))
        return {"OK", token}
    end
    return taken
end
return redis.call("PTTL", KEYS[1])
