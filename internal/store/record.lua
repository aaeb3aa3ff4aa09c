-- record.lua: put in front of the release scripts, before their fast path
-- and call.lua, whose functions it does not use. The record is their
-- KEYS[2].
--
-- The record of a lock's recent releases, by which a client's retried
-- release is told that it ran (release.lua): one string per lock of 64
-- slots, each the length of an id, a released id in the slot its first two
-- bytes pick. It expires 10 s (the clients' retry window) after the latest
-- release. An id written over by a later one in its slot is forgotten.
local function slot(id)
    return (string.byte(id, 1) + 7 * string.byte(id, 2)) % 64 * #id
end

-- released reports whether id is in the record; a refusal of its GET is
-- raised as call.lua's check does (a value of another type is no record).
local function released(id)
    local ids, at = redis.pcall("GET", KEYS[2]), slot(id)
    if type(ids) == "table" and not string.find(ids.err, "^WRONGTYPE") then
        error(redis.error_reply(ids.err .. " [redislock: GET " .. KEYS[2] .. "]"))
    end
    return type(ids) == "string" and string.sub(ids, at + 1, at + #id) == id
end

-- remember records id as released, after the release's DEL (Redis then
-- lets it through whatever its memory). Refused (an ACL without SETRANGE
-- or PEXPIRE, a value of another type in KEYS[2]), the release goes
-- unrecorded. The record never stays without an expiry.
local function remember(id)
    if type(redis.pcall("SETRANGE", KEYS[2], slot(id), id)) == "number"
        and type(redis.pcall("PEXPIRE", KEYS[2], 10000)) ~= "number" then
        redis.pcall("DEL", KEYS[2])
    end
end
