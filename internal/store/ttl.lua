-- ttl.lua: the remaining lease, checked against the owner. Read-only.
--
-- KEYS[1]  the lock key
-- ARGV[1]  the owner's id
--
-- Reply: the remaining lease in ms (PTTL) when KEYS[1] holds ARGV[1]
--        (-1 when someone removed its expiry); -2 when it does not. A
--        refusal as call.lua says.
return guarded(function()
    if get(KEYS[1]) == ARGV[1] then
        return call("PTTL", KEYS[1])
    end
    return -2
end)
