package redislock

import (
	"cmp"
	"context"
	"embed"
	"errors"
	"fmt"
	"reflect"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/redis/go-redis/v9"
	"github.com/zeromicro/go-zero/core/breaker"
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

func (g goRedis) ScriptRunCtx(ctx context.Context, script *redis.Script, keys []string, args ...any) (any, error) {
	return script.Run(ctx, g.c, keys, args...).Result()
}

// Evaler is an optional interface beside Scripter: a store that has it (as
// go-zero's *redis.Redis does) gets our scripts run with EVAL, never EVALSHA.
// go-zero's circuit breaker counts the NOSCRIPT replies that EVALSHA gets
// after a restart, a failover or SCRIPT FLUSH as failures, and once open
// refuses acquisitions and releases alike; EVAL never gets NOSCRIPT, for the
// cost of sending a script of a few hundred bytes with each call.
type Evaler interface {
	EvalCtx(ctx context.Context, script string, keys []string, args ...any) (any, error)
}

// lua holds the scripts, a file each, whose headers name their KEYS, ARGV
// and replies.
//
//go:embed *.lua
var lua embed.FS

var (
	acquireScript     = newScript("fence.lua", "acquire.lua") // fence.lua: a function they share, after call.lua
	extendScript      = newScript("extend.lua")
	releaseScript     = newScript("release.lua")
	ttlScript         = newScript("ttl.lua")
	fairAcquireScript = newScript("fence.lua", "fair_acquire.lua")
	fairReleaseScript = newScript("fence.lua", "fair_release.lua")
	inspectScript     = newScript("inspect.lua")
	breakScript       = newScript("break.lua")

	sources = map[*redis.Script]string{} // the scripts' texts, for EVAL
)

// newScript returns the script made of call.lua and files, one after
// another.
func newScript(files ...string) *redis.Script {
	var src strings.Builder
	for _, f := range append([]string{"call.lua"}, files...) {
		b, _ := lua.ReadFile(f) // embedded: it reads
		src.Write(b)
	}
	s := redis.NewScript(src.String())
	sources[s] = src.String()
	return s
}

// corruptCounterReply starts the error a script replies when a fencing
// counter holds something other than a number (see fence.lua).
const corruptCounterReply = "REDISLOCK_CORRUPT_COUNTER "

// store is what a Locker uses of its client: one script call, and batches
// of calls in pipelines, one per server, where the client has them.
type store struct {
	Scripter
	evaler Evaler                                                   // go-zero's: EVAL, never a NOSCRIPT for its breaker
	pipe   func(context.Context, func(redis.Pipeliner) error) error // nil: no pipelines
	server func(ctx context.Context, key string) string             // nil: one server, or hidden
	single bool                                                     // every key on one primary: a script may touch many locks' keys
	sub    Subscriber                                               // the client's pub/sub; nil for go-zero's store
	// readOnly runs a script that writes nothing with EVALSHA_RO (Redis
	// 7.0+), which a replica and CLIENT PAUSE WRITE let through; nil when
	// the client cannot, or the server said it does not know it.
	readOnly atomic.Pointer[func(context.Context, *redis.Script, []string, ...any) *redis.Cmd]
}

func newStore(s Scripter) *store {
	st := &store{Scripter: s}
	if isNil(s) {
		return st
	}
	st.evaler, _ = s.(Evaler)
	type goRedisPipelines interface {
		Pipelined(context.Context, func(redis.Pipeliner) error) ([]redis.Cmder, error)
	}
	type goZeroPipelines interface {
		PipelinedCtx(context.Context, func(redis.Pipeliner) error) error
	}
	addr := func(c *redis.Client, err error) string {
		if err != nil {
			return ""
		}
		return c.Options().Addr
	}
	switch s := s.(type) {
	case goRedis:
		st.sub, _ = s.c.(Subscriber)
		ro := func(ctx context.Context, script *redis.Script, keys []string, args ...any) *redis.Cmd {
			return script.RunRO(ctx, s.c, keys, args...)
		}
		st.readOnly.Store(&ro)
		if p, ok := s.c.(goRedisPipelines); ok {
			st.pipe = func(ctx context.Context, fn func(redis.Pipeliner) error) error {
				_, err := p.Pipelined(ctx, fn)
				return err
			}
		}
		switch c := s.c.(type) {
		case *redis.Client:
			st.single = true
		case *redis.ClusterClient:
			st.server = func(ctx context.Context, key string) string { return addr(c.MasterForKey(ctx, key)) }
		case *redis.Ring:
			st.server = func(_ context.Context, key string) string { return addr(c.GetShardClientForKey(key)) }
		}
	case goZeroPipelines:
		st.pipe = s.PipelinedCtx
	}
	return st
}

// run runs script on keys. A nil reply (none of our scripts gives one) is
// ErrUnexpectedReply, so redis.Nil never reaches a caller.
func (st *store) run(ctx context.Context, script *redis.Script, keys []string, args ...any) (any, error) {
	var reply any
	var err error
	if st.evaler != nil {
		reply, err = st.evaler.EvalCtx(ctx, sources[script], keys, args...)
	} else {
		reply, err = st.ScriptRunCtx(ctx, script, keys, args...)
	}
	return checkReply(reply, err)
}

// runRead is run for a script that writes nothing: with EVALSHA_RO where
// the client has it.
func (st *store) runRead(ctx context.Context, script *redis.Script, keys []string, args ...any) (any, error) {
	ro := st.readOnly.Load()
	if ro == nil || st.evaler != nil {
		return st.run(ctx, script, keys, args...)
	}
	reply, err := (*ro)(ctx, script, keys, args...).Result()
	var e redis.Error
	if errors.As(err, &e) { // before Redis 7.0, or a server that refuses TIME there (miniredis)
		if msg := strings.ToLower(e.Error()); strings.Contains(msg, "unknown command") || strings.Contains(msg, "read-only script") {
			st.readOnly.Store(nil)
			return st.run(ctx, script, keys, args...)
		}
	}
	return checkReply(reply, err)
}

// checkReply turns what a script call returned into our reply and error:
// a nil reply (none of our scripts gives one) is ErrUnexpectedReply, so
// redis.Nil never reaches a caller, and an error reply of Redis is a
// refusal (ErrRefused).
func checkReply(reply any, err error) (any, error) {
	var e redis.Error
	switch {
	case err != nil && strings.Contains(err.Error(), corruptCounterReply):
		_, counter, _ := strings.Cut(err.Error(), corruptCounterReply)
		return nil, fmt.Errorf("%w: %s", ErrCorruptFencingCounter, counter)
	case errors.Is(err, redis.Nil) || (err == nil && reply == nil):
		return nil, fmt.Errorf("%w: nil", ErrUnexpectedReply)
	case errors.As(err, &e):
		return nil, refused(err)
	}
	return reply, err
}

// A call is one script call of a batch, and once run, its result.
type call struct {
	ctx    context.Context // bounds it when it goes alone (no pipelines)
	script *redis.Script
	keys   []string
	args   []any
	tag    any // the caller's
	reply  any
	err    error
}

// runAll runs calls within ctx, and hands each group of them to done as
// soon as its results are in: in one pipeline per server, all at once, so
// that a slow server holds up its own calls only, with EVALSHA and then
// EVAL for those that got NOSCRIPT (EVAL alone for go-zero); without
// pipelines, one call after another, each within its own ctx too.
func (st *store) runAll(ctx context.Context, calls []*call, done func([]*call)) {
	if st.pipe == nil {
		for _, c := range calls {
			cctx, cancel := context.WithCancel(c.ctx)
			stop := context.AfterFunc(ctx, cancel)
			c.reply, c.err = st.run(cctx, c.script, c.keys, c.args...)
			stop()
			cancel()
			done([]*call{c})
		}
		return
	}
	if st.server != nil && len(calls) > 1 {
		groups := map[string][]*call{}
		for _, c := range calls {
			addr := st.server(ctx, c.keys[0])
			groups[addr] = append(groups[addr], c)
		}
		if len(groups) > 1 {
			var wg sync.WaitGroup
			for _, g := range groups {
				wg.Add(1)
				go func() {
					defer wg.Done()
					st.pipeline(ctx, g)
					done(g)
				}()
			}
			wg.Wait()
			return
		}
	}
	st.pipeline(ctx, calls)
	done(calls)
}

// pipeline sends calls in one pipeline, then again with EVAL those that
// got NOSCRIPT.
func (st *store) pipeline(ctx context.Context, calls []*call) {
	send := func(calls []*call, eval bool) {
		cmds := make([]*redis.Cmd, len(calls))
		err := st.pipe(ctx, func(p redis.Pipeliner) error {
			for i, c := range calls {
				if eval {
					cmds[i] = p.Eval(ctx, sources[c.script], c.keys, c.args...)
				} else {
					cmds[i] = p.EvalSha(ctx, c.script.Hash(), c.keys, c.args...)
				}
			}
			return nil
		})
		for i, c := range calls {
			if cmds[i] == nil { // the pipeline failed before queueing it
				c.reply, c.err = nil, cmp.Or(err, fmt.Errorf("%w: call not sent", ErrUnexpectedReply))
				continue
			}
			c.reply, c.err = checkReply(cmds[i].Result())
		}
	}
	send(calls, st.evaler != nil)
	if st.evaler != nil {
		return
	}
	var again []*call
	for _, c := range calls {
		var e redis.Error
		if errors.As(c.err, &e) && strings.HasPrefix(e.Error(), "NOSCRIPT") {
			again = append(again, c)
		}
	}
	if len(again) > 0 { // after a restart, a failover or SCRIPT FLUSH
		send(again, true)
	}
}

// ambiguous reports whether a failed script call may have run on the server
// all the same: anything but an error reply from Redis (a network error, a
// timeout, a cancelled context) or a call that was never sent.
func ambiguous(err error) bool {
	var reply redis.Error
	switch {
	case errors.As(err, &reply), errors.Is(err, breaker.ErrServiceUnavailable),
		errors.Is(err, ErrCorruptFencingCounter), errors.Is(err, redis.ErrClosed):
		return false // Redis refused it, or it was never sent
	}
	return true
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
