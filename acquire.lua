-- acquire.lua: take the lock when it is free (a first acquisition).
--
-- KEYS[1]  the lock key
-- KEYS[2]  its abandoned attempts: a set of ids given up (see release.lua)
-- KEYS[3]  optional: its fencing counter (same hash slot, no TTL)
-- ARGV[1]  this attempt's owner id (random, fresh for every attempt)
-- ARGV[2]  the lease in milliseconds
--
-- Reply: when the lock is taken (KEYS[1] holds ARGV[1] with a lease of
--        ARGV[2] ms): status "OK", or with KEYS[3] an array {"OK", token}.
--        The token is the larger of the counter's last value plus one and
--        the server's clock in microseconds, and becomes the counter's
--        value: it increases on every acquisition, and keeps increasing
--        after a failover that lost the last increments, as long as the new
--        primary's clock is not behind by more than the failover took.
--        Otherwise an integer: the holder's remaining lease in ms (PTTL),
--        -1 when the key has no expiry, 0 for an attempt already given up.
--        The error REDISLOCK_CORRUPT_COUNTER when KEYS[3] holds anything but
--        a decimal integer below 2^53 - 1 (so that every token minted is
--        below 2^53, exact in Lua and in JSON): nothing was written.
--
-- Idempotent: a client that retries this call after losing its reply finds
-- the key holding ARGV[1] and is told it took the lock, with the token it
-- minted. An attempt that was given up (its id is in KEYS[2]) never takes
-- the lock, should its call reach the server late. A busy key costs two
-- commands: SET NX GET (Redis 7.0; SET NX and GET before) and PTTL.
local old = redis.pcall("SET", KEYS[1], ARGV[1], "NX", "GET", "PX", ARGV[2])
if type(old) == "table" then -- before Redis 7.0, or a key of another type
    if redis.pcall("SET", KEYS[1], ARGV[1], "NX", "PX", ARGV[2]) then
        old = false
    else
        old = redis.pcall("GET", KEYS[1])
    end
end
if old and old ~= ARGV[1] then
    return redis.call("PTTL", KEYS[1]) -- held by another owner (or not a string)
end
if not old and redis.pcall("SISMEMBER", KEYS[2], ARGV[1]) == 1 then
    redis.call("DEL", KEYS[1])
    return 0
end
if old then -- a retry of this very call
    redis.call("PEXPIRE", KEYS[1], ARGV[2])
    if KEYS[3] then
        return {"OK", tonumber(redis.call("GET", KEYS[3]))}
    end
    return "OK"
end
if not KEYS[3] then
    return "OK"
end
local last = redis.pcall("GET", KEYS[3])
if last then
    if type(last) ~= "string" or not string.match(last, "^%d+$") or #last > 16
        or tonumber(last) >= 2^53 - 1 then
        redis.call("DEL", KEYS[1])
        return redis.error_reply("REDISLOCK_CORRUPT_COUNTER fencing counter " .. KEYS[3] .. " is not a number")
    end
    last = tonumber(last)
end
local now = redis.call("TIME")
local token = math.max((last or 0) + 1, tonumber(now[1]) * 1000000 + tonumber(now[2]))
redis.call("SET", KEYS[3], string.format("%.0f", token))
return {"OK", token}
