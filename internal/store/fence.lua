-- fence.lua: mint(i, time), the fencing token of acquire.lua and the fair
-- scripts, which this text is put in front of (after call.lua).
--
-- KEYS[i]  the fencing counter (same hash slot as the lock, no TTL)
-- time     a TIME reply
--
-- Returns the larger of the counter's last value plus one and the server's
-- clock in microseconds, written to KEYS[i] as its new value: tokens
-- increase on every acquisition, and keep increasing after a failover that
-- lost the last increments, as long as the new primary's clock is not
-- behind by more than the failover took. Raises the error
-- REDISLOCK_CORRUPT_COUNTER, writing nothing, when KEYS[i] holds anything
-- but a decimal integer below 2^53 - 1 (so that every token is below 2^53,
-- exact in Lua and in JSON); raises a refusal as call does.
local function mint(i, time)
    local last = get(KEYS[i])
    if last and (type(last) ~= "string" or not string.match(last, "^%d+$") or #last > 16
        or tonumber(last) >= 2^53 - 1) then
        error(redis.error_reply("REDISLOCK_CORRUPT_COUNTER " .. KEYS[i]))
    end
    local token = math.max(tonumber(last or 0) + 1, tonumber(time[1]) * 1000000 + tonumber(time[2]))
    call("SET", KEYS[i], string.format("%.0f", token))
    return token
end
