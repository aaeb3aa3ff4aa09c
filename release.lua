-- release.lua: delete the lock if, and only if, we own it, and wake a waiter.
--
-- KEYS[1]  the lock key
-- KEYS[2]  its release marker: the id of the latest owner released
-- KEYS[3]  its abandoned attempts: a set of ids given up
-- ARGV[1]  the owner id
-- ARGV[2]  the channel on which waiters of KEYS[1] wait for its release
-- ARGV[3]  how long to remember the release, in milliseconds (a lease)
-- ARGV[4]  0, or for an attempt given up, how long to remember that in ms
--
-- Reply: 1 when KEYS[1] held ARGV[1] and was deleted; a message was
--        published on ARGV[2], and KEYS[2] now holds ARGV[1].
--        2 when ARGV[1] was released already (KEYS[2] holds it): a client's
--        retry of this call after its reply was lost.
--        0 when KEYS[1] does not hold ARGV[1] (missing, another owner, or
--        not a string) and ARGV[1] was not released: a loss.
--        With ARGV[4] > 0, ARGV[1] is added to KEYS[3], whose expiry is
--        pushed to at least ARGV[4] ms, whatever the reply: a late run of
--        that acquisition will not take the lock (see acquire.lua).
if ARGV[4] ~= "0" and type(redis.pcall("SADD", KEYS[3], ARGV[1])) == "number" then
    if redis.call("PTTL", KEYS[3]) < tonumber(ARGV[4]) then
        redis.call("PEXPIRE", KEYS[3], ARGV[4])
    end
end
local owner = redis.pcall("GET", KEYS[1])
if owner == ARGV[1] then
    redis.call("DEL", KEYS[1])
    redis.call("SET", KEYS[2], ARGV[1], "PX", ARGV[3])
    redis.call("PUBLISH", ARGV[2], "")
    return 1
end
if redis.pcall("GET", KEYS[2]) == ARGV[1] then
    return 2
end
return 0
