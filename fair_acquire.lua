-- fair_acquire.lua: take a fair lock if it is free and no live waiter is
-- ahead of us; else, when asked, join (or stay in) its queue of waiters.
--
-- KEYS[1]  the lock key
-- KEYS[2]  its abandoned attempts: a set of ids given up (see release.lua)
-- KEYS[3]  its queue: a sorted set of waiter ids by arrival (server-side)
-- KEYS[4]  this waiter's liveness key: ARGV[4] .. ARGV[1]
-- KEYS[5]  optional: its fencing counter (as in acquire.lua)
-- ARGV[1]  the waiter's owner id (random, fresh for every wait)
-- ARGV[2]  the lease in milliseconds
-- ARGV[3]  the liveness window in ms: how long the waiter stays in the
--          queue without a refresh (fair_refresh.lua); "0" to make one
--          attempt without joining the queue
-- ARGV[4]  the prefix of the waiters' liveness keys
--
-- A waiter is live while its liveness key exists; the key holds the lease
-- the waiter wants, followed by "f" when it is fenced (KEYS[5] given): the
-- release that hands it the lock gives it that lease and, for "f", mints
-- its fencing token (fair_release.lua). The queue's scores are a server-side sequence: the
-- server clock in microseconds when a waiter joins an empty queue, the last
-- score plus one after that.
--
-- Reply: when the lock is taken (KEYS[1] holds ARGV[1] with a lease of
--        ARGV[2] ms, and the waiter is out of the queue): status "OK", or
--        with KEYS[5] an array {"OK", token} (as acquire.lua). Also when
--        KEYS[1] already holds ARGV[1]: the lock was handed to this waiter
--        (or this is a retry of a call that took it); its lease is renewed.
--        Otherwise an array {wait, seq}: wait is the holder's remaining
--        lease in ms (-1 when the key has no expiry), or when the key is
--        free but a live waiter is ahead, that waiter's remaining liveness;
--        seq is this waiter's score in the queue (0 when ARGV[3] is "0").
--        The integer 0 for an attempt given up (its id is in KEYS[2]).
--        The error REDISLOCK_CORRUPT_COUNTER as acquire.lua.
if redis.pcall("SISMEMBER", KEYS[2], ARGV[1]) == 1 then
    return 0
end

local function token()
    if not KEYS[5] then
        return nil
    end
    local last = redis.pcall("GET", KEYS[5])
    if last then
        if type(last) ~= "string" or not string.match(last, "^%d+$") or #last > 16
            or tonumber(last) >= 2^53 - 1 then
            return redis.error_reply("REDISLOCK_CORRUPT_COUNTER fencing counter " .. KEYS[5] .. " is not a number")
        end
        last = tonumber(last)
    end
    local now = redis.call("TIME")
    local t = math.max((last or 0) + 1, tonumber(now[1]) * 1000000 + tonumber(now[2]))
    redis.call("SET", KEYS[5], string.format("%.0f", t))
    return t
end

local owner = redis.pcall("GET", KEYS[1])
if owner == ARGV[1] then -- handed to us, or a retry of a call that took it
    redis.call("PEXPIRE", KEYS[1], ARGV[2])
    if redis.call("ZREM", KEYS[3], ARGV[1]) == 1 then
        redis.call("DEL", KEYS[4])
    end
    if KEYS[5] then
        return {"OK", tonumber(redis.call("GET", KEYS[5]))}
    end
    return "OK"
end

local wait
if owner == false then
    -- Free: ours unless a live waiter is ahead. Lapsed waiters at the head
    -- of the queue are dropped, at most 10 per call.
    for _ = 1, 10 do
        local head = redis.call("ZRANGE", KEYS[3], 0, 0)[1]
        if not head or head == ARGV[1] then
            break
        end
        local left = redis.call("PTTL", ARGV[4] .. head)
        if left ~= -2 then
            wait = left
            break
        end
        redis.call("ZREM", KEYS[3], head)
    end
    if not wait then
        local head = redis.call("ZRANGE", KEYS[3], 0, 0)[1]
        if head and head ~= ARGV[1] then
            wait = 1 -- more lapsed waiters than one call drops: again soon
        else
            local t = token()
            if type(t) == "table" then
                return t -- the corrupt counter's error
            end
            redis.call("SET", KEYS[1], ARGV[1], "PX", ARGV[2])
            if head then
                redis.call("ZREM", KEYS[3], ARGV[1])
                redis.call("DEL", KEYS[4])
            end
            if t then
                return {"OK", t}
            end
            return "OK"
        end
    end
else
    wait = redis.call("PTTL", KEYS[1]) -- held by another owner (or not a string)
end

if ARGV[3] == "0" then
    return {wait, 0}
end
local last = redis.call("ZRANGE", KEYS[3], -1, -1, "WITHSCORES")[2]
local seq
if last then
    seq = tonumber(last) + 1
else
    local now = redis.call("TIME")
    seq = tonumber(now[1]) * 1000000 + tonumber(now[2])
end
if redis.call("ZADD", KEYS[3], "NX", seq, ARGV[1]) == 0 then
    seq = tonumber(redis.call("ZSCORE", KEYS[3], ARGV[1])) -- queued already
elseif not last then
    -- A new queue lives two windows; each refresh pushes that on (see
    -- fair_refresh.lua), so it expires two windows after its last live
    -- waiter stopped refreshing.
    redis.call("PEXPIRE", KEYS[3], 2 * tonumber(ARGV[3]))
end
local wants = ARGV[2]
if KEYS[5] then
    wants = wants .. "f" -- a handoff mints this waiter a fencing token
end
redis.call("SET", KEYS[4], wants, "PX", ARGV[3])
return {wait, seq}
