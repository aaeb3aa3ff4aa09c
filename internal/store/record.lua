-- record.lua: put in front of the release scripts, after call.lua.
--
-- The record of a lock's recent releases, by which a client's retried
-- release is told that it ran (release.lua): one string per lock of 64
-- slots, each the length of an id, a released id in the slot its first two
-- bytes pick. It expires 10 s (the clients' retry window) after the latest
-- release. An id written over by a later one in its slot is forgotten.
local function slot(id)
    return (string.byte(id, 1) + 7 * string.byte(id, 2)) % 64 * #id
end

local function released(key, id)
    local at = slot(id)
    local found = redis.pcall("GETRANGE", key, at, at + #id - 1)
    if type(found) == "table" and not string.find(found.err, "^WRONGTYPE") then
        check(found, "GETRANGE", key)
    end
    return found == id
end

-- remember records id as released in key: before the release writes
-- anything else, so that a refusal (an ACL, a value of another type)
-- changes nothing. When memory is full Redis refuses it, and lets the
-- release's DEL through: that release goes unrecorded.
local function remember(key, id)
    local written = redis.pcall("SETRANGE", key, slot(id), id)
    if type(written) == "table" then
        if string.find(written.err, "^OOM") then
            return
        end
        check(written, "SETRANGE", key)
    end
    local expiring = redis.pcall("PEXPIRE", key, 10000)
    if type(expiring) == "table" then
        redis.pcall("DEL", key) -- never a record without an expiry
        check(expiring, "PEXPIRE", key)
    end
end
