-- permit_acquire_fast.lua: put in front of permit_acquire.lua's script,
-- before call.lua.
--
-- A permit of a semaphore with one free, or a share of a shared lock that
-- no exclusive holder waits for, its key held (not fenced, no WAIT to
-- follow: 3 KEYS and 3 ARGV, as permit_acquire.lua names them), taken
-- before the script makes its functions, which costs Redis more than the
-- commands: as permit_acquire.lua and holders.lua's join do it, replying
-- "OK". Anything else (a new key, a full semaphore, an exclusive holder
-- waiting, another kind or number of permits, an attempt given up, an ACL
-- that refuses a write) goes on to permit_acquire.lua, nothing written.
if #KEYS == 3 and #ARGV == 3 then
    local n = tonumber(ARGV[3])
    local kind = n > 0 and "redislock:permits" or "redislock:shared"
    local ok = redis.pcall("GET", KEYS[1]) == kind
    local mark = ok and redis.pcall("ZSCORE", KEYS[3], kind)
    ok = type(mark) == "string" and tonumber(mark) == -n and redis.pcall("SISMEMBER", KEYS[2], ARGV[1]) == 0
    if ok and n > 0 then
        local count = redis.pcall("ZCOUNT", KEYS[3], "(0", "(1e14")
        ok = type(count) == "number" and count < n
    end
    for _, i in ipairs(ok and redis.acl_check_cmd and {3, 1} or {}) do -- the writes after the first
        ok = ok and redis.acl_check_cmd("PEXPIRE", KEYS[i], "0") and redis.acl_check_cmd("PTTL", KEYS[i])
    end
    local t = ok and redis.pcall("TIME")
    if ok and type(t) == "table" and t[1]
        and type(redis.pcall("ZADD", KEYS[3], "NX", t[1] * 1000 + math.floor(t[2] / 1000) + ARGV[2], ARGV[1])) == "number" then
        for _, i in ipairs({3, 1}) do -- holders.lua's outlive
            if redis.pcall("PEXPIRE", KEYS[i], ARGV[2], "GT") == 0 and redis.pcall("PTTL", KEYS[i]) == -1 then
                redis.pcall("PEXPIRE", KEYS[i], ARGV[2])
            end
        end
        return "OK"
    end
end
