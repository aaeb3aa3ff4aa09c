-- extend.lua: verify ownership and refresh the lease of one lock (a
-- re-entry) or of many (a watchdog batch on a single Redis primary, where
-- every key is local). extend_holders.lua does it for the holders of
-- semaphores and shared locks.
--
-- KEYS[i]      a lock key, whose holder's lease is renewed
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
    local renewed = {}
    for i = 1, #KEYS do
        renewed[i] = 0
        if get(KEYS[i]) == ARGV[2 * i - 1] then
            renewed[i] = call("PEXPIRE", KEYS[i], ARGV[2 * i])
        end
    end
    return renewed
end)
