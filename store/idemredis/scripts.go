package idemredis

// The scripts below are constants: every scope, key, fingerprint, token and
// duration reaches them through KEYS and ARGV, never through the source.
//
// KEYS[1] is the record (a hash), KEYS[2] the token floor (a string written
// only when a record is removed on purpose, see doc.go). Both carry the same
// hash tag, so they live in one cluster slot.
//
// Times are milliseconds since the epoch from the server's TIME; tokens are
// formatted with %.0f because Redis would otherwise turn a Lua number into a
// string with 14 significant digits and lose the low digits of a token.
//
// Hash fields: s scope, k key, st state (p|c), fp fingerprint (32 raw bytes),
// tok token, r result, f failed (0|1), ts tombstone (0|1), ca created,
// le lease expiry, co completed, ex record expiry.

// claimScript: ARGV[1] scope, ARGV[2] key, ARGV[3] fingerprint,
// ARGV[4] lease ms, ARGV[5] abandoned retention ms.
//
// It returns {1, token, lease expiry ms, takeover} when the lease was
// acquired, or {outcome, fields in recordFields order} otherwise, where
// outcome is idem.InProgress (2), idem.Completed (3) or idem.Mismatch (4).
const claimScript = `
local function record(code)
  local v = redis.call('HMGET', KEYS[1], 's', 'k', 'st', 'fp', 'tok', 'r', 'f', 'ts', 'ca', 'le', 'co', 'ex')
  table.insert(v, 1, code)
  return v
end
local t = redis.call('TIME')
local nowus = tonumber(t[1]) * 1000000 + tonumber(t[2])
local now = math.floor(nowus / 1000)
local tok = nowus
local takeover = 0
local cur = redis.call('HMGET', KEYS[1], 'st', 'fp', 'tok', 'le')
if cur[1] then
  if cur[2] ~= ARGV[3] then return record(4) end
  if cur[1] == 'c' then return record(3) end
  if tonumber(cur[4]) > now then return record(2) end
  takeover = 1
  local n = tonumber(cur[3]) + 1
  if n > tok then tok = n end
else
  local floor = redis.call('GET', KEYS[2])
  if floor then
    local n = tonumber(floor) + 1
    if n > tok then tok = n end
  end
end
local stok = string.format('%.0f', tok)
local le = string.format('%.0f', now + tonumber(ARGV[4]))
local ex = string.format('%.0f', now + tonumber(ARGV[4]) + tonumber(ARGV[5]))
if takeover == 1 then
  redis.call('HSET', KEYS[1], 'tok', stok, 'le', le, 'ex', ex)
else
  -- r, f and ts are written by Complete; absent means empty and false.
  redis.call('HSET', KEYS[1], 's', ARGV[1], 'k', ARGV[2], 'st', 'p', 'fp', ARGV[3], 'tok', stok,
    'ca', string.format('%.0f', now), 'le', le, 'ex', ex)
end
redis.call('PEXPIREAT', KEYS[1], ex)
return {1, stok, le, takeover}
`

// completeScript: ARGV[1] token, ARGV[2] result, ARGV[3] failed (0|1),
// ARGV[4] tombstone (0|1), ARGV[5] retention ms. Returns 1, or 0 when the
// token is not the current token of a record in progress.
const completeScript = `
local cur = redis.call('HMGET', KEYS[1], 'st', 'tok')
if cur[1] ~= 'p' or cur[2] ~= ARGV[1] then return 0 end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local ex = string.format('%.0f', now + tonumber(ARGV[5]))
redis.call('HSET', KEYS[1], 'st', 'c', 'r', ARGV[2], 'f', ARGV[3], 'ts', ARGV[4],
  'co', string.format('%.0f', now), 'ex', ex)
redis.call('PEXPIREAT', KEYS[1], ex)
return 1
`

// extendScript: ARGV[1] token, ARGV[2] lease ms, ARGV[3] abandoned retention
// ms. Returns the new lease expiry in ms, or 0 when the token is not current.
const extendScript = `
local cur = redis.call('HMGET', KEYS[1], 'st', 'tok')
if cur[1] ~= 'p' or cur[2] ~= ARGV[1] then return 0 end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local le = now + tonumber(ARGV[2])
local ex = string.format('%.0f', le + tonumber(ARGV[3]))
redis.call('HSET', KEYS[1], 'le', string.format('%.0f', le), 'ex', ex)
redis.call('PEXPIREAT', KEYS[1], ex)
return le
`

// releaseScript: ARGV[1] token, ARGV[2] token floor TTL ms. Removes the
// record and remembers its token in the floor key. Returns 1, or 0 when the
// token is not the current token of a record in progress.
const releaseScript = `
local cur = redis.call('HMGET', KEYS[1], 'st', 'tok')
if cur[1] ~= 'p' or cur[2] ~= ARGV[1] then return 0 end
redis.call('DEL', KEYS[1])
redis.call('SET', KEYS[2], cur[2], 'PX', ARGV[2])
return 1
`

// deleteScript: ARGV[1] token floor TTL ms. Removes the record whatever its
// state and remembers its token. Returns 1, or 0 when there is no record.
const deleteScript = `
local tok = redis.call('HGET', KEYS[1], 'tok')
if not tok then return 0 end
redis.call('DEL', KEYS[1])
redis.call('SET', KEYS[2], tok, 'PX', ARGV[1])
return 1
`
