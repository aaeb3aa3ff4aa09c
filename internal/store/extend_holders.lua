-- extend_holders.lua: verify and refresh the leases of holders of
-- semaphores and shared locks (see holders.lua), one (a re-entry) or many
-- (a watchdog batch on a single Redis primary), as extend.lua does locks'.
--
-- KEYS[2i-1]   a semaphore's or a shared lock's key
-- KEYS[2i]     its holders
-- ARGV[2i-1]   the id of a holder
-- ARGV[2i]     its lease in milliseconds
--
-- Reply: an array with one integer per pair of keys, in order: 1 when
--        ARGV[2i-1] held KEYS[2i-1] and its lease now ends ARGV[2i] ms
--        from the server's clock, both keys living at least as long; 0
--        when it did not (the key missing, of another kind, or the id no
--        holder): that hold is lost, and nothing was changed. A refusal
--        (call.lua) for the whole call, as extend.lua's.
return guarded(function()
    local renewed, ms = {}, nil
    for i = 1, #KEYS / 2 do
        local id, lease = ARGV[2 * i - 1], ARGV[2 * i]
        renewed[i] = 0
        local value = get(KEYS[2 * i - 1])
        if named(value) and zscore(2 * i, id) then
            ms = ms or clock()
            need("ZADD", KEYS[2 * i])
            need("PTTL", KEYS[2 * i])
            need("PTTL", KEYS[2 * i - 1])
            outlive(lease, 2 * i, 2 * i - 1) -- first: then Redis lets the ZADD through whatever its memory
            call("ZADD", KEYS[2 * i], "XX", ms + lease, id)
            renewed[i] = 1
        end
    end
    return renewed
end)
