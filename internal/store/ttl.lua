-- ttl.lua: the remaining lease, checked against the owner. Read-only.
--
-- KEYS[1]  the lock key, or a semaphore's or a shared lock's (holders.lua)
-- KEYS[2]  its holders, should it be a semaphore's or a shared lock's
-- ARGV[1]  the owner's id
--
-- Reply: the remaining lease in ms (PTTL) when KEYS[1] holds ARGV[1]
--        (-1 when someone removed its expiry); -2 when it does not. A
--        refusal as call.lua says.
return guarded(function()
    local value = get(KEYS[1])
    if value == ARGV[1] then
        return call("PTTL", KEYS[1])
    end
    local h = named(value) and holders(1, 2)
    local left = h and (h.score(ARGV[1]) or 0) - h.clock()
    if left and left > 0 then -- a holder of a semaphore or a shared lock
        return left
    end
    return -2
end)
