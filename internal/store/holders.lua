-- holders.lua: the holders of a semaphore or a shared lock, for the scripts
-- it is put in front of (after call.lua): holders() returns the functions
-- below in a table, made only by a script that meets such a key.
--
-- Such a key is a sorted set: each holder's id scored by the end of its
-- lease, in ms of the server's clock, and one mark of the key's kind,
-- scored 0 or below: "redislock:permits" scored -n for a semaphore of n
-- permits; "redislock:shared" for a shared lock, scored minus the time
-- until which an exclusive holder waits for it (0: none does), during
-- which no new share is given. A holder whose lease ended counts until a
-- script drops it; it is dropped when it stands in another's way. A
-- fenced holder's token is the score of the member "#" .. its id (tokens,
-- in µs, lie above every lease's end, in ms, and below 2^53).
local function holders()
    local PERMITS, SHARED = "redislock:permits", "redislock:shared"

    -- clock returns the server's time in ms, and TIME's reply.
    local function clock()
        local t = check(redis.pcall("TIME"), "TIME")
        return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000), t
    end

    -- score returns the score of member in KEYS[i], or nil when KEYS[i] is
    -- missing, has no such member, or is no sorted set.
    local function score(i, member)
        local value = redis.pcall("ZSCORE", KEYS[i], member)
        if type(value) == "table" and not string.find(value.err, "^WRONGTYPE") then
            check(value, "ZSCORE", KEYS[i])
        end
        return type(value) == "string" and tonumber(value) or nil
    end

    -- mark returns the score of KEYS[1]'s mark of kind, or nil.
    local function mark(kind)
        return score(1, kind)
    end

    -- wrongKind raises the error REDISLOCK_KIND, saying what KEYS[1] is.
    local function wrongKind(what)
        error(redis.error_reply("REDISLOCK_KIND " .. KEYS[1] .. " " .. what))
    end

    -- ours returns the score of the mark of KEYS[1] as a semaphore of n
    -- permits (0: a shared lock), nil when KEYS[1] is missing, false when
    -- it holds a string and n is 0 (an exclusive holder's); it raises
    -- REDISLOCK_KIND when KEYS[1] is another kind.
    local function ours(n)
        local have = mark(n > 0 and PERMITS or SHARED)
        local value = not have and get(KEYS[1])
        if not have and n == 0 and type(value) == "string" then
            return false
        elseif not have and value then
            wrongKind(mark(PERMITS) and "is a semaphore" or mark(SHARED) and "is a shared lock"
                or value ~= 0 and "is a lock" or "is not a lock")
        elseif have and n > 0 and have ~= -n then
            wrongKind("has " .. -have .. " permits, not " .. n)
        end
        return have
    end

    -- count returns how many holders KEYS[1] has.
    local function count()
        return call("ZCOUNT", KEYS[1], "(0", "(1e14")
    end

    -- drop removes the holders of KEYS[1] whose lease ended at ms, with their
    -- tokens, and returns how many are left.
    local function drop(ms)
        for _, id in ipairs(call("ZRANGEBYSCORE", KEYS[1], "(0", ms)) do
            call("ZREM", KEYS[1], id, "#" .. id)
        end
        return count()
    end

    -- outlive makes KEYS[i] live lease ms more, at least: PEXPIRE GT, which
    -- passes a key without expiry by, and then PEXPIRE. Redis refuses no
    -- PEXPIRE for memory, and lets the writes after it through.
    local function outlive(i, lease)
        if call("PEXPIRE", KEYS[i], lease, "GT") == 0 and call("PTTL", KEYS[i]) == -1 then
            call("PEXPIRE", KEYS[i], lease)
        end
    end

    -- first returns how long, from ms, until the first lease of a holder of
    -- KEYS[1] to end after ms ends.
    local function first(ms)
        return call("ZRANGEBYSCORE", KEYS[1], "(" .. ms, "+inf", "WITHSCORES", "LIMIT", 0, 1)[2] - ms
    end

    -- join makes id a holder of KEYS[1], of n permits (0: shared), whose
    -- mark has the score have (nil: a new key), until ms + lease, with the
    -- fencing token t (nil: none).
    local function join(id, n, have, ms, lease, t)
        call("ZADD", KEYS[1], "NX", ms + lease, id) -- 0: a retry, which holds already
        if t then
            call("ZADD", KEYS[1], t, "#" .. id)
        end
        if have then
            outlive(1, lease)
        else
            call("ZADD", KEYS[1], -n, n > 0 and PERMITS or SHARED)
            call("PEXPIRE", KEYS[1], lease)
        end
    end

    -- leave takes id, a holder, out of the holders of KEYS[1]. The key is
    -- deleted with the last one (holders whose lease ended, not yet dropped,
    -- count: the key expires after them), unless an exclusive holder waits for
    -- it: it then lasts as long as that wait.
    local function leave(id)
        local waits -- nil: a holder stays
        if count() == 1 then
            local shared = mark(SHARED)
            waits = shared and -shared - clock() or mark(PERMITS) and 0
            need("PEXPIRE", KEYS[1])
            need("DEL", KEYS[1])
        end
        call("ZREM", KEYS[1], id, "#" .. id) -- first: Redis refuses no ZREM for memory
        if waits and waits > 0 then
            call("PEXPIRE", KEYS[1], waits)
        elseif waits then
            call("DEL", KEYS[1])
        end
    end

    -- exclusive is the attempt of an exclusive holder (ARGV[1], lease ARGV[2]
    -- ms) on KEYS[1] of another type than a string. A semaphore raises
    -- REDISLOCK_KIND. A shared lock without holders is deleted and taken: it
    -- returns false. One with holders is held: it returns 0, as get does;
    -- with ARGV[3], the exclusive holder waits, no new share is given for
    -- ARGV[3] ms, and it returns when to attempt again, within ARGV[3] / 3.
    local function exclusive()
        if mark(PERMITS) then
            wrongKind("is a semaphore")
        end
        if not mark(SHARED) then
            return 0 -- no key of ours
        end
        need("ZCOUNT", KEYS[1])
        need("ZREM", KEYS[1])
        need("DEL", KEYS[1])
        need("SET", KEYS[1])
        need("ZADD", KEYS[1])
        need("PTTL", KEYS[1])
        need("SISMEMBER", KEYS[2])
        local ms = clock()
        if drop(ms) == 0 then
            call("DEL", KEYS[1])
            call("SET", KEYS[1], ARGV[1], "PX", ARGV[2])
            return false
        elseif not ARGV[3] then
            return 0
        end
        call("ZADD", KEYS[1], "XX", "LT", -(ms + ARGV[3]), SHARED)
        local pttl = call("PTTL", KEYS[1])
        return (pttl < 1 or pttl > ARGV[3] / 3) and math.max(math.floor(ARGV[3] / 3), 1) or pttl
    end

    return {PERMITS = PERMITS, SHARED = SHARED, clock = clock, score = score, mark = mark,
        wrongKind = wrongKind, ours = ours, count = count, drop = drop, outlive = outlive, first = first, join = join, leave = leave, exclusive = exclusive}
end
