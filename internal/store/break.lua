-- break.lua: delete a lock on an operator's word, whoever holds it or only
-- a given owner, and wake its waiters.
--
-- KEYS[1]  the lock key; or a semaphore's or a shared lock's (see
--          holders.lua), of which ARGV[1] leaves the holders, or all do
-- KEYS[2]  its recent breaks: a hash of call id -> "<pttl> <owner>"
-- KEYS[3]  its holders, should it be a semaphore's or a shared lock's
-- ARGV[1]  the owner id to break, or "" for whoever holds the lock
-- ARGV[2]  the channel on which waiters of KEYS[1] wait for its release
-- ARGV[3]  how long to remember a break, in milliseconds
-- ARGV[4]  this call's id, random, fresh for every call
--
-- Reply: {broken, owner, pttl}, owner and pttl being the value and PTTL of
--        KEYS[1] before the call ("" and -2 when missing, "" when not a
--        string; of a semaphore or a shared lock, the holder that left, or
--        "" when all did):
--        1   KEYS[1] was deleted (it held ARGV[1], or anything with ARGV[1]
--            ""), a message was published on ARGV[2], and KEYS[2]
--            remembers the call (unless Redis refused to write it: a retry
--            then finds nothing to break);
--        3   likewise, but Redis refused the PUBLISH: nobody was woken;
--        2   this call broke the lock already (KEYS[2] remembers ARGV[4]):
--            a client's retry of it after its reply was lost; owner and
--            pttl are those it broke;
--        0   nothing was deleted: the key is missing, or holds another
--            owner than ARGV[1];
--        -1  nothing was deleted: the key is of another type than a string.
--        A refusal (call.lua): nothing was deleted.
return guarded(function()
    local done = redis.pcall("HGET", KEYS[2], ARGV[4])
    if type(done) == "string" then
        local pttl, owner = string.match(done, "^(%-?%d+) (.*)$")
        return {2, owner, tonumber(pttl)}
    elseif type(done) == "table" and not string.find(done.err, "^WRONGTYPE") then
        check(done, "HGET", KEYS[2])
    end
    local owner = get(KEYS[1])
    local pttl = call("PTTL", KEYS[1])
    local h = named(owner) and holders(1, 3)
    if h then -- a semaphore or a shared lock: ARGV[1] leaves, or all do
        owner = ARGV[1]
        if owner ~= "" and not h.score(owner) then
            return {0, "", pttl}
        end
    elseif type(owner) ~= "string" then
        if pttl == -2 then
            return {0, "", pttl}
        end
        return {-1, "", pttl}
    end
    if ARGV[1] ~= "" and owner ~= ARGV[1] then
        return {0, owner, pttl}
    end
    if h and owner ~= "" then
        h.leave(owner)
    else
        if h then -- every holder leaves
            need("DEL", KEYS[1])
            call("DEL", KEYS[3])
        end
        call("DEL", KEYS[1])
    end
    if type(done) ~= "table" then -- remembered, unless KEYS[2] is of another type
        if pcall(call, "HSET", KEYS[2], ARGV[4], pttl .. " " .. owner)
            and not pcall(call, "PEXPIRE", KEYS[2], ARGV[3]) then
            redis.pcall("HDEL", KEYS[2], ARGV[4]) -- never a hash without expiry
        end
    end
    local woken = type(redis.pcall("PUBLISH", ARGV[2], "")) == "number"
    return {woken and 1 or 3, owner, pttl}
end)
