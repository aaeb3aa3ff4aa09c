-- leader.lua: an election's leader and its value. Read-only.
--
-- KEYS[1]  the election's key: the leader's id while a term lasts
-- KEYS[2]  the leader's value (proclaim.lua): its id, term, number and
--          the value, each after a newline but the first
--
-- Reply: {value, pttl, term, number}: the value the leader proclaimed
--        last ("" when nobody leads, or the leader has not proclaimed yet),
--        the term's remaining lease in ms (-2 when nobody leads), and the
--        term and number of that proclaim (0 and 0 with ""). A refusal as
--        call.lua says.
return guarded(function()
    local id = get(KEYS[1])
    local value = get(KEYS[2])
    local by, term, number, proclaimed
    if type(value) == "string" then
        by, term, number, proclaimed = string.match(value, "^([^\n]*)\n(%d+)\n(%d+)\n(.*)$")
    end
    if not id or id == 0 then
        return {"", -2, 0, 0}
    elseif by ~= id then
        return {"", call("PTTL", KEYS[1]), 0, 0}
    end
    return {proclaimed, call("PTTL", KEYS[1]), tonumber(term), tonumber(number)}
end)
