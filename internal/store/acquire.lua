-- acquire.lua: take the lock when it is free (a first acquisition).
--
-- KEYS[1]  the lock key
-- KEYS[2]  its abandoned attempts: a set of ids given up (see release.lua)
-- KEYS[3]  its holders, should KEYS[1] be a shared lock's (holders.lua)
-- KEYS[4]  optional: its fencing counter (same hash slot, no TTL)
-- ARGV[1]  this attempt's owner id (random, fresh for every attempt)
-- ARGV[2]  the lease in milliseconds
-- ARGV[3]  optional: the attempt is a wait's, which a shared lock's
--          holders make way for: no new share is given for ARGV[3] ms
--          (see holders.lua), and the reply says when to attempt again
--
-- Reply: when the lock is taken (KEYS[1] holds ARGV[1] with a lease of
--        ARGV[2] ms): status "OK", or with KEYS[4] an array {"OK", token}
--        (see fence.lua). Otherwise an integer: the holder's remaining
--        lease in ms (PTTL), -1 when the key has no expiry, 0 for an attempt
--        already given up. The status REDISLOCK_KIND (call.lua) on a semaphore's key
--        (holders.lua), REDISLOCK_CORRUPT_COUNTER (fence.lua),
--        or a refusal (call.lua): the lock was not taken, and KEYS[1] was
--        given back if this call had set it (a refusal of that DEL says
--        "left to expire").
--
-- Idempotent: a client that retries this call after losing its reply finds
-- the key holding ARGV[1] and is told it took the lock, with the token it
-- minted. An attempt that was given up (its id is in KEYS[2]) never takes
-- the lock, should its call reach the server late. A busy key costs two
-- commands: SET NX GET (Redis 7.0; SET NX and GET before) and PTTL.
return guarded(function()
    local old = sent and sent[1] -- by acquire_fast.lua
    if not sent then
        old = redis.pcall("SET", KEYS[1], ARGV[1], "NX", "GET", "PX", ARGV[2])
    end
    if type(old) == "table" then
        -- Before Redis 7.0 (a syntax error), or a key of another type than a
        -- string: else Redis refused the SET.
        if not (string.find(old.err, "^WRONGTYPE") or string.find(old.err, "syntax")) then
            check(old, "SET", KEYS[1])
        end
        -- false when taken; else what the key holds
        old = not call("SET", KEYS[1], ARGV[1], "NX", "PX", ARGV[2]) and get(KEYS[1])
    end
    if named(old) then -- a semaphore, a shared lock (holders.lua)
        old = holders(1, 3).exclusive(old)
        if type(old) == "number" and old > 0 then
            return old -- a wait for a shared lock's holders: attempt again then
        end
    end
    if old and old ~= ARGV[1] then
        return call("PTTL", KEYS[1]) -- held by another owner (or not a string)
    elseif old then -- a retry of this very call
        call("PEXPIRE", KEYS[1], ARGV[2])
        return KEYS[4] and {"OK", tonumber(get(KEYS[4]))} or "OK"
    end
    -- Taken: given back should what follows be refused, or the attempt
    -- have been given up.
    local given = redis.pcall("SISMEMBER", KEYS[2], ARGV[1])
    local ok, reply = given == 0, "OK"
    if type(given) == "table" then
        ok, reply = pcall(check, given, "SISMEMBER", KEYS[2])
    elseif ok and KEYS[4] then
        ok, reply = pcall(function()
            return {"OK", mint(4, check(redis.pcall("TIME"), "TIME"))}
        end)
    end
    if ok then
        return reply
    end
    local undone = redis.pcall("DEL", KEYS[1])
    if given == 1 then
        return 0
    elseif type(undone) == "table" then
        reply = (type(reply) == "table" and reply.err or reply) .. "; " .. KEYS[1] .. " left to expire"
    end
    error(reply, 0)
end)
