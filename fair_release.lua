-- fair_release.lua: release a fair lock we own by handing it to the next
-- live waiter in its queue; or, for a waiter that gives up, leave the queue
-- (passing the lock on if it was handed to it meanwhile).
--
-- KEYS[1]  the lock key
-- KEYS[2]  the release marker of ARGV[1] (see release.lua)
-- KEYS[3]  its queue of waiters (see fair_acquire.lua)
-- KEYS[4]  its waiters' hash (see fair_acquire.lua)
-- KEYS[5]  its fencing counter (as in acquire.lua), whether or not this
--          lock is fenced: the waiter handed the lock may be
-- KEYS[6]  optional: its abandoned attempts, a set of ids given up
-- ARGV[1]  the owner id
-- ARGV[2]  the channel on which waiters of KEYS[1] wait
-- ARGV[3]  with KEYS[6]: how long to remember an attempt or wait given up,
--          in ms; ARGV[1] also leaves the queue
--
-- The handoff: the queue's first waiter that is still live gets the lock:
-- KEYS[1] is set to its id with the lease it wants (and a fencing token is
-- minted when its "f" says it is fenced), it leaves the queue, and
-- "<id> <seq> <token> <lease>" is published on ARGV[2] (token 0 for a
-- waiter not fenced; the lease in ms, by which the other waiters know when
-- the key would expire unreleased). Lapsed waiters before it are dropped,
-- at most 10 per call; when no live one is found, KEYS[1] is deleted and
-- an empty message is published, as release.lua does.
--
-- Reply: the message published when KEYS[1] held ARGV[1] and was handed
--        on (so that the releaser can tell a waiter of its own process
--        without pub/sub), 1 when it was deleted; either way KEYS[2]
--        exists for 10 s. 2 when ARGV[1] was released
--        already (a retry); 0 when KEYS[1] does not hold ARGV[1] and
--        ARGV[1] was not released: a loss. When KEYS[5] is not a number
--        and the first live waiter is fenced, the lock is deleted and the
--        release published, not handed on: that waiter stays first, and its
--        attempt replies REDISLOCK_CORRUPT_COUNTER (fair_acquire.lua).
if KEYS[6] then
    if type(redis.pcall("SADD", KEYS[6], ARGV[1])) == "number"
        and redis.call("PTTL", KEYS[6]) < tonumber(ARGV[3]) then
        redis.call("PEXPIRE", KEYS[6], ARGV[3])
    end
    redis.call("ZREM", KEYS[3], ARGV[1])
    redis.call("HDEL", KEYS[4], ARGV[1])
end
if redis.pcall("GET", KEYS[1]) ~= ARGV[1] then
    return redis.call("EXISTS", KEYS[2]) == 1 and 2 or 0
end
redis.call("SET", KEYS[2], 1, "PX", 10000)
local time = redis.call("TIME")
local now = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
for _ = 1, 10 do
    local next = redis.call("ZPOPMIN", KEYS[3])
    if not next[1] then
        break
    end
    local live, lease, fenced = string.match(redis.call("HGET", KEYS[4], next[1]) or "", "^(%d+) (%d+)(f?)$")
    if live and tonumber(live) > now and tonumber(lease) > 0 then
        local token = 0
        if fenced == "f" then
            token = mint(5, time)
        end
        if not token then -- it stays first; its own attempt tells it why
            redis.call("ZADD", KEYS[3], next[2], next[1])
            break
        end
        redis.call("HDEL", KEYS[4], next[1])
        redis.call("SET", KEYS[1], next[1], "PX", lease)
        local msg = next[1] .. " " .. next[2] .. " " .. string.format("%.0f", token) .. " " .. lease
        redis.call("PUBLISH", ARGV[2], msg)
        return msg
    end
    redis.call("HDEL", KEYS[4], next[1])
end
redis.call("DEL", KEYS[1])
redis.call("PUBLISH", ARGV[2], "")
return 1
