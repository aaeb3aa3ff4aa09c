-- holders.lua: the holders of a semaphore or a shared lock, for the scripts
-- it is put in front of (after call.lua): holders(k, hk) returns the
-- functions below for the key K = KEYS[k] and its holders H = KEYS[hk], made
-- only by a script that meets such a key.
--
-- Such a key is a string that names its kind, PERMITS for a semaphore,
-- SHARED for a shared lock: a SET NX of it fails and a GET of it reads
-- another owner, so any other lock (go-zero's too) sees it held. Its
-- holders are a sorted set in a related key of the same slot: each
-- holder's id scored by the end of its lease, in ms of the server's clock,
-- and one mark of the key's kind, scored 0 or below: PERMITS scored -n for
-- a semaphore of n permits; SHARED for a shared lock, scored minus the time
-- until which an exclusive holder waits for it (0: none does), during which
-- no new share is given. A fenced holder's token is the score of the member
-- "#" .. its id (tokens, in µs, lie above every lease's end, in ms, and
-- below 2^53). Both keys are made, expire and are deleted together; the key
-- decides: holders without it are nobody's. A holder whose lease ended
-- counts until a script drops it; it is dropped when it stands in
-- another's way.
local PERMITS, SHARED = "redislock:permits", "redislock:shared"

-- named reports whether a key's value names a semaphore or a shared lock.
local function named(value)
    return value == PERMITS or value == SHARED
end

-- zscore returns the score of member in KEYS[i], or nil when KEYS[i] is
-- missing, has no such member, or is no sorted set.
local function zscore(i, member)
    local value = redis.pcall("ZSCORE", KEYS[i], member)
    if type(value) == "table" and not string.find(value.err, "^WRONGTYPE") then
        check(value, "ZSCORE", KEYS[i])
    end
    return type(value) == "string" and tonumber(value) or nil
end

-- outlive makes KEYS[i], for each i given, live lease ms more, at least:
-- PEXPIRE GT, which passes a key without expiry by, and then PEXPIRE.
-- Redis refuses no PEXPIRE for memory, and lets the writes after it through.
local function outlive(lease, ...)
    for _, i in ipairs({...}) do
        if call("PEXPIRE", KEYS[i], lease, "GT") == 0 and call("PTTL", KEYS[i]) == -1 then
            call("PEXPIRE", KEYS[i], lease)
        end
    end
end

-- clock returns the server's time in ms, and TIME's reply.
local function clock()
    local t = check(redis.pcall("TIME"), "TIME")
    return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000), t
end

local function holders(k, hk)

    -- score returns the score of member in H (see zscore).
    local function score(member)
        return zscore(hk, member)
    end

    -- wrongKind raises the error REDISLOCK_KIND, saying what K is.
    local function wrongKind(what)
        error(redis.error_reply("REDISLOCK_KIND " .. KEYS[k] .. " " .. what))
    end

    -- ours returns the score of the mark of K as a semaphore of n permits
    -- (0: a shared lock), nil when K is missing (or its holders are), false
    -- when it holds another string and n is 0 (an exclusive holder's); it
    -- raises REDISLOCK_KIND when K is another kind.
    local function ours(n)
        local want = n > 0 and PERMITS or SHARED
        local value = get(KEYS[k])
        if value == want then
            local have = score(want)
            if n > 0 and have and have ~= -n then
                wrongKind("has " .. -have .. " permits, not " .. n)
            end
            return have
        elseif not value then
            return nil
        elseif n == 0 and type(value) == "string" and value ~= PERMITS then
            return false
        end
        wrongKind(value == PERMITS and "is a semaphore" or value == SHARED and "is a shared lock"
            or value ~= 0 and "is a lock" or "is not a lock")
    end

    -- count returns how many holders K has.
    local function count()
        return call("ZCOUNT", KEYS[hk], "(0", "(1e14")
    end

    -- drop removes the holders of K whose lease ended at ms, with their
    -- tokens, and returns how many are left.
    local function drop(ms)
        for _, id in ipairs(call("ZRANGEBYSCORE", KEYS[hk], "(0", ms)) do
            call("ZREM", KEYS[hk], id, "#" .. id)
        end
        return count()
    end

    -- first returns how long, from ms, until the first lease of a holder of
    -- K to end after ms ends.
    local function first(ms)
        return call("ZRANGEBYSCORE", KEYS[hk], "(" .. ms, "+inf", "WITHSCORES", "LIMIT", 0, 1)[2] - ms
    end

    -- join makes id a holder of K, of n permits (0: shared), whose mark has
    -- the score have (nil: a new key, which replaces what H held), until
    -- ms + lease, with the fencing token t (nil: none).
    local function join(id, n, have, ms, lease, t)
        if not have then -- the SET first: Redis refuses it when memory is full
            call("SET", KEYS[k], n > 0 and PERMITS or SHARED, "PX", lease)
            call("DEL", KEYS[hk])
            call("ZADD", KEYS[hk], -n, n > 0 and PERMITS or SHARED)
        end
        call("ZADD", KEYS[hk], "NX", ms + lease, id) -- 0: a retry, which holds already
        if t then
            call("ZADD", KEYS[hk], t, "#" .. id)
        end
        if have then
            outlive(lease, hk, k)
        else
            call("PEXPIRE", KEYS[hk], lease)
        end
    end

    -- leave takes id, a holder, out of the holders of K. Both keys are
    -- deleted with the last one (holders whose lease ended, not yet dropped,
    -- count: the keys expire after them), unless an exclusive holder waits
    -- for K: they then last as long as that wait.
    local function leave(id)
        local waits -- nil: a holder stays
        if count() == 1 then
            local shared = score(SHARED)
            waits = shared and -shared - clock() or score(PERMITS) and 0
            need("PEXPIRE", KEYS[hk])
            need("PEXPIRE", KEYS[k])
            need("DEL", KEYS[hk])
            need("DEL", KEYS[k])
        end
        call("ZREM", KEYS[hk], id, "#" .. id) -- first: Redis refuses no ZREM for memory
        if waits and waits > 0 then
            call("PEXPIRE", KEYS[hk], waits)
            call("PEXPIRE", KEYS[k], waits)
        elseif waits then
            call("DEL", KEYS[hk])
            call("DEL", KEYS[k])
        end
    end

    -- exclusive is the attempt of an exclusive holder (ARGV[1], lease ARGV[2]
    -- ms) on K, which holds value, PERMITS or SHARED. A semaphore raises
    -- REDISLOCK_KIND. A shared lock without holders is deleted and taken: it
    -- returns false. One with holders is held: it returns 0, as get does;
    -- with ARGV[3], the exclusive holder waits, no new share is given for
    -- ARGV[3] ms, and it returns when to attempt again, within ARGV[3] / 3.
    local function exclusive(value)
        if value == PERMITS then
            wrongKind("is a semaphore")
        end
        need("ZCOUNT", KEYS[hk])
        need("ZREM", KEYS[hk])
        need("DEL", KEYS[hk])
        need("SET", KEYS[k])
        need("ZADD", KEYS[hk])
        need("PTTL", KEYS[k])
        need("SISMEMBER", KEYS[2])
        local ms = clock()
        if drop(ms) == 0 then
            call("DEL", KEYS[hk])
            call("SET", KEYS[k], ARGV[1], "PX", ARGV[2])
            return false
        elseif not ARGV[3] then
            return 0
        end
        call("ZADD", KEYS[hk], "XX", "LT", -(ms + ARGV[3]), SHARED)
        local pttl = call("PTTL", KEYS[k])
        return (pttl < 1 or pttl > ARGV[3] / 3) and math.max(math.floor(ARGV[3] / 3), 1) or pttl
    end

    return {clock = clock, score = score, wrongKind = wrongKind, ours = ours, count = count,
        drop = drop, outlive = function(lease) outlive(lease, hk, k) end, first = first, join = join, leave = leave, exclusive = exclusive}
end
