-- plain format, fair mode: how many live waiters are queued
-- (fair_queue.lua). KEYS[1] queue deadlines. Read only.
return redis.call('ZCOUNT', KEYS[1], '(' .. now_ms(), '+inf')
