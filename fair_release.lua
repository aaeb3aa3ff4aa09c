-- fair_release.lua: release a fair lock we own by handing it to the next
-- live waiter in its queue; or, for a waiter that gives up, leave the queue
-- (passing the lock on if it was handed to it meanwhile).
--
-- KEYS[1]  the lock key
-- KEYS[2]  its release marker: the id of the latest owner released
-- KEYS[3]  its abandoned attempts: a set of ids given up
-- KEYS[4]  its queue of waiters (see fair_acquire.lua)
-- KEYS[5]  its fencing counter (as in acquire.lua), whether or not this
--          lock is fenced: the waiter handed the lock may be
-- ARGV[1]  the owner id
-- ARGV[2]  the channel on which waiters of KEYS[1] wait
-- ARGV[3]  how long to remember the release, in milliseconds (a lease)
-- ARGV[4]  0, or for an attempt or wait given up, how long to remember
--          that in ms: ARGV[1] also leaves the queue
-- ARGV[5]  the prefix of the waiters' liveness keys
--
-- The handoff: the queue's first waiter whose liveness key still exists
-- gets the lock: KEYS[1] is set to its id with the lease its liveness key
-- holds (and a fencing token is minted when the key's "f" says it is
-- fenced), it leaves the queue, and "<id> <seq> <token> <lease>" is
-- published on ARGV[2] (token 0 for a waiter not fenced; the lease in ms, by which
-- the other waiters know when the key would expire unreleased). Lapsed waiters before it are dropped,
-- at most 10 per call; when no live one is found, KEYS[1] is deleted and
-- an empty message is published, as release.lua does.
--
-- Reply: 1 when KEYS[1] held ARGV[1] and was handed on or deleted, and
--        KEYS[2] now holds ARGV[1]; 2 when ARGV[1] was released already
--        (a retry); 0 when KEYS[1] does not hold ARGV[1] and ARGV[1] was
--        not released: a loss. The error REDISLOCK_CORRUPT_COUNTER when
--        KEYS[5] is not a number and the next waiter is fenced: the lock
--        is then deleted, not handed on.
if ARGV[4] ~= "0" then
    if type(redis.pcall("SADD", KEYS[3], ARGV[1])) == "number"
        and redis.call("PTTL", KEYS[3]) < tonumber(ARGV[4]) then
        redis.call("PEXPIRE", KEYS[3], ARGV[4])
    end
    if redis.call("ZREM", KEYS[4], ARGV[1]) == 1 then
        redis.call("DEL", ARGV[5] .. ARGV[1])
    end
end
if redis.pcall("GET", KEYS[1]) ~= ARGV[1] then
    if redis.pcall("GET", KEYS[2]) == ARGV[1] then
        return 2
    end
    return 0
end
redis.call("SET", KEYS[2], ARGV[1], "PX", ARGV[3])
for _ = 1, 10 do
    local next = redis.call("ZPOPMIN", KEYS[4])
    if not next[1] then
        break
    end
    local wants = redis.pcall("GETDEL", ARGV[5] .. next[1])
    local lease, fenced
    if type(wants) == "string" then
        lease, fenced = string.match(wants, "^(%d+)(f?)$")
    end
    if lease and tonumber(lease) > 0 then
        local token = 0
        if fenced == "f" then
            local last = redis.pcall("GET", KEYS[5])
            if last and (type(last) ~= "string" or not string.match(last, "^%d+$") or #last > 16
                or tonumber(last) >= 2^53 - 1) then
                redis.call("DEL", KEYS[1])
                return redis.error_reply("REDISLOCK_CORRUPT_COUNTER fencing counter " .. KEYS[5] .. " is not a number")
            end
            local now = redis.call("TIME")
            token = math.max(tonumber(last or 0) + 1, tonumber(now[1]) * 1000000 + tonumber(now[2]))
            redis.call("SET", KEYS[5], string.format("%.0f", token))
        end
        redis.call("SET", KEYS[1], next[1], "PX", lease)
        redis.call("PUBLISH", ARGV[2], next[1] .. " " .. next[2] .. " " .. string.format("%.0f", token) .. " " .. lease)
        return 1
    end
end
redis.call("DEL", KEYS[1])
redis.call("PUBLISH", ARGV[2], "")
return 1
