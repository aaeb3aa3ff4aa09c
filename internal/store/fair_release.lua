-- fair_release.lua: release a fair lock we own by handing it to the next
-- live waiter in its queue; or, for a waiter that gives up, leave the queue
-- (passing the lock on if it was handed to it meanwhile).
--
-- KEYS[1]  the lock key; or a semaphore's (see holders.lua), whose permit
--          ARGV[1] holds is handed on, or left; or a shared lock's, of
--          which ARGV[1] leaves its share
-- KEYS[2]  the record of its recent releases (see record.lua)
-- KEYS[3]  its queue of waiters (see fair_acquire.lua)
-- KEYS[4]  its waiters' hash (see fair_acquire.lua)
-- KEYS[5]  its fencing counter (as in acquire.lua), whether or not this
--          lock is fenced: the waiter handed the lock may be
-- KEYS[6]  its holders, should it be a semaphore's or a shared lock's
-- KEYS[7]  optional: its abandoned attempts, a set of ids given up
-- ARGV[1]  the owner id
-- ARGV[2]  the channel on which waiters of KEYS[1] wait
-- ARGV[3]  with KEYS[7]: how long to remember an attempt or wait given up,
--          in ms; ARGV[1] also leaves the queue
--
-- The handoff: the queue's first waiter that is still live gets the lock:
-- KEYS[1] is set to its id with the lease it wants (and a fencing token is
-- minted when its "f" says it is fenced), it leaves the queue, and
-- "<id> <seq> <token> <lease>" is published on ARGV[2] (token 0 for a
-- waiter not fenced; the lease in ms, by which the other waiters know when
-- the key would expire unreleased). Lapsed waiters before it are dropped,
-- at most 10 per call; when no live one is found, KEYS[1] is deleted and
-- an empty message is published, as release.lua does. A waiter for a
-- share ("s", see fair_acquire.lua) is handed one, and so is each live
-- waiter for a share after it, up to the next exclusive waiter: a message
-- each. A shared lock is handed on only by the release of its last
-- holder.
--
-- Reply: the messages published when KEYS[1] held ARGV[1] and was handed
--        on, one per line (so that the releaser can tell waiters of its
--        own process without pub/sub), "!" and the messages when Redis
--        refused a PUBLISH; 1 when it was deleted, 3 when deleted and the PUBLISH
--        refused (as release.lua); either way ARGV[1] is recorded in
--        KEYS[2] as release.lua records it.
--        2 when ARGV[1] was released already (a retry); 0 when KEYS[1]
--        does not hold ARGV[1] and ARGV[1] was not released: a loss (or,
--        with KEYS[7], a waiter that leaves; one that waited exclusive for
--        a key not held exclusive publishes an empty message, so that the
--        waiters for a share behind it attempt). When
--        no token can be minted for the first live waiter, fenced (KEYS[5]
--        is not a number, or Redis refused a command of it), the lock is
--        deleted and the release published, not handed on: that waiter
--        stays first, and its own attempt replies why (fair_acquire.lua).
--        A refusal (call.lua): nothing was changed.
return guarded(function()
    local value = get(KEYS[1])
    local h = named(value) and holders(1, 6) -- a semaphore's key, or a shared lock's
    local owned = value == ARGV[1] or h and h.score(ARGV[1]) ~= nil
    local retried = not owned and released(ARGV[1])
    local time = check(redis.pcall("TIME"), "TIME")
    local ttl = KEYS[7] and call("PTTL", KEYS[7])
    local leaving = KEYS[7] and not owned and redis.pcall("HGET", KEYS[4], ARGV[1]) -- its place in the queue
    -- Every write below, asked for before the first; the first may still
    -- be refused for the server's state, and then nothing was written.
    need("ZREM", KEYS[3], ARGV[1])
    need("HDEL", KEYS[4], ARGV[1])
    need("SET", KEYS[1], ARGV[1])
    need("DEL", KEYS[1])
    need("DEL", KEYS[6])
    need("ZADD", KEYS[6]) -- a share handed on, a permit too
    need("ZSCORE", KEYS[6])
    need("PEXPIRE", KEYS[6])
    need("PEXPIRE", KEYS[1])
    if h then -- a permit or a share handed on, or left
        need("ZREM", KEYS[6])
        need("PTTL", KEYS[6])
        need("PTTL", KEYS[1])
        need("ZCOUNT", KEYS[6])
        need("ZRANGEBYSCORE", KEYS[6])
        need("ZRANGE", KEYS[3]) -- read after a share left
        need("HGET", KEYS[4])
    end
    if KEYS[7] then
        need("PEXPIRE", KEYS[7], ARGV[3])
    end
    if KEYS[7] then
        need("SADD", KEYS[7], ARGV[1])
        -- Out of the queue first: Redis refuses no ZREM for memory, and once
        -- it removed something, lets the writes after it through.
        call("ZREM", KEYS[3], ARGV[1])
        call("HDEL", KEYS[4], ARGV[1])
        call("SADD", KEYS[7], ARGV[1])
        if ttl < tonumber(ARGV[3]) then
            call("PEXPIRE", KEYS[7], ARGV[3])
        end
    end
    if not owned then
        if type(leaving) == "string" and not string.find(leaving, "s$") and (value == false or h) then
            redis.pcall("PUBLISH", ARGV[2], "") -- an exclusive waiter left: shares behind it may go in
        end
        return retried and 2 or 0
    end
    local now = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
    local shared = value == SHARED
    local held -- by other shares
    if shared then -- a share leaves; the lock is handed on only once free
        h.leave(ARGV[1])
        held = h.drop(now) > 0
    end
    local msgs, lapsed = {}, 0
    while lapsed < 10 and not held do
        local head = call("ZRANGE", KEYS[3], 0, 0, "WITHSCORES")
        if not head[1] then
            break
        end
        local live, lease, fenced, share = string.match(call("HGET", KEYS[4], head[1]) or "", "^(%d+) (%d+)(f?)(s?)$")
        local token
        if live and tonumber(live) > now and tonumber(lease) > 0 then
            if #msgs > 0 and share == "" then -- an exclusive waiter after shares handed on: it stays
                -- first, and new shares that do not queue wait behind it (holders.lua)
                call("ZADD", KEYS[6], "XX", "LT", -math.min(tonumber(live), now + 1000), SHARED)
                break
            elseif share == "s" and h and not shared then
                break -- a share of a semaphore: it stays first; its own attempt tells it why
            end
            token = 0
            if fenced == "f" then
                local minted, t = pcall(mint, 5, time)
                if not minted then
                    break -- it stays first; its own attempt tells it why
                end
                token = t
            end
        else
            lapsed = lapsed + 1
        end
        call("ZREM", KEYS[3], head[1])
        call("HDEL", KEYS[4], head[1])
        if token and share == "s" then -- a share: the next live waiters that want one follow it
            local shares = holders(1, 6) -- the first joins a new shared lock, which replaces ours, an exclusive holder's
            shares.join(head[1], 0, #msgs > 0 and shares.score(SHARED) or nil, now, lease, token > 0 and token or nil)
        elseif token and h and not shared then -- our permit passes to the waiter
            call("ZREM", KEYS[6], ARGV[1], "#" .. ARGV[1])
            call("ZADD", KEYS[6], now + lease, head[1])
            if token > 0 then
                call("ZADD", KEYS[6], token, "#" .. head[1])
            end
            h.outlive(lease)
        elseif token then
            if h then
                call("DEL", KEYS[6]) -- the holders of a shared lock, ours as its last
            end
            call("SET", KEYS[1], head[1], "PX", lease)
        end
        if token then
            msgs[#msgs + 1] = head[1] .. " " .. head[2] .. " " .. string.format("%.0f", token) .. " " .. lease
            if share == "" then
                break
            end
        end
    end
    if #msgs == 0 and h and not shared then
        h.leave(ARGV[1])
    elseif #msgs == 0 and not h then
        call("DEL", KEYS[1])
    end
    if not KEYS[7] then -- a give-up's reply is nobody's to retry
        remember(ARGV[1])
    end
    local heard = true
    for i = 1, math.max(#msgs, 1) do
        heard = type(redis.pcall("PUBLISH", ARGV[2], msgs[i] or "")) == "number" and heard
    end
    local msg = table.concat(msgs, "\n")
    if heard then
        return msg == "" and 1 or msg
    end
    return msg == "" and 3 or "!" .. msg
end)
