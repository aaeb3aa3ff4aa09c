-- release.lua: delete the lock if, and only if, we own it, and wake a waiter.
--
-- KEYS[1]  the lock key
-- KEYS[2]  the release marker of ARGV[1] (a key of its own per owner id)
-- KEYS[3]  optional: its abandoned attempts, a set of ids given up
-- ARGV[1]  the owner id
-- ARGV[2]  the channel on which waiters of KEYS[1] wait for its release
-- ARGV[3]  with KEYS[3]: how long to remember an attempt given up, in ms
--
-- Reply: 1 when KEYS[1] held ARGV[1] and was deleted; a message was
--        published on ARGV[2], and KEYS[2] exists for 10 s, the clients'
--        retry window.
--        2 when ARGV[1] was released already (KEYS[2] exists): a client's
--        retry of this call after its reply was lost, whoever took and
--        released the key meanwhile.
--        0 when KEYS[1] does not hold ARGV[1] (missing, another owner, or
--        not a string) and ARGV[1] was not released: a loss.
--        With KEYS[3], ARGV[1] is an attempt given up: it is added to
--        KEYS[3], whose expiry is pushed to at least ARGV[3] ms, whatever
--        the reply, so a late run of it will not take the lock (see
--        acquire.lua).
if KEYS[3] and type(redis.pcall("SADD", KEYS[3], ARGV[1])) == "number"
    and redis.call("PTTL", KEYS[3]) < tonumber(ARGV[3]) then
    redis.call("PEXPIRE", KEYS[3], ARGV[3])
end
if redis.pcall("GET", KEYS[1]) == ARGV[1] then
    redis.call("DEL", KEYS[1])
    redis.call("SET", KEYS[2], 1, "PX", 10000)
    redis.call("PUBLISH", ARGV[2], "")
    return 1
end
return redis.call("EXISTS", KEYS[2]) == 1 and 2 or 0
