-- permit_acquire.lua: take a permit of a semaphore, or a share of a shared
-- lock, when one is free (a first acquisition). See holders.lua.
--
-- KEYS[1]  the key, a string naming its kind (see holders.lua)
-- KEYS[2]  its abandoned attempts: a set of ids given up (see release.lua)
-- KEYS[3]  its holders (see holders.lua)
-- KEYS[4]  optional: its fencing counter (see fence.lua); the holder's token
--          is kept in KEYS[3] (see holders.lua)
-- ARGV[1]  this attempt's owner id (random, fresh for every attempt)
-- ARGV[2]  the lease in milliseconds
-- ARGV[3]  the number of permits; "0" for a shared lock
--
-- Reply: "OK" when taken (with KEYS[4], {"OK", token}): ARGV[1] holds KEYS[1] until the server's clock
--        plus ARGV[2] ms, and the key lives at least as long. Otherwise an
--        integer: how long until a permit frees at the latest (the first
--        holder's lease to end), until an exclusive holder's wait ends
--        (shared), the PTTL of an exclusive holder's key (shared: a string;
--        -1 without expiry), or 0 for an attempt given up. The status
--        REDISLOCK_KIND when KEYS[1] is another kind than asked for (a lock,
--        a semaphore of another number of permits, a shared lock, or a key
--        of another type), or a refusal (call.lua): nothing was changed.
--        Idempotent: a retry finds ARGV[1] a holder, and is told "OK".
return guarded(function()
    local h = holders(1, 3)
    local n = tonumber(ARGV[3])
    local have = h.ours(n)
    if have == false then
        return call("PTTL", KEYS[1]) -- an exclusive holder's
    end
    local token = KEYS[4] and have and h.score("#" .. ARGV[1])
    if token then
        return {"OK", token} -- a retry of this very call, fenced
    end
    local ms, time = h.clock()
    if have and n == 0 and -have > ms then
        return -have - ms -- an exclusive holder waits
    elseif call("SISMEMBER", KEYS[2], ARGV[1]) == 1 then
        return 0
    end
    need("ZADD", KEYS[3])
    need("PEXPIRE", KEYS[3])
    need("PTTL", KEYS[3])
    need("PEXPIRE", KEYS[1])
    need("PTTL", KEYS[1])
    if not have then
        need("DEL", KEYS[3])
        need("SET", KEYS[1])
    end
    if have and n > 0 and h.count() >= n then -- full
        if h.score(ARGV[1]) then
            return "OK" -- a retry of this very call
        end
        need("ZRANGEBYSCORE", KEYS[3])
        need("ZREM", KEYS[3])
        if h.drop(ms) >= n then
            return h.first(ms)
        end
    end
    token = KEYS[4] and mint(4, time)
    h.join(ARGV[1], n, have, ms, ARGV[2], token)
    return token and {"OK", token} or "OK"
end)
