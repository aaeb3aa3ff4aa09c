-- extend.lua: verify ownership and refresh the lease of one lock (a
-- re-entry) or of many (a watchdog batch on a single Redis primary, where
-- every key is local).
--
-- KEYS[i]      a lock key, or a semaphore's or a shared lock's, whose
--              holder's lease is renewed (see holders.lua)
-- ARGV[2i-1]   the id of its owner
-- ARGV[2i]     its lease in milliseconds
--
-- Reply: an array with one integer per key, in order: 1 when KEYS[i] held
--        ARGV[2i-1] and its lease is now ARGV[2i] ms; 0 when it did not
--        (missing, another owner, or not a string): that lock is lost, and
--        nothing was changed. A refusal (call.lua) for the whole call:
--        Redis refuses a GET or a PEXPIRE at its first key, before any
--        lease was changed.
return guarded(function()
    local renewed, h, ms = {}, nil, nil
    for i = 1, #KEYS do
        renewed[i] = 0
        local value = get(KEYS[i])
        if value == ARGV[2 * i - 1] then
            renewed[i] = call("PEXPIRE", KEYS[i], ARGV[2 * i])
        elseif value == 0 and (h or holders()).score(i, ARGV[2 * i - 1]) then
            h = h or holders() -- a holder of a semaphore or a shared lock
            ms = ms or h.clock()
            need("ZADD", KEYS[i])
            need("PTTL", KEYS[i])
            h.outlive(i, ARGV[2 * i]) -- first: then Redis lets the ZADD through whatever its memory
            call("ZADD", KEYS[i], "XX", ms + ARGV[2 * i], ARGV[2 * i - 1])
            renewed[i] = 1
        end
    end
    return renewed
end)
