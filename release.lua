-- release.lua: delete the lock if, and only if, we own it.
--
-- KEYS[1]  the lock key
-- ARGV[1]  the owner's id
--
-- Reply: 1 when KEYS[1] held ARGV[1] and was deleted.
--        0 when it did not (missing, another owner, or not a string):
--        nothing was deleted.
if redis.pcall("GET", KEYS[1]) == ARGV[1] then
    return redis.call("DEL", KEYS[1])
end
return 0
