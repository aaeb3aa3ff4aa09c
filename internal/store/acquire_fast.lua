-- acquire_fast.lua: put in front of acquire.lua's script, before call.lua.
--
-- The first acquisition of a plain lock (no fencing counter, not a wait's,
-- no WAIT to follow: 3 KEYS and 2 ARGV, as acquire.lua names them), done
-- before the script defines its functions, which costs Redis as much as
-- the commands: a free key taken by an attempt not given up replies "OK",
-- a key of another owner its PTTL. Anything else (a retry of this call, a
-- semaphore's or a shared lock's key, an attempt given up, a refusal)
-- goes on to acquire.lua, with the reply of SET NX GET in sent.
local sent -- nil: SET NX GET not sent here; else {its reply}
if #KEYS == 3 and #ARGV == 2 then
    sent = {redis.pcall("SET", KEYS[1], ARGV[1], "NX", "GET", "PX", ARGV[2])}
    local old = sent[1]
    if old == false then
        if redis.pcall("SISMEMBER", KEYS[2], ARGV[1]) == 0 then
            return "OK"
        end
    elseif type(old) == "string" and old ~= ARGV[1] and string.sub(old, 1, 10) ~= "redislock:" then
        local ttl = redis.pcall("PTTL", KEYS[1])
        if type(ttl) == "number" then
            return ttl
        end
    end
end
