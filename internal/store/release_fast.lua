-- release_fast.lua: put in front of release.lua's script, before call.lua.
--
-- The release of a plain lock by its holder (3 KEYS: not a give-up),
-- done before the script defines its functions, which costs Redis as
-- much as the commands: as release.lua does it, replying 1 or 3. Anything
-- else goes on to release.lua, with the reply of GET in read.
local read -- nil: GET not sent here; else {its reply}
if #KEYS == 3 then
    read = {redis.pcall("GET", KEYS[1])}
    if read[1] == ARGV[1] and redis.pcall("DEL", KEYS[1]) == 1 then
        local at = (string.byte(ARGV[1], 1) + 7 * string.byte(ARGV[1], 2)) % 64 * #ARGV[1]
        if type(redis.pcall("SETRANGE", KEYS[2], at, ARGV[1])) == "number"
            and type(redis.pcall("PEXPIRE", KEYS[2], 10000)) ~= "number" then
            redis.pcall("DEL", KEYS[2])
        end
        return type(redis.pcall("PUBLISH", ARGV[2], "")) == "number" and 1 or 3
    end
end
