-- fair_acquire.lua: take a fair lock if it is free and no live waiter is
-- ahead of us; else, when asked, join (or stay in) its queue of waiters.
--
-- KEYS[1]  the lock key
-- KEYS[2]  its abandoned attempts: a set of ids given up (see release.lua)
-- KEYS[3]  its queue: a sorted set of waiter ids by arrival (server-side)
-- KEYS[4]  its waiters: a hash of waiter id -> "<until> <lease>[f][s]"
-- KEYS[5]  its holders, should it be a semaphore's or a shared lock's
-- KEYS[6]  optional: its fencing counter (as in acquire.lua)
-- ARGV[1]  the waiter's owner id (random, fresh for every wait)
-- ARGV[2]  the lease in milliseconds
-- ARGV[3]  the liveness window in ms: how long the waiter stays in the
--          queue without another call (a waiter calls again at least
--          every window/3); "0" to make one attempt without joining the
--          queue
-- ARGV[4]  optional: KEYS[1] is a semaphore of ARGV[4] permits (see
--          holders.lua), of which the waiter wants one; "0": a shared
--          lock, of which the waiter wants a share
--
-- A waiter is live until <until>, in ms of the server's clock; <lease> is
-- the lease it wants, "f" says it is fenced (KEYS[6] given), "s" that it
-- wants a share: the release that hands it the lock gives it that lease
-- and, for "f", mints its fencing token (fair_release.lua). A share is
-- free when no exclusive holder holds the key and no live waiter ahead
-- wants it exclusive (a writer's mark, see holders.lua, holds off only
-- the shares that do not queue); an exclusive waiter marks a key that
-- shares hold, as acquire.lua does, for min(ARGV[3], 1 s). The queue's scores are a
-- server-side sequence: the server clock in microseconds when a waiter
-- joins an empty queue, the last score plus one after that. The queue and
-- the waiters live at least two windows of the latest waiter to join or
-- refresh.
--
-- Reply: when the lock is taken (KEYS[1] holds ARGV[1] with a lease of
--        ARGV[2] ms, and the waiter is out of the queue): status "OK", or
--        with KEYS[5] an array {"OK", token} (as acquire.lua). Also when
--        KEYS[1] already holds ARGV[1]: the lock was handed to this waiter
--        (or this is a retry of a call that took it); its lease is renewed.
--        Otherwise an array {wait, seq}: wait is the holder's remaining
--        lease in ms (-1 when the key has no expiry), or when the key is
--        free but a live waiter is ahead, that waiter's remaining liveness,
--        or a third of an exclusive waiter's mark when shorter (see above);
--        seq is this waiter's score in the queue (0 when ARGV[3] is "0").
--        The integer 0 for an attempt given up (its id is in KEYS[2]).
--        The status REDISLOCK_CORRUPT_COUNTER as acquire.lua, or a refusal
--        (call.lua): the lock was not taken (a lock handed to the waiter
--        stays its own, with the lease it was handed), and the waiter is
--        where it was in the queue, or out of it.
return guarded(function()
    if call("SISMEMBER", KEYS[2], ARGV[1]) == 1 then return 0 end
    local time = check(redis.pcall("TIME"), "TIME")
    local now = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)

    local function leave()
        call("ZREM", KEYS[3], ARGV[1])
        call("HDEL", KEYS[4], ARGV[1])
    end

    local owner = get(KEYS[1])
    local n, h, have, wait, mark, replaces = tonumber(ARGV[4]), nil, nil, nil, nil, false
    if n then -- a semaphore or a shared lock: ours if we hold, free if we may
        h = holders(1, 5)
        have = h.ours(n)
        if have and h.score(ARGV[1]) then
            owner = ARGV[1]
        elseif have == false then -- an exclusive holder's
            wait = call("PTTL", KEYS[1])
        else
            owner = n > 0 and have and h.count() >= n and h.drop(now) >= n and 0 or false
        end
        need("ZADD", KEYS[5])
        need("PTTL", KEYS[5])
        need("PTTL", KEYS[1])
    elseif owner == PERMITS then
        holders(1, 5).wrongKind("is a semaphore")
    elseif owner == SHARED then
        local shares = holders(1, 5)
        if call("ZCOUNT", KEYS[5], "(" .. now, "(1e14") == 0 then
            owner, replaces = false, true -- free: the SET below replaces the shared lock
        else -- held: no new share that does not queue, once queued (below)
            wait = shares.first(now)
            mark = ARGV[3] ~= "0" and math.min(tonumber(ARGV[3]), 1000)
            if mark then
                need("ZADD", KEYS[5])
                wait = math.min(wait, math.max(math.floor(mark / 3), 1))
            end
        end
    end
    -- Every write below, asked for before the first.
    need("ZADD", KEYS[3], 1, ARGV[1])
    need("ZREM", KEYS[3], ARGV[1])
    need("HSET", KEYS[4], ARGV[1], 1)
    need("HDEL", KEYS[4], ARGV[1])
    need("SET", KEYS[1], ARGV[1])
    need("PEXPIRE", KEYS[1], ARGV[2])
    need("DEL", KEYS[5])
    if owner == ARGV[1] then -- handed to us, or a retry of a call that took it
        if h then
            h.outlive(ARGV[2]) -- first: Redis then lets the ZADD through whatever its memory
            call("ZADD", KEYS[5], "XX", now + ARGV[2], ARGV[1])
        else
            call("PEXPIRE", KEYS[1], ARGV[2])
        end
        leave()
        if h and KEYS[6] then
            return {"OK", h.score("#" .. ARGV[1])}
        end
        return KEYS[6] and {"OK", tonumber(get(KEYS[6]))} or "OK"
    end

    if owner == false then
        -- Free: ours unless a live waiter is ahead. Lapsed waiters at the head
        -- of the queue are dropped, at most 10 per call.
        for _ = 1, 10 do
            local head = call("ZRANGE", KEYS[3], 0, 0)[1]
            if not head or head == ARGV[1] then
                break
            end
            local live = tonumber(string.match(call("HGET", KEYS[4], head) or "", "^(%d+) "))
            if live and live > now then
                wait = live - now
                break
            end
            call("ZREM", KEYS[3], head)
            call("HDEL", KEYS[4], head)
        end
        local head = call("ZRANGE", KEYS[3], 0, 0)[1]
        if n == 0 then -- a share: free unless a live waiter ahead wants it exclusive
            wait = nil
            local rank = call("ZRANK", KEYS[3], ARGV[1]) -- nil: not queued, all are ahead
            for _, id in ipairs(rank == 0 and {} or call("ZRANGE", KEYS[3], 0, rank and rank - 1 or -1)) do
                local live, share = string.match(call("HGET", KEYS[4], id) or "", "^(%d+) %d+f?(s?)$")
                if share == "" and tonumber(live) > now then
                    wait = live - now
                    break
                end
            end
        elseif not wait and head and head ~= ARGV[1] then
            wait = 1 -- more lapsed waiters than one call drops: again soon
        end
        if not wait then
            local t = KEYS[6] and mint(6, time)
            if h then
                h.join(ARGV[1], n, have, now, ARGV[2], t)
            else
                call("SET", KEYS[1], ARGV[1], "PX", ARGV[2]) -- first: Redis refuses it when memory is full
                if replaces then
                    call("DEL", KEYS[5]) -- the shared lock's holders, whose leases all ended
                end
            end
            if head then
                leave()
            end
            return t and {"OK", t} or "OK"
        end
    else -- held by another owner (or not a string), or every permit
        wait = wait or h and h.first(now) or call("PTTL", KEYS[1])
    end

    if ARGV[3] == "0" then
        return {wait, 0}
    end
    local last = call("ZRANGE", KEYS[3], -1, -1, "WITHSCORES")[2]
    local seq
    if last then
        seq = tonumber(last) + 1
    else
        seq = tonumber(time[1]) * 1000000 + tonumber(time[2])
    end
    if call("ZADD", KEYS[3], "NX", seq, ARGV[1]) == 0 then
        seq = tonumber(call("ZSCORE", KEYS[3], ARGV[1])) -- queued already
    end
    local wants = ARGV[2] .. (KEYS[6] and "f" or "") .. (n == 0 and "s" or "") -- see the header
    local window = tonumber(ARGV[3])
    call("HSET", KEYS[4], ARGV[1], string.format("%.0f", now + window) .. " " .. wants)
    for i = 3, 4 do -- a new key gets an expiry; an older one keeps the later
        if last then
            call("PEXPIRE", KEYS[i], 2 * window, "GT")
        else
            call("PEXPIRE", KEYS[i], 2 * window)
        end
    end
    if mark then -- last: no command follows a write Redis may refuse for memory
        call("ZADD", KEYS[5], "XX", "LT", -(now + mark), SHARED)
    end
    return {wait, seq}
end)
