-- leader.lua: an election's leader and its value. Read-only.
--
-- KEYS[1]  the election's key: the leader's id while a term lasts
-- KEYS[2]  the leader's value: its id, a newline, and the value
--
-- Reply: {value, pttl}: the value the leader proclaimed ("" when nobody
--        leads, or the leader has not proclaimed yet) and the term's
--        remaining lease in ms (-2 when nobody leads). A refusal as
--        call.lua says.
return guarded(function()
    local id = get(KEYS[1])
    if not id or id == 0 then
        return {"", -2}
    end
    local pttl = call("PTTL", KEYS[1])
    local value = get(KEYS[2])
    if type(value) == "string" and string.sub(value, 1, #id + 1) == id .. "\n" then
        return {string.sub(value, #id + 2), pttl}
    end
    return {"", pttl}
end)
