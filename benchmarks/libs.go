package main

import (
	"context"
	"errors"
	"time"

	bsm "github.com/bsm/redislock"
	"github.com/go-redsync/redsync/v4"
	"github.com/go-redsync/redsync/v4/redis/goredis/v9"
	"github.com/redis/go-redis/v9"
	"github.com/redis/rueidis"
	"github.com/redis/rueidis/rueidislock"
	zredis "github.com/zeromicro/go-zero/core/stores/redis"

	"github.com/redislock/redislock"
)

// A lock is one library's lock on one key, behind one interface.
type lock interface {
	try(ctx context.Context) (bool, error) // one attempt
	wait(ctx context.Context) error        // the library's own waiting
	release(ctx context.Context) error
}

// A library makes locks, and holds a lock with renewal (its own watchdog,
// or the loop its documentation recommends) until stop is called; raw
// go-redis pairs hold nothing.
type library struct {
	name  string
	new   func(key string) lock
	hold  func(key string) (stop func(), err error)
	close func()
}

const lease = 3 * time.Second

// libraryNames are the contenders, in the order of the results.
var libraryNames = []string{"redislock", "go-zero", "bsm/redislock", "redsync", "rueidislock"}

// fairName is redislock with WithFairness, which takes part in the hot key.
const fairName = "redislock, fair"

// pipelinedName is redislock through go-redis's AutoPipeliner, and
// rawPipelinedName the raw pair (rawPair) through one.
const (
	pipelinedName    = "redislock, AutoPipeliner"
	rawPipelinedName = "raw go-redis, AutoPipeliner"
)

// pipelinedNames take part in the uncontended and saturated runs only,
// after libraryNames.
var pipelinedNames = []string{pipelinedName, rawPipelinedName}

// newLibrary returns the named library, on the Redis at addr.
func newLibrary(name, addr string) library {
	switch name {
	case "redislock", fairName, pipelinedName:
		return ours(name, addr)
	case rawPipelinedName:
		return rawLibrary(addr, true)
	case "go-zero":
		return goZero(addr)
	case "bsm/redislock":
		return newBSM(addr)
	case "redsync":
		return newRedsync(addr)
	case "rueidislock":
		return newRueidis(addr)
	}
	panic("unknown library " + name)
}

// renewEvery runs renew every lease/3 until stop; it is the loop the
// libraries without a watchdog leave to their users.
func renewEvery(renew func(context.Context) error) (stop func()) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		t := time.NewTicker(lease / 3)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
				_ = renew(ctx)
			}
		}
	}()
	return func() { cancel(); <-done }
}

// --- redislock (this repository)

type oursLock struct{ l *redislock.RedisLock }

func (o oursLock) try(ctx context.Context) (bool, error) { return o.l.AcquireCtx(ctx) }
func (o oursLock) wait(ctx context.Context) error        { return o.l.AcquireWait(ctx) }
func (o oursLock) release(ctx context.Context) error     { _, err := o.l.ReleaseCtx(ctx); return err }

// ours returns redislock as name: "redislock", fairName (WithFairness) or
// pipelinedName (through the client's AutoPipeliner).
func ours(name, addr string) library {
	c := redis.NewClient(&redis.Options{Addr: addr, PoolSize: 64})
	s, opts := redis.Scripter(c), []redislock.Option{redislock.WithExpiry(lease)}
	switch name {
	case fairName:
		opts = append(opts, redislock.WithFairness())
	case pipelinedName:
		s = autoPipeline(c)
	}
	return library{
		name: name,
		new: func(key string) lock {
			return oursLock{redislock.NewRedisLock(redislock.FromGoRedis(s), key, opts...)}
		},
		hold: func(key string) (func(), error) {
			l := redislock.NewRedisLock(redislock.FromGoRedis(s), key, redislock.WithExpiry(lease))
			if ok, err := l.Acquire(); !ok || err != nil {
				return nil, errors.Join(errors.New("not acquired"), err)
			}
			return func() { l.Release() }, nil // the watchdog renews it
		},
		close: func() { c.Close() },
	}
}

// autoPipeline returns c's AutoPipeliner, which c.Close closes.
func autoPipeline(c *redis.Client) *redis.AutoPipeliner {
	ap, err := c.AutoPipeline()
	if err != nil {
		panic(err)
	}
	return ap
}

// --- raw go-redis: the classic scripts (rawLock), the baseline.

// rawLibrary returns raw go-redis pairs on a client of their own, through
// its AutoPipeliner if pipelined (rawPipelinedName).
func rawLibrary(addr string, pipelined bool) library {
	c := redis.NewClient(&redis.Options{Addr: addr, PoolSize: 64})
	for _, script := range []*redis.Script{rawAcquire, rawRelease} {
		script.Load(context.Background(), c)
	}
	name, s := "raw go-redis", redis.Scripter(c)
	if pipelined {
		name, s = rawPipelinedName, autoPipeline(c)
	}
	return library{
		name:  name,
		new:   func(key string) lock { return rawLock{c: s, keys: []string{key}} },
		close: func() { c.Close() },
	}
}

// --- go-zero's RedisLock: no waiting and no renewal of its own; users loop.

type zeroLock struct{ l *zredis.RedisLock }

func (z zeroLock) try(ctx context.Context) (bool, error) { return z.l.AcquireCtx(ctx) }
func (z zeroLock) wait(ctx context.Context) error {
	for {
		if ok, err := z.l.AcquireCtx(ctx); ok || err != nil {
			return err
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(time.Millisecond): // the 1ms retry loop
		}
	}
}
func (z zeroLock) release(ctx context.Context) error { _, err := z.l.ReleaseCtx(ctx); return err }

func goZero(addr string) library {
	store := zredis.MustNewRedis(zredis.RedisConf{Host: addr, Type: zredis.NodeType, DisableIdentity: true})
	mk := func(key string) *zredis.RedisLock {
		l := zredis.NewRedisLock(store, key)
		l.SetExpire(int(lease / time.Second))
		return l
	}
	return library{
		name: "go-zero",
		new:  func(key string) lock { return zeroLock{mk(key)} },
		hold: func(key string) (func(), error) {
			l := mk(key)
			if ok, err := l.Acquire(); !ok || err != nil {
				return nil, errors.Join(errors.New("not acquired"), err)
			}
			// Acquiring again by the same lock refreshes the TTL.
			stop := renewEvery(func(ctx context.Context) error { _, err := l.AcquireCtx(ctx); return err })
			return func() { stop(); l.Release() }, nil
		},
		close: func() {},
	}
}

// --- bsm/redislock: a retry strategy, and Refresh left to the user.

type bsmLock struct {
	c   *bsm.Client
	key string
	l   *bsm.Lock
}

func (b *bsmLock) try(ctx context.Context) (bool, error) {
	l, err := b.c.Obtain(ctx, b.key, lease, nil)
	if errors.Is(err, bsm.ErrNotObtained) {
		return false, nil
	}
	b.l = l
	return err == nil, err
}
func (b *bsmLock) wait(ctx context.Context) error {
	l, err := b.c.Obtain(ctx, b.key, lease, &bsm.Options{RetryStrategy: bsm.ExponentialBackoff(2*time.Millisecond, 100*time.Millisecond)})
	b.l = l
	return err
}
func (b *bsmLock) release(ctx context.Context) error { return b.l.Release(ctx) }

func newBSM(addr string) library {
	c := redis.NewClient(&redis.Options{Addr: addr, PoolSize: 64})
	client := bsm.New(c)
	return library{
		name: "bsm/redislock",
		new:  func(key string) lock { return &bsmLock{c: client, key: key} },
		hold: func(key string) (func(), error) {
			l, err := client.Obtain(context.Background(), key, lease, nil)
			if err != nil {
				return nil, err
			}
			stop := renewEvery(func(ctx context.Context) error { return l.Refresh(ctx, lease, nil) })
			return func() { stop(); l.Release(context.Background()) }, nil
		},
		close: func() { c.Close() },
	}
}

// --- redsync v4: retries 50-250ms apart at random, Extend left to the user.

type redsyncLock struct{ try1, waiting, held *redsync.Mutex }

func (r *redsyncLock) try(ctx context.Context) (bool, error) {
	err := r.try1.TryLockContext(ctx)
	var taken *redsync.ErrTaken
	if errors.As(err, &taken) || errors.Is(err, redsync.ErrFailed) {
		return false, nil
	}
	r.held = r.try1
	return err == nil, err
}
func (r *redsyncLock) wait(ctx context.Context) error {
	r.held = r.waiting
	return r.waiting.LockContext(ctx)
}
func (r *redsyncLock) release(ctx context.Context) error {
	_, err := r.held.UnlockContext(ctx)
	return err
}

func newRedsync(addr string) library {
	c := redis.NewClient(&redis.Options{Addr: addr, PoolSize: 64})
	rs := redsync.New(goredis.NewPool(c))
	return library{
		name: "redsync",
		new: func(key string) lock {
			return &redsyncLock{
				try1:    rs.NewMutex(key, redsync.WithExpiry(lease), redsync.WithTries(1)),
				waiting: rs.NewMutex(key, redsync.WithExpiry(lease), redsync.WithTries(1<<20)), // its default delays
			}
		},
		hold: func(key string) (func(), error) {
			m := rs.NewMutex(key, redsync.WithExpiry(lease), redsync.WithTries(1))
			if err := m.LockContext(context.Background()); err != nil {
				return nil, err
			}
			stop := renewEvery(func(ctx context.Context) error { _, err := m.ExtendContext(ctx); return err })
			return func() { stop(); m.Unlock() }, nil
		},
		close: func() { c.Close() },
	}
}

// --- rueidislock: waits on client-side caching invalidations, extends by itself.

type rueidisLock struct {
	locker rueidislock.Locker
	key    string
	cancel context.CancelFunc
}

func (r *rueidisLock) try(ctx context.Context) (bool, error) {
	_, cancel, err := r.locker.TryWithContext(ctx, r.key)
	if errors.Is(err, rueidislock.ErrNotLocked) {
		return false, nil
	}
	r.cancel = cancel
	return err == nil, err
}
func (r *rueidisLock) wait(ctx context.Context) error {
	_, cancel, err := r.locker.WithContext(ctx, r.key)
	r.cancel = cancel
	return err
}
func (r *rueidisLock) release(context.Context) error { r.cancel(); return nil }

func newRueidis(addr string) library {
	locker, err := rueidislock.NewLocker(rueidislock.LockerOption{
		ClientOption:   rueidis.ClientOption{InitAddress: []string{addr}, DisableCache: false},
		KeyMajority:    1, // one key, as the others
		KeyValidity:    lease,
		ExtendInterval: lease / 3,
		NoLoopTracking: true,
	})
	if err != nil {
		panic(err)
	}
	return library{
		name: "rueidislock",
		new:  func(key string) lock { return &rueidisLock{locker: locker, key: key} },
		hold: func(key string) (func(), error) {
			_, cancel, err := locker.TryWithContext(context.Background(), key)
			if err != nil {
				return nil, err
			}
			return cancel, nil // it extends the key itself until cancel
		},
		close: locker.Close,
	}
}
