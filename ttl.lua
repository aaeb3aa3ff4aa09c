-- ttl.lua: the remaining lease, checked against the owner.
--
-- KEYS[1]  the lock key
-- ARGV[1]  the owner's id
--
-- Reply: the remaining lease in ms (PTTL) when KEYS[1] holds ARGV[1]
--        (-1 when someone removed its expiry); -2 when it does not.
if redis.pcall("GET", KEYS[1]) == ARGV[1] then
    return redis.call("PTTL", KEYS[1])
end
return -2
