-- leader.lua: an election's leader and its value. Read-only.
--
-- KEYS[1]  the election's key: the leader's id while a term lasts
-- KEYS[2]  the leader's value (proclaim.lua): its id, the number of the
--          proclaim, and the value, each after a newline but the first
--
-- Reply: {value, pttl, number}: the value the leader proclaimed ("" when
--        nobody leads, or the leader has not proclaimed yet), the term's
--        remaining lease in ms (-2 when nobody leads), and the number of
--        the latest proclaim of the key (0: none). A refusal as call.lua
--        says.
return guarded(function()
    local id = get(KEYS[1])
    local value = get(KEYS[2])
    local by, number, proclaimed
    if type(value) == "string" then
        by, number, proclaimed = string.match(value, "^([^\n]*)\n(%d+)\n(.*)$")
    end
    number = tonumber(number or "0")
    if not id or id == 0 then
        return {"", -2, number}
    end
    if by ~= id then
        proclaimed = ""
    end
    return {proclaimed, call("PTTL", KEYS[1]), number}
end)
