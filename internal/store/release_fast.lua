-- release_fast.lua: put in front of release.lua's script, before call.lua.
--
-- The release of a plain lock by its holder, or of a semaphore's or a
-- shared lock's holder that is not the last (3 KEYS: not a give-up), done
-- before the script makes its functions, which costs Redis as much as
-- the commands: as release.lua does it, replying 1 or 3. Anything else
-- goes on to release.lua, with the reply of GET in read.
local read -- nil: GET not sent here; else {its reply}
if #KEYS == 3 then
    read = {redis.pcall("GET", KEYS[1])}
    local value, left = read[1], 0
    if value == ARGV[1] then
        left = redis.pcall("DEL", KEYS[1]) -- refused: release.lua says so
    elseif (value == "redislock:permits" or value == "redislock:shared")
        and type(redis.pcall("ZSCORE", KEYS[3], ARGV[1])) == "string" then -- a holder
        local count = redis.pcall("ZCOUNT", KEYS[3], "(0", "(1e14")
        if type(count) == "number" and count > 1 then -- not the last: holders.lua's leave
            left = redis.pcall("ZREM", KEYS[3], ARGV[1], "#" .. ARGV[1])
        end
    end
    if type(left) == "number" and left > 0 then
        remember(ARGV[1])
        return type(redis.pcall("PUBLISH", ARGV[2], "")) == "number" and 1 or 3
    end
end
