-- release.lua: delete the lock if, and only if, we own it, and wake a waiter.
--
-- KEYS[1]  the lock key
-- ARGV[1]  the owner's id
-- ARGV[2]  the channel on which waiters of KEYS[1] wait for its release
--
-- Reply: 1 when KEYS[1] held ARGV[1] and was deleted; a message was
--        published on ARGV[2].
--        0 when it did not (missing, another owner, or not a string):
--        nothing was deleted or published.
if redis.pcall("GET", KEYS[1]) == ARGV[1] then
    redis.call("DEL", KEYS[1])
    redis.call("PUBLISH", ARGV[2], "")
    return 1
end
return 0
