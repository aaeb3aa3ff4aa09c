-- release.lua: delete the lock if, and only if, we own it, and wake a waiter.
--
-- KEYS[1]  the lock key; or a semaphore's or a shared lock's, which
--          ARGV[1] leaves as a holder (see holders.lua)
-- KEYS[2]  the record of its recent releases (see record.lua)
-- KEYS[3]  its holders, should KEYS[1] be a semaphore's or a shared lock's
-- KEYS[4]  optional: its abandoned attempts, a set of ids given up
-- ARGV[1]  the owner id
-- ARGV[2]  the channel on which waiters of KEYS[1] wait for its release
-- ARGV[3]  with KEYS[4]: how long to remember an attempt given up, in ms
--
-- Reply: 1 when KEYS[1] held ARGV[1] and was deleted; a message was
--        published on ARGV[2], and KEYS[2] records ARGV[1] for 10 s, the
--        clients' retry window (unless Redis refused the record, see
--        record.lua; and not for an attempt given up, with KEYS[4]: its
--        reply is nobody's to retry). 3 likewise, but Redis refused the
--        PUBLISH (an ACL without the channel): nobody was woken.
--        2 when ARGV[1] was released already (KEYS[2] records it): a
--        client's retry of this call after its reply was lost, whoever took
--        and released the key meanwhile (unless a later release's id took
--        its slot in KEYS[2]: 1 in 64 for each).
--        0 when KEYS[1] does not hold ARGV[1] (missing, another owner, or
--        not a string) and ARGV[1] was not released: a loss.
--        With KEYS[4], ARGV[1] is an attempt given up: it is added to
--        KEYS[4], whose expiry is pushed to at least ARGV[3] ms, whatever
--        the reply, so a late run of it will not take the lock (see
--        acquire.lua). A refusal (call.lua): nothing was changed.
return guarded(function()
    local value
    if read and type(read[1]) ~= "table" then
        value = read[1] -- by release_fast.lua
    else
        value = get(KEYS[1])
    end
    local h = named(value) and holders(1, 3) -- a semaphore's key, or a shared lock's
    local owned = value == ARGV[1] or h and h.score(ARGV[1]) ~= nil
    local retried = not owned and released(ARGV[1])
    local ttl = KEYS[4] and call("PTTL", KEYS[4])
    if KEYS[4] then
        need("SADD", KEYS[4], ARGV[1])
        need("PEXPIRE", KEYS[4], ARGV[3])
    end
    if owned and h then
        h.leave(ARGV[1])
    elseif owned then -- first: Redis refuses no DEL for memory, and lets the writes after it through
        call("DEL", KEYS[1])
    end
    if KEYS[4] then -- given up: remembered, with an expiry
        call("SADD", KEYS[4], ARGV[1])
        if ttl < tonumber(ARGV[3]) then
            call("PEXPIRE", KEYS[4], ARGV[3])
        end
    end
    if not owned then
        return retried and 2 or 0
    elseif not KEYS[4] then -- a give-up's reply is nobody's to retry
        remember(ARGV[1])
    end
    return type(redis.pcall("PUBLISH", ARGV[2], "")) == "number" and 1 or 3
end)
