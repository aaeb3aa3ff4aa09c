-- extend.lua: verify ownership and refresh the lease (re-entry and renewal).
--
-- KEYS[1]  the lock key
-- ARGV[1]  the owner's id
-- ARGV[2]  the lease in milliseconds
--
-- Reply: 1 when KEYS[1] holds ARGV[1]; its lease is now ARGV[2] ms.
--        0 when it does not (missing, another owner, or not a string):
--        the lock is lost and nothing was changed.
if redis.pcall("GET", KEYS[1]) == ARGV[1] then
    return redis.call("PEXPIRE", KEYS[1], ARGV[2])
end
return 0
