-- break.lua: delete a lock held by a given owner, on an operator's word,
-- and wake its waiters.
--
-- KEYS[1]  the lock key
-- KEYS[2]  its break marker: the id of the latest owner broken
-- ARGV[1]  the owner id to break
-- ARGV[2]  the channel on which waiters of KEYS[1] wait for its release
-- ARGV[3]  how long to remember the break, in milliseconds
--
-- Reply: {broken, owner, pttl}: owner and pttl are the value and PTTL of
--        KEYS[1] before the call ("" and -2 when missing, "" when not a
--        string; a key of another type is never deleted). broken is 1 when KEYS[1] held ARGV[1] and was deleted; a
--        message was published on ARGV[2], and KEYS[2] now holds ARGV[1].
--        2 when ARGV[1] was broken already (KEYS[2] holds it): a client's
--        retry of this call after its reply was lost. 0 otherwise.
local owner = redis.pcall("GET", KEYS[1])
local pttl = redis.call("PTTL", KEYS[1])
local held = type(owner) == "string" -- a value of another type is not a lock
if not held then
    owner = ""
end
if held and owner == ARGV[1] then
    redis.call("DEL", KEYS[1])
    redis.call("SET", KEYS[2], ARGV[1], "PX", ARGV[3])
    redis.call("PUBLISH", ARGV[2], "")
    return {1, owner, pttl}
end
if redis.pcall("GET", KEYS[2]) == ARGV[1] then
    return {2, owner, pttl}
end
return {0, owner, pttl}
