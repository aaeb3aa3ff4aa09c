-- extend_many.lua: renew the leases of many locks in one call (a batch of
-- the watchdog on a single Redis primary, where every key is local).
--
-- KEYS[i]      a lock key
-- ARGV[2i-1]   the id of its owner that renews it
-- ARGV[2i]     its lease in milliseconds
--
-- Reply: an array with one integer per key, in order: 1 when KEYS[i] held
--        ARGV[2i-1] and its lease is now ARGV[2i] ms; 0 when it did not
--        (missing, another owner, or not a string) and nothing was changed.
local renewed = {}
for i = 1, #KEYS do
    if redis.pcall("GET", KEYS[i]) == ARGV[2 * i - 1] then
        redis.call("PEXPIRE", KEYS[i], ARGV[2 * i])
        renewed[i] = 1
    else
        renewed[i] = 0
    end
end
return renewed
