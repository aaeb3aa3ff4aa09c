-- acquire.lua: take the lock when it is free (a first acquisition).
--
-- KEYS[1]  the lock key
-- KEYS[2]  its abandoned attempts: a set of ids given up (see release.lua)
-- KEYS[3]  optional: its fencing counter (same hash slot, no TTL)
-- ARGV[1]  this attempt's owner id (random, fresh for every attempt)
-- ARGV[2]  the lease in milliseconds
--
-- Reply: when the lock is taken (KEYS[1] holds ARGV[1] with a lease of
--        ARGV[2] ms): status "OK", or with KEYS[3] an array {"OK", token}
--        (see fence.lua). Otherwise an integer: the holder's remaining
--        lease in ms (PTTL), -1 when the key has no expiry, 0 for an attempt
--        already given up. The error REDISLOCK_CORRUPT_COUNTER (fence.lua):
--        nothing was written.
--
-- Idempotent: a client that retries this call after losing its reply finds
-- the key holding ARGV[1] and is told it took the lock, with the token it
-- minted. An attempt that was given up (its id is in KEYS[2]) never takes
-- the lock, should its call reach the server late. A busy key costs two
-- commands: SET NX GET (Redis 7.0; SET NX and GET before) and PTTL.
local old = redis.pcall("SET", KEYS[1], ARGV[1], "NX", "GET", "PX", ARGV[2])
if type(old) == "table" then -- before Redis 7.0, or a key of another type
    -- false when taken; else what the key holds
    old = not redis.pcall("SET", KEYS[1], ARGV[1], "NX", "PX", ARGV[2]) and redis.pcall("GET", KEYS[1])
end
if old and old ~= ARGV[1] then
    return redis.call("PTTL", KEYS[1]) -- held by another owner (or not a string)
elseif old then -- a retry of this very call
    redis.call("PEXPIRE", KEYS[1], ARGV[2])
    return KEYS[3] and {"OK", tonumber(redis.call("GET", KEYS[3]))} or "OK"
elseif redis.pcall("SISMEMBER", KEYS[2], ARGV[1]) == 1 then
    redis.call("DEL", KEYS[1])
    return 0
elseif not KEYS[3] then
    return "OK"
end
local token, err = mint(3, redis.call("TIME"))
if not token then
    redis.call("DEL", KEYS[1])
    return err
end
return {"OK", token}
