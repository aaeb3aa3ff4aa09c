-- proclaim.lua: the leader of an election publishes its value.
--
-- KEYS[1]  the election's key, which holds the leader's id
-- KEYS[2]  the leader's value (leader.lua); it never expires, and is read
--          only with the id of the key
-- ARGV[1]  the leader's id
-- ARGV[2]  its value
-- ARGV[3]  the channel the value is published on, after the number of
--          this proclaim and a newline
--
-- Reply: 1 when KEYS[1] holds ARGV[1], and the value is set and
--        published; 2 when so, but Redis refused the PUBLISH (an ACL
--        without the channel); 0 when KEYS[1] does not hold ARGV[1]
--        (nothing written). A refusal as call.lua says.
return guarded(function()
    if get(KEYS[1]) ~= ARGV[1] then
        return 0
    end
    local last = get(KEYS[2])
    local number = 1 + tonumber(type(last) == "string" and string.match(last, "^[^\n]*\n(%d+)\n") or "0")
    call("SET", KEYS[2], ARGV[1] .. "\n" .. number .. "\n" .. ARGV[2])
    local published = redis.pcall("PUBLISH", ARGV[3], number .. "\n" .. ARGV[2])
    if type(published) == "table" and published.err then
        return 2
    end
    return 1
end)
