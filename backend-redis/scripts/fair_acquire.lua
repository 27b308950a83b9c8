-- plain format, fair mode: take the lock only if it is free and no older
-- waiter is queued (grant(), wrong_kind() and recover() are in
-- plain_grant.lua; the queue in fair_queue.lua).
--
-- KEYS[1] lock key, KEYS[2] bookkeeping hash, KEYS[3] queue,
-- KEYS[4] queue deadlines, KEYS[5] queued waiters.
-- ARGV[1..3] as in plain_grant.lua; ARGV[4] waiter id; ARGV[5] '1' to join
-- the queue (or stay in it, with a later deadline) when not granted, '0' to
-- only try; ARGV[6] the entry's lifetime in milliseconds; ARGV[7] the
-- prefix of the waiters' wake channels; ARGV[8] the release channel;
-- ARGV[9] as ARGV[5] of fair_release.lua; ARGV[10] '1' to take over this
-- attempt's own grant (as ARGV[4] of plain_acquire.lua); ARGV[11] how long (ms) a release
-- that hands the lock to this waiter grants it for: a claim window, at most
-- ARGV[2], which the waiter's first renewal extends to ARGV[2]; ARGV[12]
-- the attempt's id (see plain_grant.lua).
--
-- Returns {1, fence} when taken (also when a release had handed it to this
-- waiter already: recover()), {0, pttl, counter} otherwise (pttl -2: the
-- lock is free but an older waiter is first; -1: the holder set no expiry;
-- counter: the fencing counter now, 0 if none, so that the waiter can tell
-- a grant message sent after this answer from an older one).
local queue, deadlines, waiters, id = KEYS[3], KEYS[4], KEYS[5], ARGV[4]
-- With nobody queued (the usual case) there is no clock to read, nothing
-- to prune and no entry to leave (queued(), fair_queue.lua).
local any_queued = queued(deadlines)
local now, pruned, first = nil, 0, nil
if any_queued then
  now = now_ms()
  pruned = prune(queue, deadlines, waiters, now)
  first = head(queue)
end
if first == nil or first == id then
  local r = grant(ARGV[12])
  if r then
    if any_queued and not r.err then
      leave(queue, deadlines, waiters, id)
    end
    return r
  end
end
-- Our token on the lock is ours to take over only when a release handed it
-- to this very waiter (the `granted` mark names it), or when this attempt
-- made it (ARGV[10] '1' and its id ARGV[12]): see plain_acquire.lua.
local handed = redis.call('HGET', KEYS[2], 'granted') == id
local r = wrong_kind()
if not r and (handed or ARGV[10] == '1') then
  r = recover((not handed) and ARGV[12] or nil, ARGV[12])
end
if r then
  if any_queued and not r.err then
    leave(queue, deadlines, waiters, id)
  end
  return r
end
if ARGV[5] == '1' then
  now = now or now_ms()
  if not redis.call('ZSCORE', queue, id) then
    redis.call('ZADD', queue, redis.call('HINCRBY', KEYS[2], 'qseq', 1), id)
  end
  redis.call('ZADD', deadlines, now + tonumber(ARGV[6]), id)
  redis.call('HSET', waiters, id, ARGV[11] .. ':' .. now .. ':' .. ARGV[1] .. ':' .. (ARGV[3] or ''))
end
local pttl = redis.call('PTTL', KEYS[1])
-- A dead head was just dropped while the lock is free: its successor
-- would otherwise wait for its next poll.
if pruned > 0 and pttl == -2 then
  hand_over(KEYS[1], KEYS[2], queue, deadlines, waiters, ARGV[7], ARGV[8], ARGV[9])
  pttl = redis.call('PTTL', KEYS[1])
end
return {0, pttl, tonumber(redis.call('HGET', KEYS[2], 'fence') or '0')}
