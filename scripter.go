package redislock

import (
	"context"
	_ "embed"
	"errors"
	"fmt"
	"reflect"
	"time"

	"github.com/redis/go-redis/v9"
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

	acquireScript = redis.NewScript(acquireSource)
	extendScript  = redis.NewScript(extendSource)
	releaseScript = redis.NewScript(releaseSource)
	ttlScript     = redis.NewScript(ttlSource)

	sources = map[*redis.Script]string{
		acquireScript: acquireSource,
		extendScript:  extendSource,
		releaseScript: releaseSource,
		ttlScript:     ttlSource,
	}
)

// run runs script on the lock's key and keeps redis.Nil from callers: none of
// our scripts replies nil, so a nil reply is garbage.
func (rl *RedisLock) run(ctx context.Context, script *redis.Script, args ...any) (any, error) {
	var reply any
	var err error
	if rl.evaler != nil {
		reply, err = rl.evaler.EvalCtx(ctx, sources[script], rl.keys, args...)
	} else {
		reply, err = rl.store.ScriptRunCtx(ctx, script, rl.keys, args...)
	}
	if errors.Is(err, redis.Nil) || (err == nil && reply == nil) {
		return nil, fmt.Errorf("%w: nil", ErrUnexpectedReply)
	}
	return reply, err
}

// parseAcquire reads the reply of acquire.lua: the fencing token (0 when
// not fenced) of a taken lock, or -1 and the holder's PTTL.
func (rl *RedisLock) parseAcquire(reply any) (token int64, pttl time.Duration, err error) {
	fenced := len(rl.keys) > 1
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
func (rl *RedisLock) runInt(ctx context.Context, script *redis.Script, args ...any) (int64, error) {
	reply, err := rl.run(ctx, script, args...)
	if err != nil {
		return 0, err
	}
	n, ok := reply.(int64)
	if !ok {
		return 0, fmt.Errorf("%w: %T %.64v", ErrUnexpectedReply, reply, reply)
	}
	return n, nil
}

// runBool runs a script that replies 1 when it did its work on a key that
// holds our id, and 0 when the key does not hold it.
func (rl *RedisLock) runBool(ctx context.Context, script *redis.Script, args ...any) (bool, error) {
	n, err := rl.runInt(ctx, script, args...)
	if err != nil {
		return false, err
	}
	if n != 0 && n != 1 {
		return false, fmt.Errorf("%w: %d where 0 or 1 was due", ErrUnexpectedReply, n)
	}
	return n == 1, nil
}

// extend verifies that id owns the key and refreshes its lease. It reports
// false, nil when the key does not hold id: a definite loss.
func (rl *RedisLock) extend(ctx context.Context, id string, leaseMs int64) (bool, error) {
	return rl.runBool(ctx, extendScript, id, leaseMs)
}

// release deletes the key if id owns it and reports whether it did.
func (rl *RedisLock) release(ctx context.Context, id string) (bool, error) {
	return rl.runBool(ctx, releaseScript, id, rl.channel)
}

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
