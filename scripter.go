package redislock

import (
	"context"
	_ "embed"
	"errors"
	"fmt"
	"reflect"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/zeromicro/go-zero/core/breaker"
	"github.com/zeromicro/go-zero/core/logx"
)

// Scripter runs a Lua script on Redis. It is the only thing a RedisLock needs
// from a Redis client.
//
// go-zero's *redis.Redis satisfies it as it is; FromGoRedis adapts any go-redis
// v9 client. Implementations must return the script's reply as go-redis does
// (int64 for integers, string for status and bulk strings) and run the script
// with EVALSHA, falling back to EVAL when the server does not know it, as
// redis.Script.Run does.
type Scripter interface {
	ScriptRunCtx(ctx context.Context, script *redis.Script, keys []string, args ...any) (any, error)
}

// FromGoRedis adapts a go-redis v9 client (Client, ClusterClient, Ring, a
// failover client, or any UniversalClient) to Scripter. It returns nil for a
// nil client, which NewRedisLock reports as ErrNilStore.
func FromGoRedis(c redis.Scripter) Scripter {
	if isNil(c) {
		return nil
	}
	return goRedis{c: c}
}

type goRedis struct{ c redis.Scripter }

// Evaler is an optional interface beside Scripter: a store that has it (as
// go-zero's *redis.Redis does) gets our scripts run with EVAL, never EVALSHA.
// go-zero's circuit breaker counts the NOSCRIPT replies that EVALSHA gets
// after a restart, a failover or SCRIPT FLUSH as failures, and once open
// refuses acquisitions and releases alike; EVAL never gets NOSCRIPT, for the
// cost of sending a script of a few hundred bytes with each call.
type Evaler interface {
	EvalCtx(ctx context.Context, script string, keys []string, args ...any) (any, error)
}

func (g goRedis) ScriptRunCtx(ctx context.Context, script *redis.Script, keys []string, args ...any) (any, error) {
	return script.Run(ctx, g.c, keys, args...).Result()
}

var (
	//go:embed acquire.lua
	acquireSource string
	//go:embed extend.lua
	extendSource string
	//go:embed release.lua
	releaseSource string
	//go:embed ttl.lua
	ttlSource string
	//go:embed extend_many.lua
	extendManySource string

	acquireScript = redis.NewScript(acquireSource)
	extendScript  = redis.NewScript(extendSource)
	releaseScript = redis.NewScript(releaseSource)
	ttlScript     = redis.NewScript(ttlSource)
	extendMany    = redis.NewScript(extendManySource)

	sources = map[*redis.Script]string{
		acquireScript: acquireSource,
		extendScript:  extendSource,
		releaseScript: releaseSource,
		ttlScript:     ttlSource,
	}
)

// run runs script on keys and keeps redis.Nil from callers: none of our
// scripts replies nil, so a nil reply is garbage.
func (rl *RedisLock) run(ctx context.Context, script *redis.Script, keys []string, args ...any) (any, error) {
	var reply any
	var err error
	if rl.evaler != nil {
		reply, err = rl.evaler.EvalCtx(ctx, sources[script], keys, args...)
	} else {
		reply, err = rl.store.ScriptRunCtx(ctx, script, keys, args...)
	}
	switch {
	case err != nil && strings.Contains(err.Error(), corruptCounterReply):
		return nil, fmt.Errorf("%w: %s", ErrCorruptFencingCounter, rl.acquireKeys[len(rl.acquireKeys)-1])
	case errors.Is(err, redis.Nil) || (err == nil && reply == nil):
		return nil, fmt.Errorf("%w: nil", ErrUnexpectedReply)
	}
	return reply, err
}

// corruptCounterReply is the error acquire.lua replies when the fencing
// counter holds something other than a number.
const corruptCounterReply = "REDISLOCK_CORRUPT_COUNTER"

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

// runInt runs a script whose reply is an integer.
func (rl *RedisLock) runInt(ctx context.Context, script *redis.Script, keys []string, args ...any) (int64, error) {
	reply, err := rl.run(ctx, script, keys, args...)
	if err != nil {
		return 0, err
	}
	n, ok := reply.(int64)
	if !ok {
		return 0, fmt.Errorf("%w: %T %.64v", ErrUnexpectedReply, reply, reply)
	}
	return n, nil
}

// extend verifies that id owns the key and refreshes its lease. It reports
// false, nil when the key does not hold id: a definite loss.
func (rl *RedisLock) extend(ctx context.Context, id string, lease time.Duration) (bool, error) {
	n, err := rl.runInt(ctx, extendScript, rl.acquireKeys[:1], id, lease.Milliseconds())
	switch {
	case err != nil:
		return false, err
	case n != 0 && n != 1:
		return false, fmt.Errorf("%w: %d where 0 or 1 was due", ErrUnexpectedReply, n)
	}
	return n == 1, nil
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
		n, err = rl.runInt(ctx, script, keys, id, rl.channel, abandon.Milliseconds())
	} else {
		n, err = rl.runInt(ctx, script, rl.releaseKeys, id, rl.channel)
	}
	switch {
	case err != nil:
		return false, err
	case n < 0 || n > 2:
		return false, fmt.Errorf("%w: %d where 0, 1 or 2 was due", ErrUnexpectedReply, n)
	}
	return n != 0, nil
}

// ambiguous reports whether a failed script call may have run on the server
// all the same: anything but an error reply from Redis (a network error, a
// timeout, a cancelled context) or a reply that is not ours.
func ambiguous(err error) bool {
	var reply redis.Error
	switch {
	case errors.As(err, &reply), errors.Is(err, breaker.ErrServiceUnavailable),
		errors.Is(err, ErrCorruptFencingCounter), errors.Is(err, redis.ErrClosed):
		return false // Redis refused it, or it was never sent
	}
	return true
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

// isNil reports whether v is nil or a nil pointer, map, func or the like in an
// interface, so that a typed nil client is an error rather than a panic.
func isNil(v any) bool {
	if v == nil {
		return true
	}
	switch rv := reflect.ValueOf(v); rv.Kind() {
	case reflect.Pointer, reflect.Map, reflect.Func, reflect.Chan, reflect.Slice, reflect.Interface:
		return rv.IsNil()
	}
	return false
}

// abandonedFor is how long an attempt given up is remembered, so that a late
// run of it cannot take the lock: a lease, and at least this long.
const abandonedFor = time.Minute

// letGo deletes the key if id owns it: the id of a hold that is over, or
// with abandon > 0 of an attempt given up, which is then remembered for
// that long so that a late run of it takes nothing. The first try is made
// at once when now is set, else in the background; a try that gets no
// answer (the server stalled, the network failed) is made again in the
// background, with backoff, until one is answered or id's lease would be
// over. Each try is bounded by selfReleaseTimeout, whatever ctx does.
func (rl *RedisLock) letGo(ctx context.Context, id string, lease, abandon time.Duration, now bool) {
	ctx = context.WithoutCancel(ctx)
	if now && !rl.tryLetGo(ctx, id, abandon) {
		return
	}
	end := time.Now().Add(lease)
	rl.locker.spawn(func() {
		var wait time.Duration
		for n := 1; ; n++ {
			if now || n > 1 {
				wait = retryBackoff(lease/3, n)
				if time.Now().Add(wait).After(end) {
					logx.Errorf("redislock: releasing %q (owner %s) failed until its lease would be over: it expires with it", rl.key, id)
					return
				}
				select {
				case <-time.After(wait):
				case <-rl.locker.closed:
					return
				}
			}
			if !rl.tryLetGo(ctx, id, abandon) {
				return
			}
		}
	})
}

// tryLetGo makes one try of letGo, and reports whether it went unanswered.
func (rl *RedisLock) tryLetGo(ctx context.Context, id string, abandon time.Duration) (again bool) {
	ctx, cancel := context.WithTimeout(ctx, selfReleaseTimeout)
	defer cancel()
	_, err := rl.release(ctx, id, abandon)
	if err != nil && !ambiguous(err) {
		logx.Errorf("redislock: releasing %q (owner %s) failed, it expires with its lease: %s", rl.key, id, bare(err))
	}
	return err != nil && ambiguous(err)
}
