-- call.lua: put in front of every script. A script's body runs inside
-- guarded, and sends its commands through call (get for GET, check for a
-- redis.pcall whose errors it reads itself).
--
-- A command Redis refuses (memory full under noeviction, a read-only
-- replica, a failed save, an ACL denial, a value of another type where the
-- script expects none) ends the script with an error reply: the server's
-- text, whose first word (OOM, READONLY, MISCONF, ERR...) clients act on,
-- followed by " [redislock: <COMMAND> <key>]", by which the client names
-- what was refused. Redis refuses a script's writes for the state of the
-- server only until one of them has got through; an ACL can refuse any
-- command, so a script reads first, asks (need) for the writes that follow
-- its first, and then writes, or undoes what it wrote before it ends.
local function check(reply, command, key)
    if type(reply) == "table" and reply.err then
        error(redis.error_reply(reply.err .. " [redislock: " .. command .. (key and " " .. key or "") .. "]"))
    end
    return reply
end

local function call(command, key, ...)
    return check(redis.pcall(command, key, ...), command, key)
end

-- get returns the value of key, false when it is missing, and 0 when it
-- holds another type than a string.
local function get(key)
    local value = redis.pcall("GET", key)
    if type(value) == "table" and value.err and string.find(value.err, "^WRONGTYPE") then
        return 0
    end
    return check(value, "GET", key)
end

-- need raises the refusal of an ACL that denies the user command with
-- args: a script asks before it writes, for each command it may send
-- after its first write. Redis before 7.0 cannot tell, and is not asked.
local function need(command, key, ...)
    if redis.acl_check_cmd and not redis.acl_check_cmd(command, key, ...) then
        check({err = "NOPERM this user has no permissions to run the '" .. string.lower(command) .. "' command"},
            command, key)
    end
end

-- guarded runs body and returns its reply, or the error reply of what it
-- raised (Redis 7 hands pcall an error's text, not its table). The
-- mistakes of a caller that a script finds, REDISLOCK_KIND and
-- REDISLOCK_CORRUPT_COUNTER, are replied as a status of that text, not an
-- error: the server did what was asked, and a client's circuit breaker
-- (go-zero's counts every error reply) must not count them against it.
--
-- A call that the client follows with WAIT (Replicas in scripts.go) ends
-- its ARGV with "redislock:replicas=<n>", which guarded takes off. With
-- fewer than n replicas online it writes nothing and replies the error
-- REDISLOCK_REPLICAS <online> <n>. Else, when body took the key (its
-- reply is "OK" or {"OK", token}), guarded sets KEYS[1]'s expiry to what
-- it is (PEXPIREAT), a write that always goes to the replicas: the WAIT
-- that follows then covers what body found written before it (a retried
-- call's first run, a fair release's handoff) even when body itself
-- changed nothing.
local function guarded(body)
    local asked = string.match(ARGV[#ARGV] or "", "^redislock:replicas=(%d+)$") -- as given: no float in the error
    local replicas = tonumber(asked)
    if asked then
        ARGV[#ARGV] = nil
    end
    local ok, reply = pcall(function()
        if replicas then
            local _, online = string.gsub(check(redis.pcall("INFO", "replication"), "INFO"), "state=online", "")
            if online < replicas then
                return redis.error_reply("REDISLOCK_REPLICAS " .. online .. " " .. asked)
            end
            if redis.acl_check_cmd and not redis.acl_check_cmd("WAIT", "0", "0") then
                check({err = "NOPERM this user has no permissions to run the 'wait' command"}, "WAIT")
            end
            need("PEXPIRETIME", KEYS[1])
            need("PEXPIREAT", KEYS[1], "0")
        end
        local reply = body()
        if replicas and (reply == "OK" or type(reply) == "table" and reply[1] == "OK") then
            local at = redis.pcall("PEXPIRETIME", KEYS[1])
            if type(at) == "number" and at > 0 then
                call("PEXPIREAT", KEYS[1], at)
            end
        end
        return reply
    end)
    local text = not ok and (type(reply) == "table" and reply.err or reply)
    for _, mistake in ipairs({"REDISLOCK_KIND ", "REDISLOCK_CORRUPT_COUNTER "}) do
        local at = type(text) == "string" and string.find(text, mistake, 1, true)
        if at then
            return {ok = string.sub(text, at)} -- a status: no breaker counts it a failure
        end
    end
    if ok or type(reply) == "table" then
        return reply
    end
    return redis.error_reply(reply)
end
