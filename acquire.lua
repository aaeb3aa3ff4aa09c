-- acquire.lua: take the lock when it is free (a first acquisition).
--
-- KEYS[1]  the lock key
-- ARGV[1]  the new owner's id (random, unique to this hold)
-- ARGV[2]  the lease in milliseconds
--
-- Reply: status "OK" when the lock was taken: KEYS[1] now holds ARGV[1] with
--        a lease of ARGV[2] ms (one SET NX PX, nothing else).
--        Otherwise an integer: the holder's remaining lease in ms (PTTL),
--        -1 when the key has no expiry.
local taken = redis.call("SET", KEYS[1], ARGV[1], "NX", "PX", ARGV[2])
if taken then
    return taken
end
return redis.call("PTTL", KEYS[1])
