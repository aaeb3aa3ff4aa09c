// Package store is what the locks use of a Redis client: the Lua scripts
// and their replies, one way to run a script (EVALSHA with the EVAL
// fallback, EVAL alone for go-zero's store, EVALSHA_RO for a script that
// only reads), batches of calls in one pipeline per server, and the errors
// Redis gives. It knows nothing of locks.
package store

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"reflect"
	"slices"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/redis/go-redis/v9"
	"github.com/zeromicro/go-zero/core/breaker"
)

// Scripter runs a Lua script on Redis, as the root package's Scripter.
type Scripter interface {
	ScriptRunCtx(ctx context.Context, script *redis.Script, keys []string, args ...any) (any, error)
}

// Evaler runs a script with EVAL, as the root package's Evaler.
type Evaler interface {
	EvalCtx(ctx context.Context, script string, keys []string, args ...any) (any, error)
}

// Subscriber gives the pub/sub of a client, as the root package's.
type Subscriber interface {
	Subscribe(ctx context.Context, channels ...string) *redis.PubSub
}

// GoRedis adapts a go-redis v9 client to Scripter; nil for a nil client.
func GoRedis(c redis.Scripter) Scripter {
	if IsNil(c) {
		return nil
	}
	return goRedis{c: c}
}

type goRedis struct{ c redis.Scripter }

func (g goRedis) ScriptRunCtx(ctx context.Context, script *redis.Script, keys []string, args ...any) (any, error) {
	return script.Run(ctx, g.c, keys, args...).Result()
}

// Client returns the go-redis client that s adapts, if it adapts one.
func Client(s Scripter) (redis.Scripter, bool) {
	g, ok := s.(goRedis)
	return g.c, ok
}

// Store is a client as the locks use it.
type Store struct {
	Scripter
	evaler Evaler                                                   // go-zero's: EVAL, never a NOSCRIPT for its breaker
	pipe   func(context.Context, func(redis.Pipeliner) error) error // nil: no pipelines
	server func(ctx context.Context, key string) string             // nil: one server, or hidden
	// node returns the pipelines of key's primary, where WAIT can follow a
	// script, and the primary's address; nil when the client has none
	// (WithReplicas is refused).
	node   func(ctx context.Context, key string) (pipeline, string, error)
	reload func(context.Context) // a Cluster's slots, read again after MOVED; nil for others
	few    sync.Map              // replicasOf: whether the primary had too few replicas online (see pipeline)
	// Single is set when every key is on one primary: a script may touch
	// many locks' keys.
	Single bool
	// Sub is the client's pub/sub; nil for go-zero's store.
	Sub Subscriber
	// readOnly runs a script with EVALSHA_RO (Redis 7.0+), which a replica
	// and CLIENT PAUSE WRITE let through; nil when the client cannot, or
	// the server said it does not know it.
	readOnly atomic.Pointer[func(context.Context, *redis.Script, []string, ...any) *redis.Cmd]
}

// A pipeline sends the commands fn queues in one round trip.
type pipeline = func(ctx context.Context, fn func(redis.Pipeliner) error) error

// New returns the Store of s (nothing but s for a nil one).
func New(s Scripter) *Store {
	st := &Store{Scripter: s}
	if IsNil(s) {
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
		st.Sub, _ = s.c.(Subscriber)
		ro := func(ctx context.Context, script *redis.Script, keys []string, args ...any) *redis.Cmd {
			return script.RunRO(ctx, s.c, keys, args...)
		}
		st.readOnly.Store(&ro)
		pipes := func(p goRedisPipelines) pipeline {
			return func(ctx context.Context, fn func(redis.Pipeliner) error) error {
				_, err := p.Pipelined(ctx, fn)
				return err
			}
		}
		if p, ok := s.c.(goRedisPipelines); ok {
			st.pipe = pipes(p)
			st.node = func(context.Context, string) (pipeline, string, error) { return st.pipe, "", nil }
		}
		switch c := s.c.(type) {
		case *redis.Client:
			st.Single = true
		case *redis.AutoPipeliner:
			// Its pipelines and pub/sub go to the client it pipelines for,
			// which go-redis does not export: a Client's pipelines can
			// carry WAIT after a script; a Cluster's cannot (WithReplicas
			// is refused), and send batches to each key's node.
			st.Single = pipelinesFor(c) == reflect.TypeFor[*redis.Client]()
			if !st.Single {
				st.node = nil
			}
		case *redis.ClusterClient:
			st.server = func(ctx context.Context, key string) string { return addr(c.MasterForKey(ctx, key)) }
			st.node = func(ctx context.Context, key string) (pipeline, string, error) {
				n, err := c.MasterForKey(ctx, key)
				if err != nil {
					return nil, "", err
				}
				return pipes(n), n.Options().Addr, nil
			}
			st.reload = func(ctx context.Context) { c.ReloadState(ctx) }
		case *redis.Ring:
			st.server = func(_ context.Context, key string) string { return addr(c.GetShardClientForKey(key)) }
			st.node = func(_ context.Context, key string) (pipeline, string, error) {
				n, err := c.GetShardClientForKey(key)
				if err != nil {
					return nil, "", err
				}
				return pipes(n), n.Options().Addr, nil
			}
		}
	case goZeroPipelines:
		st.pipe = s.PipelinedCtx
		if !goZeroCluster(s) {
			st.node = func(context.Context, string) (pipeline, string, error) { return st.pipe, "", nil }
		}
	}
	return st
}

// pipelinesFor returns the type of the client ap pipelines for; nil when
// this version of go-redis does not say.
func pipelinesFor(ap *redis.AutoPipeliner) reflect.Type {
	f := reflect.ValueOf(ap).Elem().FieldByName("pipeliner")
	if !f.IsValid() || f.Kind() != reflect.Interface || f.IsNil() {
		return nil
	}
	return f.Elem().Type()
}

// IsGoZero reports whether s is go-zero's store.
func IsGoZero(s any) bool {
	v := reflect.Indirect(reflect.ValueOf(s))
	return v.Kind() == reflect.Struct && v.Type().PkgPath() == "github.com/zeromicro/go-zero/core/stores/redis"
}

// goZeroCluster reports a go-zero store of a Redis Cluster, whose
// pipelines go through a go-redis ClusterClient, where WAIT, which names
// no key, cannot follow a script to its key's node.
func goZeroCluster(s any) bool {
	if !IsGoZero(s) {
		return false
	}
	t := reflect.Indirect(reflect.ValueOf(s)).FieldByName("Type")
	return t.Kind() != reflect.String || t.String() != "node"
}

// CanWait reports whether st can follow a script with WAIT on its key's
// primary, in one pipeline.
func (st *Store) CanWait() bool { return st.node != nil }

// SetPipeline makes st send batches through pipe, as if every key were on
// one primary (for benchmarks of the batches).
func (st *Store) SetPipeline(pipe func(context.Context, func(redis.Pipeliner) error) error) {
	st.pipe, st.Single = pipe, true
}

// Pipelined reports whether st sends batches in pipelines.
func (st *Store) Pipelined() bool { return st.pipe != nil }

// Run runs script on keys. Its reply is never nil: a nil reply (none of
// our scripts gives one) is ErrUnexpectedReply, so redis.Nil never reaches
// a caller; an error reply of Redis is a refusal (ErrRefused).
func (st *Store) Run(ctx context.Context, script *Script, keys []string, args ...any) (any, error) {
	key := ""
	if len(keys) > 0 {
		key = keys[0]
	}
	if ro := st.readOnly.Load(); script.readOnly && ro != nil && st.evaler == nil {
		reply, err := (*ro)(ctx, script.Script, keys, args...).Result()
		var e redis.Error
		if !errors.As(err, &e) || !noReadOnly(e) {
			return checkReply(reply, err, "EVALSHA_RO", key)
		}
		st.readOnly.Store(nil)
	}
	if script.replicas.N > 0 {
		c := &Call{Script: script, Keys: keys, Args: args}
		for try := 1; ; try++ { // MOVED: the Cluster's slots changed; sent nowhere else
			st.pipeline(ctx, []*Call{c})
			if try == 3 || !moved(c.Err) || st.reload == nil {
				return c.Reply, c.Err
			}
		}
	}
	if st.evaler != nil {
		reply, err := st.evaler.EvalCtx(ctx, script.src, keys, args...)
		return checkReply(reply, err, "EVAL", key)
	}
	reply, err := st.ScriptRunCtx(ctx, script.Script, keys, args...)
	return checkReply(reply, err, "EVALSHA", key)
}

// moved reports a MOVED reply: the script ran nowhere.
func moved(err error) bool {
	var e redis.Error
	return errors.As(err, &e) && strings.HasPrefix(e.Error(), "MOVED ")
}

// noReadOnly reports an error of a server that will not run our
// read-only scripts: one before Redis 7.0, or one that refuses TIME there
// (miniredis).
func noReadOnly(e redis.Error) bool {
	msg := strings.ToLower(e.Error())
	return strings.Contains(msg, "unknown command") || strings.Contains(msg, "read-only script")
}

// A Call is one script call of a batch, and once run, its result.
type Call struct {
	Ctx    context.Context // bounds it when it goes alone (no pipelines)
	Script *Script
	Keys   []string
	Args   []any
	Tag    any // the caller's
	Reply  any
	Err    error
}

// RunAll runs calls within ctx, and hands each group of them to done as
// soon as its results are in: in one pipeline per server, all at once, so
// that a slow server holds up its own calls only, with EVALSHA and then
// EVAL for those that got NOSCRIPT (EVAL alone for go-zero); without
// pipelines, one call after another, each within its own Ctx too. It
// returns when every group is done.
func (st *Store) RunAll(ctx context.Context, calls []*Call, done func([]*Call)) {
	if st.pipe == nil {
		for _, c := range calls {
			cctx, cancel := context.WithCancel(c.Ctx)
			stop := context.AfterFunc(ctx, cancel)
			c.Reply, c.Err = st.Run(cctx, c.Script, c.Keys, c.Args...)
			stop()
			cancel()
			done([]*Call{c})
		}
		return
	}
	if st.server != nil && len(calls) > 1 {
		groups := map[string][]*Call{}
		for _, c := range calls {
			addr := st.server(ctx, c.Keys[0])
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

// pipeline sends calls, all of one server, in one pipeline, then again
// with EVAL those that got NOSCRIPT (EVAL alone for go-zero).
//
// When WAIT is to follow any of them, it goes last in a pipeline to their
// key's primary, once, for the most replicas and the shortest timeout they
// ask for; a call whose replicas did not acknowledge gets ErrNotReplicated.
// While the primary's last such call found too few replicas online, calls
// go without WAIT, which would wait out its timeout: each then fails at
// once (call.lua checks), or, once enough are back, runs and is sent again
// with WAIT (our scripts, sent again by their owner, find what they did).
func (st *Store) pipeline(ctx context.Context, calls []*Call) {
	eval := st.evaler != nil
	for try := 0; len(calls) > 0; try++ {
		noscript, unwaited := st.send(ctx, calls, eval)
		if try == 2 { // the server keeps flushing its scripts, or losing its replicas
			for _, c := range unwaited {
				c.Err = notReplicated(c.Script.replicas, 0, errors.New("not sent: replicas came and went"))
			}
			return
		}
		calls = unwaited
		if len(noscript) > 0 && !eval { // after a restart, a failover or SCRIPT FLUSH
			eval, calls = true, append(noscript, calls...)
		}
	}
}

// send sends calls in one pipeline and returns those to send again: with
// EVAL, those that got NOSCRIPT; with WAIT, those that ran without it.
func (st *Store) send(ctx context.Context, calls []*Call, eval bool) (noscript, unwaited []*Call) {
	pipe, wait := st.pipe, Replicas{}
	for _, c := range calls {
		if r := c.Script.replicas; r.N > 0 {
			wait.N, wait.Timeout = max(wait.N, r.N), min(cmp.Or(wait.Timeout, r.Timeout), r.Timeout)
		}
	}
	var primary string
	var err error
	if wait.N > 0 {
		if pipe, primary, err = st.node(ctx, calls[0].Keys[0]); err == nil && st.tooFew(primary, wait.N) {
			wait.N = 0
		}
	}
	cmds := make([]*redis.Cmd, len(calls))
	var waited *redis.Cmd
	if err == nil {
		err = pipe(ctx, func(p redis.Pipeliner) error {
			for i, c := range calls {
				args := c.Args
				if c.Script.replicas.N > 0 {
					args = append(slices.Clip(args), c.Script.replicas.arg())
				}
				if eval {
					cmds[i] = p.Eval(ctx, c.Script.src, c.Keys, args...)
				} else {
					cmds[i] = p.EvalSha(ctx, c.Script.Hash(), c.Keys, args...)
				}
			}
			if wait.N > 0 {
				waited = p.Do(ctx, "WAIT", wait.N, wait.Timeout.Milliseconds())
			}
			return nil
		})
	}
	command := "EVALSHA"
	if eval {
		command = "EVAL"
	}
	for i, c := range calls {
		if cmds[i] == nil || err != nil && cmds[i].Err() == nil && cmds[i].Val() == nil {
			// Not queued, or not sent (go-zero's breaker refuses the
			// whole pipeline).
			c.Reply, c.Err = nil, cmp.Or(err, fmt.Errorf("%w: call not sent", ErrUnexpectedReply))
			continue
		}
		reply, cerr := cmds[i].Result()
		c.Reply, c.Err = checkReply(reply, cerr, command, c.Keys[0])
		var e redis.Error
		r := c.Script.replicas
		switch {
		case errors.As(c.Err, &e) && strings.HasPrefix(e.Error(), "NOSCRIPT"):
			noscript = append(noscript, c)
		case r.N == 0:
		case errors.Is(c.Err, errTooFewReplicas):
			st.few.Store(replicasOf{primary, r.N}, true)
		case c.Err != nil:
		case wait.N == 0: // enough replicas are back
			st.few.Store(replicasOf{primary, r.N}, false)
			unwaited = append(unwaited, c)
		default:
			if acked, werr := waited.Int64(); werr != nil || acked < int64(r.N) {
				c.Err = notReplicated(r, acked, werr) // the script ran: its reply stays
			}
		}
	}
	if st.reload != nil && slices.ContainsFunc(calls, func(c *Call) bool { return moved(c.Err) }) {
		st.reload(ctx)
	}
	return noscript, unwaited
}

// tooFew reports whether the last call to primary that WAIT was to follow
// for n replicas found too few online, or none was made yet.
func (st *Store) tooFew(primary string, n int) bool {
	few, ok := st.few.Load(replicasOf{primary, n})
	return !ok || few.(bool)
}

// replicasOf keys Store.few.
type replicasOf struct {
	primary string
	n       int
}

// Ambiguous reports whether a failed script call may have run on the
// server all the same: anything but an error reply from Redis (a network
// error, a timeout, a cancelled context) or a call that was never sent.
func Ambiguous(err error) bool {
	var reply redis.Error
	switch {
	case errors.As(err, &reply), errors.Is(err, breaker.ErrServiceUnavailable),
		errors.Is(err, ErrCorruptFencingCounter), errors.Is(err, ErrWrongKind), errors.Is(err, redis.ErrClosed),
		errors.Is(err, errTooFewReplicas):
		return false // Redis refused it, or it was never sent
	}
	return true
}

// IsNil reports whether v is nil or a nil pointer, map, func or the like
// in an interface, so that a typed nil client is an error, not a panic.
func IsNil(v any) bool {
	if v == nil {
		return true
	}
	switch rv := reflect.ValueOf(v); rv.Kind() {
	case reflect.Pointer, reflect.Map, reflect.Func, reflect.Chan, reflect.Slice, reflect.Interface:
		return rv.IsNil()
	}
	return false
}
