-- proclaim.lua: the leader of an election publishes its value.
--
-- KEYS[1]  the election's key, which holds the leader's id
-- KEYS[2]  the leader's value (leader.lua): its id, term, number and the
--          value, each after a newline but the first; it never expires,
--          and is read only with the id of the key
-- ARGV[1]  the leader's id
-- ARGV[2]  its value
-- ARGV[3]  the channel the value is published on, as its term, number
--          and value, each after a newline but the first
-- ARGV[4]  the leader's term (its fencing token)
-- ARGV[5]  the number of this proclaim within the term, from 1: a
--          client's retry sends the same
--
-- Reply: 1 when KEYS[1] holds ARGV[1], and the value is set and
--        published; 2 when so, but Redis refused the PUBLISH (an ACL
--        without the channel); 0 when KEYS[1] does not hold ARGV[1]
--        (nothing written). The status REDISLOCK_KIND when KEYS[2] is not
--        a string; a refusal as call.lua says.
return guarded(function()
    if get(KEYS[1]) ~= ARGV[1] then
        return 0
    elseif get(KEYS[2]) == 0 then
        error(redis.error_reply("REDISLOCK_KIND " .. KEYS[2] .. " not a leader's value"))
    end
    local mark = ARGV[4] .. "\n" .. ARGV[5] .. "\n" .. ARGV[2]
    call("SET", KEYS[2], ARGV[1] .. "\n" .. mark)
    local published = redis.pcall("PUBLISH", ARGV[3], mark)
    if type(published) == "table" and published.err then
        return 2
    end
    return 1
end)
