package redislock

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/redislock/redislock/internal/redisserver"
)

// roundTrips counts the script calls a client sends and the round trips
// they take: a lone call is one, a pipeline is one.
type roundTrips struct {
	calls, trips atomic.Int64
	hold         chan struct{} // when non-nil, the first lone call waits for it
	held         chan struct{} // closed when that call waits
	once         atomic.Bool
}

func (r *roundTrips) DialHook(next redis.DialHook) redis.DialHook { return next }
func (r *roundTrips) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if n := cmd.Name(); n == "evalsha" || n == "eval" {
			r.calls.Add(1)
			r.trips.Add(1)
			if r.hold != nil && r.once.CompareAndSwap(false, true) {
				close(r.held)
				<-r.hold
			}
		}
		return next(ctx, cmd)
	}
}
func (r *roundTrips) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		if len(cmds) > 0 && (cmds[0].Name() == "evalsha" || cmds[0].Name() == "eval") && !isRenewal(cmds) {
			r.calls.Add(int64(len(cmds)))
			r.trips.Add(1)
		}
		return next(ctx, cmds)
	}
}

// loadScripts loads our scripts, so that no NOSCRIPT and EVAL adds to the
// calls counted.
func loadScripts(t *testing.T, c *redis.Client) {
	t.Helper()
	for _, s := range []*redis.Script{acquireScript, releaseScript, extendScript, ttlScript, extendMany} {
		if err := s.Load(context.Background(), c).Err(); err != nil {
			t.Fatal(err)
		}
	}
}

// Acquisitions and releases from many goroutines at once share round trips,
// and each still does exactly what it would alone: every acquisition of a
// free key succeeds, every release deletes its key, and a key held by one
// lock is refused to the others.
func TestGroupCommitSharesRoundTrips(t *testing.T) {
	srv := redisserver.Start(t)
	c := srv.Client(t)
	loadScripts(t, c)
	rt := &roundTrips{}
	c.AddHook(rt)
	l := NewLocker(FromGoRedis(c), WithPrefix("gc:"))
	const goroutines, pairs = 48, 30
	var wg sync.WaitGroup
	var fails atomic.Int64
	for g := range goroutines {
		wg.Add(1)
		go func() {
			defer wg.Done()
			mine := l.NewLock(fmt.Sprint(g))
			rival := l.NewLock(fmt.Sprint(g)) // the same key, another owner
			for range pairs {
				if ok, err := mine.Acquire(); !ok || err != nil {
					t.Errorf("acquire %d: %v, %v", g, ok, err)
					fails.Add(1)
					return
				}
				if ok, err := rival.Acquire(); ok || err != nil {
					t.Errorf("a rival got %d: %v, %v", g, ok, err)
					fails.Add(1)
					return
				}
				if ok, err := mine.Release(); !ok || err != nil {
					t.Errorf("release %d: %v, %v", g, ok, err)
					fails.Add(1)
					return
				}
			}
		}()
	}
	wg.Wait()
	if fails.Load() > 0 {
		t.FailNow()
	}
	if n := c.DBSize(context.Background()).Val(); n != int64(goroutines) { // a last-release marker per key
		keys := c.Keys(context.Background(), "*").Val()
		t.Fatalf("%d keys left, want the %d release markers: %v", n, goroutines, keys)
	}
	calls, trips := rt.calls.Load(), rt.trips.Load()
	if want := int64(goroutines * pairs * 3); calls != want {
		t.Fatalf("%d script calls, want %d", calls, want)
	}
	if trips >= calls {
		t.Fatalf("%d script calls took %d round trips: none shared", calls, trips)
	}
	t.Logf("%d script calls in %d round trips (%.1f a round trip)", calls, trips, float64(calls)/float64(trips))
}

// A call queued behind one in the network, whose context ends before it is
// sent, is never sent: the acquisition fails with the context's error, and
// nothing of it reaches Redis (no key, no abandoned id to remember).
func TestGroupCommitQueuedCallGivenUpIsNotSent(t *testing.T) {
	s := stallOneCall(t)
	c, rt, l, first := s.c, s.rt, s.l, s.stalled
	second := l.NewLock("second")
	ctx, cancel := context.WithTimeout(context.Background(), stallAfter/5) // given up before it would be sent on its own
	ok, err := second.AcquireCtx(ctx)
	cancel()
	if ok || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("queued acquisition = %v, %v; want false, DeadlineExceeded", ok, err)
	}
	s.unstall(t)
	ctx = context.Background()
	if n := c.Exists(ctx, second.Key(), relatedName(second.Key(), "abandoned")).Val(); n != 0 {
		t.Fatalf("the given-up call reached Redis: %d keys of it", n)
	}
	if calls := rt.calls.Load(); calls != 1 {
		t.Fatalf("%d script calls, want the first acquisition's only", calls)
	}
	mustAcquire(t, second) // and the lock is free
	mustRelease(t, second)
	mustRelease(t, first)
}

// Found by the fifth black-box review: one stalled call made every other
// call of its Locker wait behind it, and fail at its deadline. Calls wait
// behind a stalled call for stallAfter at most, and then go in a pipeline
// of their own.
func TestGroupCommitStalledCallHoldsUpNoOther(t *testing.T) {
	s := stallOneCall(t)
	l, stalled := s.l, s.stalled
	var wg sync.WaitGroup
	for i := range 10 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ctx, cancel := context.WithTimeout(context.Background(), 30*stallAfter)
			defer cancel()
			rl := l.NewLock(fmt.Sprint("free:", i))
			if ok, err := rl.AcquireCtx(ctx); !ok || err != nil {
				t.Errorf("a free key behind a stalled call: %v, %v", ok, err)
				return
			}
			if ok, err := rl.ReleaseCtx(ctx); !ok || err != nil {
				t.Errorf("release behind a stalled call: %v, %v", ok, err)
			}
		}()
	}
	wg.Wait()
	s.unstall(t)
	mustRelease(t, stalled)
}

// stalledCall is a Locker on a real redis-server whose first script call,
// an acquisition of stalled, is stuck in the network until unstall.
type stalledCall struct {
	c       *redis.Client
	rt      *roundTrips
	l       *Locker
	stalled *RedisLock
	got     chan error
}

func stallOneCall(t *testing.T) *stalledCall {
	t.Helper()
	srv := redisserver.Start(t)
	s := &stalledCall{c: srv.Client(t), rt: &roundTrips{hold: make(chan struct{}), held: make(chan struct{})}, got: make(chan error, 1)}
	loadScripts(t, s.c)
	s.c.AddHook(s.rt)
	s.l = NewLocker(FromGoRedis(s.c))
	s.stalled = s.l.NewLock("stalled")
	go func() {
		ok, err := s.stalled.Acquire()
		if !ok && err == nil {
			err = errors.New("busy")
		}
		s.got <- err
	}()
	<-s.rt.held
	return s
}

// unstall lets the stalled call through; it must have acquired its lock.
func (s *stalledCall) unstall(t *testing.T) {
	t.Helper()
	close(s.rt.hold)
	if err := <-s.got; err != nil {
		t.Fatal(err)
	}
}
