-- inspect.lua: read the state of a lock without owning it. Read-only.
--
-- KEYS[1]  the lock key
-- KEYS[2]  its fencing counter
-- KEYS[3]  its queue of waiters, when it is a fair lock (see fair_acquire.lua)
-- KEYS[4]  its waiters' hash (see fair_acquire.lua)
-- KEYS[5]  its holders, when it is a semaphore or a shared lock (see
--          holders.lua)
--
-- Reply: {type, owner, pttl, counter, waiters, expires, holders}:
--        type     the type of KEYS[1]: "none" when the lock is free,
--                 "string" when held, another type when someone else
--                 wrote the key;
--        owner    the value of KEYS[1] when it is a string, else "";
--        pttl     the PTTL of KEYS[1] in ms (-2 missing, -1 no expiry);
--        counter  "=" followed by the value of KEYS[2]; "" when missing;
--                 "(type)" when it is not a string;
--        waiters  how many ids in KEYS[3] are live in KEYS[4];
--        expires  when KEYS[1] expires, in ms of the server's clock
--                 (PEXPIRETIME; before Redis 7.0, TIME + pttl), -1 without
--                 expiry, -2 missing.
--        holders  when KEYS[1] names a semaphore or a shared lock
--                 (holders.lua), from KEYS[5]: id, lease left in ms, for
--                 each live holder; "#" .. id and its token; its mark and score.
--        A refusal as call.lua says.
return guarded(function()
    local kind = call("TYPE", KEYS[1]).ok
    local owner = kind == "string" and call("GET", KEYS[1]) or ""
    local counterKind = call("TYPE", KEYS[2]).ok
    local counter = counterKind == "none" and "" or "(" .. counterKind .. ")"
    if counterKind == "string" then
        counter = "=" .. call("GET", KEYS[2])
    end
    local time = check(redis.pcall("TIME"), "TIME")
    local now = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
    local waiters = 0
    if call("TYPE", KEYS[3]).ok == "zset" and call("TYPE", KEYS[4]).ok == "hash" then
        for _, id in ipairs(call("ZRANGE", KEYS[3], 0, -1)) do
            local live = tonumber(string.match(call("HGET", KEYS[4], id) or "", "^(%d+) "))
            if live and live > now then waiters = waiters + 1 end
        end
    end
    local pttl = call("PTTL", KEYS[1])
    local expires = redis.pcall("PEXPIRETIME", KEYS[1])
    if type(expires) ~= "number" then -- Redis before 7.0
        expires = pttl >= 0 and now + pttl or pttl
    end
    local holders = {} -- of a semaphore or a shared lock: id, lease left
    if (owner == "redislock:permits" or owner == "redislock:shared") and call("TYPE", KEYS[5]).ok == "zset" then
        local all = call("ZRANGE", KEYS[5], 0, -1, "WITHSCORES")
        for i = 1, #all, 2 do
            local score = tonumber(all[i + 1])
            local token = string.sub(all[i], 1, 1) == "#"
            if score <= 0 or score > now then
                holders[#holders + 1] = all[i]
                holders[#holders + 1] = score > 0 and not token and score - now or score
            end
        end
    end
    return {kind, owner, pttl, counter, waiters, expires, holders}
end)
