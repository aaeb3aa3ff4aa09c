package redislock

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/zeromicro/go-zero/core/logx"
)

// parseAcquire reads the reply of acquire.lua: the fencing token (0 when
// not fenced) of a taken lock, or -1 and the holder's PTTL.
func (rl *RedisLock) parseAcquire(reply any) (token int64, pttl time.Duration, err error) {
	fenced := rl.fenced()
	switch v := reply.(type) {
	case int64:
		if v < -1 {
			return 0, 0, fmt.Errorf("%w: PTTL %d", ErrUnexpectedReply, v)
		}
		return -1, time.Duration(v) * time.Millisecond, nil
	case string:
		if v == "OK" && !fenced {
			return 0, 0, nil
		}
	case []any:
		if len(v) == 2 && v[0] == "OK" && fenced {
			if t, ok := v[1].(int64); ok && t > 0 {
				return t, 0, nil
			}
		}
	}
	return 0, 0, fmt.Errorf("%w: %T %.64v", ErrUnexpectedReply, reply, reply)
}

// extend verifies that id owns the key and refreshes its lease. It reports
// false, nil when the key does not hold id: a definite loss.
func (rl *RedisLock) extend(ctx context.Context, id string, lease time.Duration) (bool, error) {
	c := &call{script: extendScript, keys: rl.acquireKeys[:1], args: []any{id, lease.Milliseconds()}}
	c.reply, c.err = rl.store.run(ctx, c.script, c.keys, c.args...)
	codes, err := renewalCodes(c, 1)
	if err != nil {
		return false, err
	}
	return codes[0] == 1, nil
}

// release deletes the key if id owns it, and reports true when it did, or
// when a release of id had already done so (this call is a client's retry
// of one whose reply was lost). It reports false, nil when the key is gone
// or taken and no release of id ran: a loss. The release is remembered for
// 10 s, the clients' retry window. With abandon > 0, id is an attempt given up: it is remembered
// for that long, and a late run of it will not take the lock.
func (rl *RedisLock) release(ctx context.Context, id string, abandon time.Duration) (bool, error) {
	script := releaseScript
	if rl.fair() { // hands the lock to the next live waiter
		script = fairReleaseScript
	}
	var n int64
	var err error
	if abandon > 0 {
		keys := append(rl.releaseKeys[:len(rl.releaseKeys):len(rl.releaseKeys)], rl.acquireKeys[1])
		n, err = rl.store.runInt(ctx, script, keys, id, rl.channel, abandon.Milliseconds())
	} else {
		n, err = rl.store.runInt(ctx, script, rl.releaseKeys, id, rl.channel)
	}
	switch {
	case err != nil:
		return false, err
	case n < 0 || n > 2:
		return false, fmt.Errorf("%w: %d where 0, 1 or 2 was due", ErrUnexpectedReply, n)
	}
	return n != 0, nil
}

// opErr is err from operation op on key: "redislock: op "key": err",
// with the "redislock: " of a sentinel error said once.
func opErr(op, key string, err error) error {
	return &opError{op: op, key: key, err: err}
}

type opError struct {
	op, key string
	err     error
}

func (e *opError) Error() string {
	return fmt.Sprintf("redislock: %s %q: %s", e.op, e.key, strings.TrimPrefix(e.err.Error(), "redislock: "))
}

func (e *opError) Unwrap() error { return e.err }

// abandonedFor is how long an attempt given up is remembered, so that a late
// run of it cannot take the lock: a lease, and at least this long.
const abandonedFor = time.Minute

// letGo deletes the key if id owns it: the id of a hold that is over, or
// with abandon > 0 of an attempt given up, which is then remembered for
// that long so that a late run of it takes nothing. The first try is made
// at once when now is set, else in the background; a try that gets no
// answer (the server stalled, the network failed) is made again in the
// background, with backoff, until one is answered or id's lease would be
// over; when the Locker closes meanwhile, within Close's two seconds, and
// Close reports a failure. Each try is bounded by selfReleaseTimeout,
// whatever ctx does.
func (rl *RedisLock) letGo(ctx context.Context, id string, lease, abandon time.Duration, now bool) {
	ctx = context.WithoutCancel(ctx)
	var err error
	if now {
		if err = rl.tryLetGo(ctx, id, abandon); err == nil {
			return
		}
	}
	end := time.Now().Add(lease)
	rl.locker.spawn(func() {
		closing := rl.locker.closed
		for n := 1; ; n++ {
			if wait := retryBackoff(lease/3, n); err != nil {
				if time.Now().Add(wait).After(end) {
					break
				}
				select {
				case <-time.After(wait):
				case <-closing: // Close: the last tries, within its time
					closing = nil
					if budget := time.Now().Add(selfReleaseTimeout); budget.Before(end) {
						end = budget
					}
				}
			}
			if err = rl.tryLetGo(ctx, id, abandon); err == nil {
				return
			}
		}
		err = opErr("release", rl.key, err)
		logx.Errorf("redislock: %s; it expires with its lease", bare(err))
		if closing == nil {
			rl.locker.failed(err)
		}
	})
}

// tryLetGo makes one try of letGo, and returns its error if it went
// unanswered.
func (rl *RedisLock) tryLetGo(ctx context.Context, id string, abandon time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, selfReleaseTimeout)
	defer cancel()
	_, err := rl.release(ctx, id, abandon)
	if err != nil && !ambiguous(err) {
		logx.Errorf("redislock: releasing %q (owner %s) failed, it expires with its lease: %s", rl.key, id, bare(err))
		return nil
	}
	return err
}
