package idemredis

// The scripts below are constants: every scope, key, fingerprint, token and
// duration reaches them through KEYS and ARGV, never through the source.
//
// Each key is one record: one Redis string in the layout below, so a fresh
// claim is a single SET NX GET PXAT. The claim and completion scripts take
// several keys at once (see batch.go), each handled on its own; every other
// script, and every call on a cluster client, touches a single key (one
// cluster slot by construction). Offsets are 1-based, as in Lua:
//
//	1        format version '1'
//	2        state: p in progress, c completed, x removed (a token stub)
//	3        failed (0|1)
//	4        tombstone (0|1)
//	5..24    fencing token, 20 decimal digits
//	25..40   created, ms since the epoch, 16 digits
//	41..56   lease expiry, ms
//	57..72   completed, ms (0 while in progress)
//	73..88   record expiry, ms (the key's PXAT)
//	89..120  fingerprint, 32 raw bytes
//	121..124 len(scope), 4 digits
//	125..127 len(key), 3 digits
//	128..    scope, key, then the result of a completed record
//
// Bytes 89.. up to the end of the key are the "identity", which Go builds
// once per call (see identity in store.go) and the scripts copy without looking
// inside. A removed record (Release, Delete) is the 24-byte stub
// '1x00' + token, kept for tokenFloorTTL so the next claim's token is
// greater; Get and Claim treat it as absent.
//
// Times are milliseconds since the epoch from the server's TIME; numbers are
// formatted with %d (Redis's Lua formats it as a 64-bit C long, so a token's
// low digits survive; tostring and concatenation would keep 14 significant
// digits only). %d is an integer conversion, several times cheaper on the
// server than the %.0f floating-point one earlier versions used.
//
// A value that is not a string, or a string that does not start with the
// format byte, is a record of another format: the scripts never overwrite
// it (a WRONGTYPE error, or the reply 0/-1 below) and Go reports
// ErrRecordFormat.

// recordHeaderLen is the length of a record up to the scope (offsets
// 1..127 above); stubLen the length of a removed-record stub.
const (
	recordHeaderLen = 127
	stubLen         = 24
	formatVersion   = '1'
)

// claimScript claims one or more keys with the same lease in one call:
// KEYS[i] is the record of item i, ARGV[1] the abandoned retention in ms,
// ARGV[2] the lease in ms and ARGV[i+2] the identity of item i. Store.Claim
// sends the claims that arrive while earlier calls are in flight as one call
// (see batch.go); in cluster mode every call has one key. Each item is
// claimed atomically and in order, so the same key twice in one call
// behaves as two calls.
//
// token and now (ms, the token's whole milliseconds) come from the server's
// TIME, read once. When every item was a fresh claim, as it almost always
// is, it returns just token: every lease was acquired with that token and
// expires at now + lease. Otherwise it returns {token, now, item 1, item 2,
// ...}, where an item is 1 for such a fresh claim; {1, token, lease expiry
// ms, takeover} when the lease was acquired over an existing value (a stub,
// or an expired lease); {outcome, record} otherwise, where outcome is
// idem.InProgress (2), idem.Completed (3) or idem.Mismatch (4); {0} when the
// key holds a record of another format, or a record of another scope and
// key (corrupt: record keys are SHA-256 digests); or an error reply (out of
// memory, a value of another Redis type) that concerns that item alone. The
// single integer saves the server building and sending a table per call.
//
// The usual claim is of a fresh key, so each item first tries SET NX GET,
// which writes a fresh record and reports an existing one in a single
// command; the header of a fresh record is formatted once per call. Only an
// existing value (a record or a stub) takes the slow path, which rewrites it
// with SET. When Redis is out of memory, SET NX GET is refused even for a
// key that exists; the item is then read with GET, so a completed record is
// still replayed, and any write it would need fails with the OOM error:
// nothing is claimed.
const claimScript = `
local t = redis.call('TIME')
local tok = t[1] * 1000000 + t[2]
local now = (tok - tok % 1000) / 1000
local le = now + ARGV[2]
local ex = le + ARGV[1]
local pxat = string.format('%d', ex)
-- slow has no upvalues, so defining it costs one small allocation.
local function slow(k, cur, id, tok, now, le, ex, pxat)
  if type(cur) == 'table' then
    cur = redis.pcall('GET', k)
    if type(cur) == 'table' then return cur end
  end
  local n, takeover, ca = tok, 0, now
  if cur then
    if #cur < 24 or string.byte(cur, 1) ~= 49 then return {0} end
    local p = tonumber(string.sub(cur, 5, 24))
    if not p then return {0} end
    if p >= n then n = p + 1 end
    local st = string.sub(cur, 2, 2)
    if st ~= 'x' then
      if #cur < 127 or (st ~= 'p' and st ~= 'c') then return {0} end
      if string.sub(cur, 121, 88 + #id) ~= string.sub(id, 33) then return {0} end
      if string.sub(cur, 89, 120) ~= string.sub(id, 1, 32) then return {4, cur} end
      if st == 'c' then return {3, cur} end
      local lease = tonumber(string.sub(cur, 41, 56))
      ca = tonumber(string.sub(cur, 25, 40))
      if not lease or not ca then return {0} end
      if lease > now then return {2, cur} end
      takeover = 1
    end
  end
  local r = redis.pcall('SET', k, string.format('1p00%020d%016d%016d0000000000000000%016d', n, ca, le, ex) .. id,
    'PXAT', pxat)
  if type(r) == 'table' and r.err then return r end
  return {1, n, le, takeover}
end
local head = string.format('1p00%020d%016d%016d0000000000000000%016d', tok, now, le, ex)
local out
for i = 1, #KEYS do
  local id = ARGV[i + 2]
  local cur = redis.pcall('SET', KEYS[i], head .. id, 'NX', 'GET', 'PXAT', pxat)
  if cur then
    if not out then
      out = {tok, now}
      for j = 1, i - 1 do out[j + 2] = 1 end
    end
    out[i + 2] = slow(KEYS[i], cur, id, tok, now, le, ex, pxat)
  elseif out then
    out[i + 2] = 1
  end
end
return out or tok
`

// completeScript completes one or more records in one call: KEYS[i] is
// the record of item i, and ARGV[4i-3], ARGV[4i-2], ARGV[4i-1] and ARGV[4i]
// are its token (20 digits), result, failed and tombstone flags (two bytes
// of 0|1) and retention in ms. Store.Complete sends the completions that
// arrive while earlier calls are in flight as one call (see batch.go); in
// cluster mode every call has one key. It returns 1 when every record was
// completed, as it almost always is; otherwise one item per key: 1, 0 when
// the token is not the current token of a record in progress, -1 when the
// key holds a record of another format, or an error reply (out of memory, a
// value of another Redis type) that concerns that item alone.
//
// The record's bytes 5..56 (token, created, lease expiry) and 89.. (the
// identity) are copied as they are; the completed time is formatted once
// per call and each expiry once (the record's 16-digit field is that text
// padded with zeros). 112 is 'p', 49 the format byte '1'.
const completeScript = `
local t = redis.call('TIME')
local now = t[1] * 1000 + (t[2] - t[2] % 1000) / 1000
local nowtxt, zeros = string.format('%016d', now), '0000000000000000'
local rpcall, sub, byte = redis.pcall, string.sub, string.byte
local out
for i = 1, #KEYS do
  local k, a = KEYS[i], 4 * i
  local cur = rpcall('GET', k)
  local r
  if type(cur) == 'table' then
    r = cur
  elseif not cur then
    r = 0
  elseif #cur < 24 or byte(cur, 1) ~= 49 then
    r = -1
  elseif byte(cur, 2) ~= 112 or sub(cur, 5, 24) ~= ARGV[a - 3] then
    r = 0
  elseif #cur < 127 then
    r = -1
  else
    local ex = string.format('%d', now + ARGV[a])
    r = rpcall('SET', k, '1c' .. ARGV[a - 1] .. sub(cur, 5, 56) .. nowtxt .. sub(zeros .. ex, -16) ..
      sub(cur, 89) .. ARGV[a - 2], 'PXAT', ex)
    if not r.err then r = 1 end
  end
  if r ~= 1 and not out then
    out = {}
    for j = 1, i - 1 do out[j] = 1 end
  end
  if out then out[i] = r end
end
return out or 1
`

// extendScript: ARGV[1] token (20 digits), ARGV[2] lease ms, ARGV[3]
// abandoned retention ms. Returns the new lease expiry in ms, 0 when the
// token is not current, or -1 for a record of another format.
const extendScript = `
local cur = redis.call('GET', KEYS[1])
if not cur then return 0 end
if #cur < 24 or string.byte(cur, 1) ~= 49 then return -1 end
if string.sub(cur, 2, 2) ~= 'p' or string.sub(cur, 5, 24) ~= ARGV[1] then return 0 end
if #cur < 127 then return -1 end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local le = now + tonumber(ARGV[2])
local ex = le + tonumber(ARGV[3])
redis.call('SET', KEYS[1], string.sub(cur, 1, 40) .. string.format('%016d', le) .. string.sub(cur, 57, 72) ..
  string.format('%016d', ex) .. string.sub(cur, 89), 'PXAT', string.format('%d', ex))
return le
`

// releaseScript: ARGV[1] token (20 digits), ARGV[2] stub TTL ms. Replaces
// the record by the stub of its token. Returns 1, 0 when the token is not
// the current token of a record in progress, or -1 for a record of another
// format.
//
// DEL comes first: under maxmemory Redis refuses a script's first write if
// it may grow memory (SET) but not once the script has written, so Release
// still works on a full server, as it only frees memory.
const releaseScript = `
local cur = redis.call('GET', KEYS[1])
if not cur then return 0 end
if #cur < 24 or string.byte(cur, 1) ~= 49 then return -1 end
if string.sub(cur, 2, 2) ~= 'p' or string.sub(cur, 5, 24) ~= ARGV[1] then return 0 end
redis.call('DEL', KEYS[1])
redis.call('SET', KEYS[1], '1x00' .. ARGV[1], 'PX', ARGV[2])
return 1
`

// deleteScript: ARGV[1] stub TTL ms. Replaces the record, whatever its
// state, by the stub of its token. Returns 1, 0 when there is no record (or
// only a stub), or 2 when the key held a value of another format, which is
// deleted without a stub: Delete is the operator's way out of a bad record.
const deleteScript = `
local cur = redis.pcall('GET', KEYS[1])
if not cur then return 0 end
if type(cur) ~= 'string' or #cur < 24 or string.byte(cur, 1) ~= 49 then
  redis.call('DEL', KEYS[1])
  return 2
end
if string.sub(cur, 2, 2) == 'x' then return 0 end
redis.call('DEL', KEYS[1])
redis.call('SET', KEYS[1], '1x00' .. string.sub(cur, 5, 24), 'PX', ARGV[1])
return 1
`
