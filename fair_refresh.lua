-- fair_refresh.lua: keep a waiter of a fair lock live in its queue (the
-- watchdog sends it every window/3 while the waiter waits), and tell it
-- whether it was handed the lock.
--
-- KEYS[1]  the lock key
-- KEYS[2]  its queue of waiters (see fair_acquire.lua)
-- KEYS[3]  its waiters' hash (see fair_acquire.lua)
-- ARGV[1]  the waiter's owner id
-- ARGV[2]  the liveness window in milliseconds
-- ARGV[3]  the waiter's score in the queue
-- ARGV[4]  the lease it wants, in milliseconds, followed by "f" when it is
--          fenced (see fair_acquire.lua)
--
-- Reply: 2 when KEYS[1] holds ARGV[1]: the lock was handed to it (nothing
--        is changed; its next attempt takes it over). 1 when it is in the
--        queue with score ARGV[3]: it is live for ARGV[2] ms more. 0 when
--        neither: it lapsed and was dropped, or the queue was lost.
if redis.pcall("GET", KEYS[1]) == ARGV[1] then
    return 2
end
local seq = redis.call("ZSCORE", KEYS[2], ARGV[1])
if not seq or tonumber(seq) ~= tonumber(ARGV[3]) then
    return 0
end
local time = redis.call("TIME")
local window = tonumber(ARGV[2])
local live = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000) + window
redis.call("HSET", KEYS[3], ARGV[1], string.format("%.0f", live) .. " " .. ARGV[4])
redis.call("PEXPIRE", KEYS[2], 2 * window, "GT")
redis.call("PEXPIRE", KEYS[3], 2 * window, "GT")
return 1
