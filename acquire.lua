-- acquire.lua: take the lock when it is free (a first acquisition).
--
-- KEYS[1]  the lock key
-- KEYS[2]  optional: the fencing counter of KEYS[1] (same hash slot, no TTL)
-- ARGV[1]  the new owner's id (random, unique to this hold)
-- ARGV[2]  the lease in milliseconds
--
-- Reply: when the lock was taken (KEYS[1] now holds ARGV[1] with a lease of
--        ARGV[2] ms): status "OK", or with KEYS[2] an array {"OK", token},
--        token being KEYS[2] incremented (1, 2, 3... for ever).
--        Otherwise an integer: the holder's remaining lease in ms (PTTL),
--        -1 when the key has no expiry.
local taken = redis.call("SET", KEYS[1], ARGV[1], "NX", "PX", ARGV[2])
if taken then
    if KEYS[2] then
        return {"OK", redis.call("INCR", KEYS[2])}
    end
    return taken
end
return redis.call("PTTL", KEYS[1])
