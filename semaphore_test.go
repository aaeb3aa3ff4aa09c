package redislock

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/anishathalye/porcupine"
	"github.com/redis/go-redis/v9"
	zredis "github.com/zeromicro/go-zero/core/stores/redis"

	"github.com/redislock/redislock/internal/redisserver"
)

// onServers runs f against miniredis and a real redis-server, each with a
// client of its own for the locks and one for the test's own reads.
func onServers(t *testing.T, f func(t *testing.T, c, admin *redis.Client)) {
	t.Run("miniredis", func(t *testing.T) {
		_, c := newMini(t)
		f(t, c, c)
	})
	t.Run("redis-server", func(t *testing.T) {
		srv := redisserver.Start(t)
		f(t, srv.Client(t), srv.Client(t))
	})
}

// keyDump is every key's DUMP and TTL, for "nothing changed".
func keyDump(t *testing.T, admin *redis.Client) string {
	ctx := context.Background()
	keys := admin.Keys(ctx, "*").Val()
	slices.Sort(keys)
	s := ""
	for _, k := range keys {
		s += fmt.Sprintf("%s=%q ttl>0:%v;", k, admin.Dump(ctx, k).Val(), admin.PTTL(ctx, k).Val() > 0)
	}
	return s
}

func TestSemaphoreAdmitsNHolders(t *testing.T) {
	onServers(t, func(t *testing.T, c, admin *redis.Client) {
		ctx := context.Background()
		sem := func() *RedisLock { return NewRedisLock(FromGoRedis(c), "pool", WithPermits(3)) }
		a, b, d, e := sem(), sem(), sem(), sem()
		for _, rl := range []*RedisLock{a, b, d} {
			mustAcquire(t, rl)
		}
		if ok, err := e.Acquire(); ok || err != nil {
			t.Fatalf("a fourth holder of 3 permits: %v, %v", ok, err)
		}
		mustAcquire(t, a) // a re-entry takes no permit
		if a.Holds() != 2 {
			t.Fatalf("Holds = %d after a re-entry", a.Holds())
		}
		st, err := e.Inspect(ctx)
		if err != nil || st.Permits != 3 || st.Holders != 3 || !st.Held || st.Shared {
			t.Fatalf("Inspect = %+v, %v", st, err)
		}
		holders, err := e.Holders(ctx)
		if err != nil || len(holders) != 3 {
			t.Fatalf("Holders = %v, %v", holders, err)
		}
		for _, rl := range []*RedisLock{a, b, d} {
			i := slices.IndexFunc(holders, func(h Holder) bool { return h.Owner == rl.Owner() })
			if i < 0 || holders[i].TTL <= 0 || holders[i].TTL > DefaultExpiry {
				t.Fatalf("holder %s not listed with its lease: %v", rl.Owner(), holders)
			}
		}
		if left, err := b.TTL(ctx); err != nil || left <= 0 || left > DefaultExpiry {
			t.Fatalf("TTL of a holder = %v, %v", left, err)
		}
		mustRelease(t, b)
		mustAcquire(t, e) // b's permit
		mustRelease(t, a)
		if ok, err := b.Acquire(); ok || err != nil { // a holds on: its re-entry was one of two
			t.Fatalf("a fourth holder after a re-entry's release: %v, %v", ok, err)
		}
		for _, rl := range []*RedisLock{a, d, e} {
			mustRelease(t, rl)
		}
		if n := admin.Exists(ctx, "pool").Val(); n != 0 {
			t.Fatal("the semaphore's key outlives its last holder")
		}
	})
}

func TestSemaphoreMistakesChangeNothing(t *testing.T) {
	onServers(t, func(t *testing.T, c, admin *redis.Client) {
		ctx := context.Background()
		s := FromGoRedis(c)
		for _, tc := range []struct {
			opts []Option
			want error
		}{
			{[]Option{WithPermits(0)}, ErrInvalidPermits},
			{[]Option{WithPermits(-3)}, ErrInvalidPermits},
			{[]Option{WithPermits(2), WithShared()}, ErrInvalidPermits},
			{[]Option{WithPermits(2), WithShared(), WithFairness()}, ErrInvalidPermits},
		} {
			rl := NewRedisLock(s, "bad", tc.opts...)
			if ok, err := rl.Acquire(); ok || !errors.Is(err, tc.want) {
				t.Errorf("%d options: %v, %v; want %v", len(tc.opts), ok, err, tc.want)
			}
			if err := rl.AcquireWait(ctx); !errors.Is(err, tc.want) {
				t.Errorf("AcquireWait: %v; want %v", err, tc.want)
			}
		}
		if n := admin.DBSize(ctx).Val(); n != 0 {
			t.Fatalf("bad options wrote %d keys", n)
		}

		two, lock, shared := NewRedisLock(s, "k", WithPermits(2)), NewRedisLock(s, "k"), NewRedisLock(s, "k", WithShared())
		mustAcquire(t, two)
		before := keyDump(t, admin)
		for name, rl := range map[string]*RedisLock{
			"3 permits": NewRedisLock(s, "k", WithPermits(3)), "a lock": lock, "a shared lock": shared,
		} {
			if ok, err := rl.Acquire(); ok || !errors.Is(err, ErrWrongKind) {
				t.Errorf("%s on a semaphore of 2: %v, %v; want ErrWrongKind", name, ok, err)
			}
		}
		if after := keyDump(t, admin); after != before {
			t.Fatalf("a mistake changed Redis:\n%s\n%s", before, after)
		}
		mustRelease(t, two)

		mustAcquire(t, lock)
		before = keyDump(t, admin)
		if ok, err := two.Acquire(); ok || !errors.Is(err, ErrWrongKind) {
			t.Errorf("a semaphore on a lock's key: %v, %v; want ErrWrongKind", ok, err)
		}
		if after := keyDump(t, admin); after != before {
			t.Fatalf("a mistake changed Redis:\n%s\n%s", before, after)
		}
		mustRelease(t, lock)

		mustAcquire(t, shared)
		before = keyDump(t, admin)
		if ok, err := two.Acquire(); ok || !errors.Is(err, ErrWrongKind) {
			t.Errorf("a semaphore on a shared lock's key: %v, %v; want ErrWrongKind", ok, err)
		}
		if after := keyDump(t, admin); after != before {
			t.Fatalf("a mistake changed Redis:\n%s\n%s", before, after)
		}
		mustRelease(t, shared)

		must(t, admin.HSet(ctx, "k", "field", "outsider's").Err())
		before = keyDump(t, admin)
		for _, rl := range []*RedisLock{two, shared} {
			if ok, err := rl.Acquire(); ok || !errors.Is(err, ErrWrongKind) {
				t.Errorf("on an outsider's hash: %v, %v; want ErrWrongKind", ok, err)
			}
		}
		if _, err := two.Inspect(ctx); !errors.Is(err, ErrWrongType) {
			t.Errorf("Inspect of an outsider's hash: %v", err)
		}
		if after := keyDump(t, admin); after != before {
			t.Fatalf("a mistake changed Redis:\n%s\n%s", before, after)
		}
	})
}

func TestSharedExcludesExclusiveHolders(t *testing.T) {
	onServers(t, func(t *testing.T, c, admin *redis.Client) {
		ctx := context.Background()
		s := FromGoRedis(c)
		r1, r2 := NewRedisLock(s, "doc", WithShared()), NewRedisLock(s, "doc", WithShared())
		w := NewRedisLock(s, "doc")
		mustAcquire(t, r1)
		mustAcquire(t, r2)
		if ok, err := w.Acquire(); ok || err != nil {
			t.Fatalf("exclusive under shares: %v, %v", ok, err)
		}
		if ok, err := admin.SetNX(ctx, "doc", "raw", time.Minute).Result(); ok || err != nil {
			t.Fatalf("SET NX under shares: %v, %v", ok, err)
		}
		st, err := w.Inspect(ctx)
		if err != nil || !st.Shared || st.Holders != 2 || st.Permits != 0 {
			t.Fatalf("Inspect = %+v, %v", st, err)
		}
		mustRelease(t, r1)
		if ok, _ := w.Acquire(); ok {
			t.Fatal("exclusive while one share is held")
		}
		mustRelease(t, r2)
		mustAcquire(t, w)
		if ok, err := r1.Acquire(); ok || err != nil {
			t.Fatalf("a share under an exclusive holder: %v, %v", ok, err)
		}
		mustRelease(t, w)
		must(t, admin.Set(ctx, "doc", "raw", time.Minute).Err())
		if ok, err := r1.Acquire(); ok || err != nil {
			t.Fatalf("a share under a raw SET: %v, %v", ok, err)
		}
	})
}

func TestSharedAndGoZero(t *testing.T) {
	srv := redisserver.Start(t)
	z := goZeroStore(t, srv.Addr)
	theirs := NewRedisLock(z, "cfg") // go-zero's store, exclusive
	ours := NewRedisLock(FromGoRedis(srv.Client(t)), "cfg", WithShared())
	mustAcquire(t, ours)
	if ok, err := theirs.Acquire(); ok || err != nil {
		t.Fatalf("exclusive through go-zero under a share: %v, %v", ok, err)
	}
	zl := zredis.NewRedisLock(z, "cfg")
	// go-zero's script GETs the key first: a share's key names its kind,
	// another owner's value, and go-zero's lock sees it held (issue 36).
	if ok, err := zl.Acquire(); ok || err != nil {
		t.Fatalf("go-zero's RedisLock under a share: %v, %v", ok, err)
	}
	mustRelease(t, ours)
	if ok, err := zl.Acquire(); !ok || err != nil {
		t.Fatalf("go-zero's RedisLock after the share: %v, %v", ok, err)
	}
	if ok, err := ours.Acquire(); ok || err != nil {
		t.Fatalf("a share under go-zero's RedisLock: %v, %v", ok, err)
	}
	if ok, err := zl.Release(); !ok || err != nil {
		t.Fatal(ok, err)
	}
	shareOverZero := NewRedisLock(z, "cfg", WithShared(), WithPermits(0)) // WithPermits(0): a mistake, through go-zero too
	if _, err := shareOverZero.Acquire(); !errors.Is(err, ErrInvalidPermits) {
		t.Fatal(err)
	}
	viaZero := NewRedisLock(z, "cfg", WithPermits(1))
	mustAcquire(t, viaZero)
	if ok, err := NewRedisLock(z, "cfg", WithPermits(1)).Acquire(); ok || err != nil {
		t.Fatalf("a second permit of 1 through go-zero: %v, %v", ok, err)
	}
	mustRelease(t, viaZero)
}

// Found by the black-box review of issue 36: our own scripts' replies to a
// caller's mistake (ErrWrongKind, ErrCorruptFencingCounter) were error
// replies, which go-zero's breaker counted: about 50 of them through
// go-zero's store opened it, and it then refused every call of that store,
// the renewals and releases of other holds included. They are statuses now.
func TestCallersMistakesLeaveGoZeroBreakerClosed(t *testing.T) {
	ctx := context.Background()
	srv := redisserver.Start(t)
	admin := srv.Client(t)
	z := goZeroStore(t, srv.Addr)
	sem := NewRedisLock(z, "s", WithPermits(1))
	mustAcquire(t, sem)
	theirs := zredis.NewRedisLock(z, "z")
	if ok, err := theirs.AcquireCtx(ctx); !ok || err != nil {
		t.Fatalf("go-zero's lock of z: %v, %v", ok, err)
	}
	must(t, admin.Set(ctx, relatedName("c", "fence"), "not a number", 0).Err())
	mistakes := map[string]struct {
		rl   *RedisLock
		want error
	}{
		"a lock on a semaphore":           {NewRedisLock(z, "s"), ErrWrongKind},
		"a semaphore of another n":        {NewRedisLock(z, "s", WithPermits(2)), ErrWrongKind},
		"a share on a semaphore":          {NewRedisLock(z, "s", WithShared()), ErrWrongKind},
		"a semaphore on go-zero's lock":   {NewRedisLock(z, "z", WithPermits(1)), ErrWrongKind},
		"a fair semaphore on a semaphore": {NewRedisLock(z, "s", WithPermits(3), WithFairness()), ErrWrongKind},
		"a corrupt fencing counter":       {NewRedisLock(z, "c", WithFencing()), ErrCorruptFencingCounter},
	}
	for range 100 { // go-zero's breaker opened after about 50
		for what, m := range mistakes {
			if ok, err := m.rl.AcquireCtx(ctx); ok || !errors.Is(err, m.want) {
				t.Fatalf("%s: %v, %v; want %v", what, ok, err, m.want)
			}
		}
	}
	if err := z.SetCtx(ctx, "probe", "1"); err != nil {
		t.Fatalf("go-zero's store after our refusals: %v", err)
	}
	mustRelease(t, sem)
	if ok, err := theirs.ReleaseCtx(ctx); !ok || err != nil {
		t.Fatalf("go-zero's release of z: %v, %v", ok, err)
	}
}

// TestHoldersKeyLayout (issue 36): a semaphore's or a shared lock's key is
// a string that names its kind, its holders a sorted set in a related key;
// both live as long as the longest lease, are renewed together, and go with
// the last holder. The key decides: holders whose key an outsider deleted
// are lost, and are not counted by the holders after them.
func TestHoldersKeyLayout(t *testing.T) {
	onServers(t, func(t *testing.T, c, admin *redis.Client) {
		ctx := context.Background()
		for _, tc := range []struct {
			key, kind string
			opts      []Option
		}{{"pool", "redislock:permits", []Option{WithPermits(2)}}, {"rw", "redislock:shared", []Option{WithShared()}}} {
			holders := relatedName(tc.key, "holders")
			opts := append([]Option{WithExpiry(2 * time.Second)}, tc.opts...)
			a, b := NewRedisLock(FromGoRedis(c), tc.key, opts...), NewRedisLock(FromGoRedis(c), tc.key, opts...)
			mustAcquire(t, a)
			mustAcquire(t, b)
			if v := admin.Get(ctx, tc.key).Val(); v != tc.kind {
				t.Fatalf("%s holds %q, want %q", tc.key, v, tc.kind)
			}
			if n := admin.ZCount(ctx, holders, "(0", "(1e14").Val(); n != 2 {
				t.Fatalf("%s has %d holders, want 2", holders, n)
			}
			must(t, admin.PExpire(ctx, tc.key, 100*time.Millisecond).Err()) // shortened: a renewal makes both live a lease again
			must(t, admin.PExpire(ctx, holders, 100*time.Millisecond).Err())
			if ok, err := a.AcquireCtx(ctx); !ok || err != nil { // a re-entry renews
				t.Fatalf("re-entry: %v, %v", ok, err)
			}
			for _, k := range []string{tc.key, holders} {
				if ttl := admin.PTTL(ctx, k).Val(); ttl < time.Second {
					t.Fatalf("%s lives %v after a renewal of a 2 s lease", k, ttl)
				}
			}
			mustRelease(t, a)
			mustRelease(t, a)
			mustRelease(t, b)
			if n := admin.Exists(ctx, tc.key, holders).Val(); n != 0 {
				t.Fatalf("%d of %s and %s left after the last release", n, tc.key, holders)
			}

			// An outsider deletes the key under two holders: a newcomer
			// starts a new set, and the two are lost at their next renewal.
			mustAcquire(t, a)
			mustAcquire(t, b)
			must(t, admin.Del(ctx, tc.key).Err())
			d, e := NewRedisLock(FromGoRedis(c), tc.key, opts...), NewRedisLock(FromGoRedis(c), tc.key, opts...)
			mustAcquire(t, d)
			mustAcquire(t, e) // of 2 permits: a and b no longer count
			if n := admin.ZCount(ctx, holders, "(0", "(1e14").Val(); n != 2 {
				t.Fatalf("%s has %d holders after the outsider's DEL, want d and e", holders, n)
			}
			for _, lost := range []*RedisLock{a, b} {
				select {
				case <-lost.Done():
				case <-time.After(10 * time.Second):
					t.Fatalf("a holder of %s whose key was deleted still holds", tc.key)
				}
				if !errors.Is(lost.Err(), ErrLockLost) {
					t.Fatalf("Err = %v, want ErrLockLost", lost.Err())
				}
			}
			if d.Holds() != 1 || e.Holds() != 1 {
				t.Fatalf("the holders after the DEL lost theirs: %v, %v", d.Err(), e.Err())
			}
			releaseAll(d, e)
			if n := admin.Exists(ctx, tc.key, holders).Val(); n != 0 {
				t.Fatalf("%d of %s and %s left after the last release", n, tc.key, holders)
			}
		}
	})
}

// TestGoZeroBreakerStaysClosedOnOurKeys (issue 36): go-zero's RedisLock on
// a key that our semaphore's or shared lock's holders hold finds it held,
// false and no error, however many times it tries, so go-zero's breaker
// counts no failure and the store's other calls go on; the holders keep
// their holds. Before, the key was a sorted set, go-zero's GET failed with
// WRONGTYPE, and a stream of such attempts opened the breaker.
func TestGoZeroBreakerStaysClosedOnOurKeys(t *testing.T) {
	ctx := context.Background()
	srv := redisserver.Start(t)
	c := srv.Client(t)
	z := goZeroStore(t, srv.Addr)
	var holders []*RedisLock
	for key, opts := range map[string][]Option{"exports": {WithPermits(2)}, "catalogue": {WithShared()},
		"fair-exports": {WithPermits(1), WithFairness(), WithFencing()}, "fair-catalogue": {WithShared(), WithFairness()}} {
		rl := NewRedisLock(FromGoRedis(c), key, opts...)
		mustAcquire(t, rl)
		holders = append(holders, rl)
	}
	defer releaseAll(holders...)
	const attempts = 500 // go-zero's breaker opens after far fewer failures
	for i := range attempts {
		for _, h := range holders {
			zl := zredis.NewRedisLock(z, h.Key())
			if ok, err := zl.AcquireCtx(ctx); ok || err != nil {
				t.Fatalf("attempt %d of go-zero's lock on %s, held by our %s: %v, %v", i, h.Key(), h.kind(), ok, err)
			}
			if ok, err := zl.ReleaseCtx(ctx); ok || err != nil {
				t.Fatalf("go-zero's release of %s, which it does not hold: %v, %v", h.Key(), ok, err)
			}
		}
	}
	// The breaker is closed: the store's own calls and a lock of another key go through.
	if err := z.SetCtx(ctx, "unrelated", "v"); err != nil {
		t.Fatalf("go-zero's SET after the attempts: %v", err)
	}
	other := zredis.NewRedisLock(z, "other")
	if ok, err := other.AcquireCtx(ctx); !ok || err != nil {
		t.Fatalf("go-zero's lock of a free key after the attempts: %v, %v", ok, err)
	}
	if ok, err := other.ReleaseCtx(ctx); !ok || err != nil {
		t.Fatalf("go-zero's release of its own lock: %v, %v", ok, err)
	}
	for _, h := range holders {
		if h.Holds() != 1 {
			t.Fatalf("our %s of %s was lost: %v", h.kind(), h.Key(), h.Err())
		}
		if st, err := h.Inspect(ctx); err != nil || !st.Held || st.Holders != 1 {
			t.Fatalf("Inspect of %s = %+v, %v", h.Key(), st, err)
		}
	}
}

// TestSemaphoreNeverMoreThanN: workers in AcquireWait on a real server,
// holds overlapping, never more than n inside at once, and every worker
// gets its turns (wake-ups pass a freed permit on).
func TestSemaphoreNeverMoreThanN(t *testing.T) {
	srv := redisserver.Start(t)
	const n, workers, rounds = 3, 8, 25
	var inside, most, taken atomic.Int64
	var wg sync.WaitGroup
	errs := make(chan error, workers)
	for w := 0; w < workers; w++ {
		c := srv.Client(t)
		rl := NewRedisLock(FromGoRedis(c), "workers", WithPermits(n), WithExpiry(time.Second))
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < rounds; i++ {
				err := rl.Do(context.Background(), func(ctx context.Context) error {
					now := inside.Add(1)
					for m := most.Load(); now > m && !most.CompareAndSwap(m, now); m = most.Load() {
					}
					time.Sleep(time.Millisecond)
					inside.Add(-1)
					taken.Add(1)
					return nil
				})
				if err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	if most.Load() > n || most.Load() < 2 || taken.Load() != workers*rounds {
		t.Fatalf("at most %d inside of %d permits, %d sections", most.Load(), n, taken.Load())
	}
	t.Logf("%d sections by %d workers, at most %d inside at once", taken.Load(), workers, most.Load())
}

// TestSharedWriterGetsInUnderReaders: a stream of readers whose holds
// overlap, so that the key is never free (a new one every 10 ms, each
// holding 30 ms), does not keep a waiting exclusive holder out: once it
// waits, new shares wait behind it, and it gets in when the shares held
// then are released. (Without its wait's mark, it does not get in.)
//
// Found by the black-box review: a writer without wake-ups whose attempts
// came more than its mark's window apart never got in; its attempts now
// come within a third of the window.
func TestSharedWriterGetsInUnderReaders(t *testing.T) {
	t.Run("pub/sub", func(t *testing.T) { writerUnderReaders(t, true) })
	t.Run("no wake-ups, short lease, slow retries", func(t *testing.T) {
		writerUnderReaders(t, false, WithPubSub(nil), WithExpiry(200*time.Millisecond), WithRetry(FixedRetry(500*time.Millisecond)))
	})
}

// writerUnderReaders is TestSharedWriterGetsInUnderReaders for a writer
// made with opts (recorded in the fault table when record).
func writerUnderReaders(t *testing.T, record bool, opts ...Option) {
	srv := redisserver.Start(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var clients []Scripter
	for range 4 {
		clients = append(clients, FromGoRedis(srv.Client(t)))
	}
	var sharesBegun atomic.Int64
	var writerIn, overlap atomic.Bool
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for i := 0; ctx.Err() == nil; i++ {
			rl := NewRedisLock(clients[i%len(clients)], "catalogue", WithShared(), WithExpiry(time.Second))
			wg.Add(1)
			go func() {
				defer wg.Done()
				if rl.AcquireWait(ctx) != nil {
					return
				}
				sharesBegun.Add(1)
				if writerIn.Load() {
					overlap.Store(true)
				}
				time.Sleep(30 * time.Millisecond)
				rl.Release()
			}()
			time.Sleep(10 * time.Millisecond)
		}
	}()
	const readers = 3
	waitFor(t, 10*time.Second, "readers under way", func() bool { return sharesBegun.Load() > 20 })
	w := NewRedisLock(FromGoRedis(srv.Client(t)), "catalogue", append([]Option{WithExpiry(time.Second)}, opts...)...)
	wctx, wcancel := context.WithTimeout(ctx, 20*time.Second)
	defer wcancel()
	if err := w.AcquireWait(wctx); err != nil {
		t.Fatalf("the writer under a stream of readers: %v", err)
	}
	writerIn.Store(true)
	time.Sleep(50 * time.Millisecond)
	writerIn.Store(false)
	mustRelease(t, w)
	began := sharesBegun.Load()
	waitFor(t, 10*time.Second, "readers after the writer", func() bool { return sharesBegun.Load() > began+readers })
	cancel()
	wg.Wait()
	var violations int64
	if overlap.Load() {
		violations = 1
		t.Error("a share began while the writer held the key")
	}
	if !record {
		return
	}
	recordFault(t, faultRow{
		Case:      "25. shared: a writer under a stream of readers",
		Injection: "a new share every 10 ms, each held 30 ms, so that the key is never free; an exclusive AcquireWait",
		Promise:   "the writer gets in (new shares wait behind it), and no share begins while it holds",
		Runs:      1, Faults: sharesBegun.Load(), Violations: violations,
	})
}

func TestSemaphoreHolderLossAndCrash(t *testing.T) {
	onServers(t, func(t *testing.T, c, admin *redis.Client) {
		ctx := context.Background()
		s := FromGoRedis(c)
		a := NewRedisLock(s, "jobs", WithPermits(2), WithExpiry(300*time.Millisecond))
		b := NewRedisLock(s, "jobs", WithPermits(2), WithExpiry(300*time.Millisecond))
		mustAcquire(t, a)
		mustAcquire(t, b)
		st, err := a.Break(ctx, b.Owner())
		if err != nil || st.Owner != b.Owner() || st.Expires.IsZero() { // found by the second black-box round: Expires was zero
			t.Fatalf("Break(b) = %+v, %v", st, err)
		}
		waitDone(t, b.Done(), "the broken holder's Done")
		if !errors.Is(b.Err(), ErrLockLost) {
			t.Fatalf("Err = %v", b.Err())
		}
		if isClosed(a.Done()) {
			t.Fatal("breaking one holder ended another")
		}
		if _, err := a.Break(ctx, "nobody"); !errors.Is(err, ErrHeldByOther) {
			t.Fatalf("Break of a non-holder: %v", err)
		}
		if ok, err := b.Release(); ok || !errors.Is(err, ErrLockLost) {
			t.Fatalf("Release after the loss: %v, %v", ok, err)
		}
		// A holder that dies (no renewal, never released) frees its permit
		// when its lease runs out, whatever the others do.
		dead := NewRedisLock(s, "jobs", WithPermits(2), WithExpiry(300*time.Millisecond), WithoutWatchdog())
		mustAcquire(t, dead)
		next := NewRedisLock(s, "jobs", WithPermits(2))
		if ok, _ := next.Acquire(); ok {
			t.Fatal("a third holder of 2 permits")
		}
		waitFor(t, 10*time.Second, "the dead holder's permit", func() bool {
			ok, err := next.Acquire()
			return ok && err == nil
		})
		mustRelease(t, next)
		mustRelease(t, a)
		dead.Release()
	})
}

// holdOp is one step of the history of a semaphore's or a shared lock's
// key: a client taking a permit, a share, or the key exclusive (between
// the call and the return of its acquisition), or giving it back (between
// the call and the return of its release; for a holder that died, between
// its acquisition and the end of its lease).
type holdOp struct {
	Client       int
	Shared, Take bool  // Shared: a permit or a share
	Call, Return int64 // ns since the epoch
}

// holdersModel is the sequential specification of a semaphore of n
// permits (n > 0: every op is Shared), or of a shared lock (n == 0): the
// state is the number of shared holders, -1 while an exclusive one holds.
func holdersModel(n int) porcupine.Model {
	return porcupine.Model{
		Init: func() any { return 0 },
		Step: func(state, input, _ any) (bool, any) {
			held, op := state.(int), input.(holdOp)
			switch {
			case op.Take && op.Shared && held >= 0 && (n == 0 || held < n):
				return true, held + 1
			case op.Take && !op.Shared && held == 0:
				return true, -1
			case !op.Take && op.Shared && held > 0:
				return true, held - 1
			case !op.Take && !op.Shared && held == -1:
				return true, 0
			}
			return false, held
		},
		DescribeOperation: func(input, _ any) string {
			op := input.(holdOp)
			return fmt.Sprintf("client %d shared=%v take=%v", op.Client, op.Shared, op.Take)
		},
	}
}

// checkHolders checks ops against holdersModel(n).
func checkHolders(n int, ops []holdOp) porcupine.CheckResult {
	history := make([]porcupine.Operation, len(ops))
	for i, op := range ops {
		history[i] = porcupine.Operation{ClientId: op.Client, Input: op, Call: op.Call, Return: op.Return}
	}
	return porcupine.CheckOperationsTimeout(holdersModel(n), history, time.Minute)
}

// The checker passes holders that never exceed n, and catches n+1.
func TestSemaphoreModelCatchesOverAdmission(t *testing.T) {
	ok := []holdOp{{0, true, true, 1, 2}, {1, true, true, 1, 3}, {0, true, false, 4, 5}, {2, true, true, 4, 6}, {1, true, false, 7, 8}, {2, true, false, 7, 9}}
	if r := checkHolders(2, ok); r != porcupine.Ok {
		t.Fatalf("two holders of two permits: %v", r)
	}
	if r := checkHolders(1, ok); r != porcupine.Illegal {
		t.Fatalf("two holders of one permit passed: %v", r)
	}
}

// TestSemaphoreHistory records every section of 8 workers on a 3-permit
// semaphore on a real server, with holders that die holding a permit
// (never released, never renewed), while the server's scripts are flushed,
// its clients' connections killed and its writes paused for less than a
// lease; porcupine checks the history against a semaphore of 3.
//
// The same with WithFairness (case 24b): freed permits handed to the
// longest waiter.
func TestSemaphoreHistory(t *testing.T) {
	t.Run("plain", func(t *testing.T) { semaphoreHistory(t, nil, "24. semaphore") })
	t.Run("fair", func(t *testing.T) { semaphoreHistory(t, []Option{WithFairness()}, "24b. fair semaphore") })
}

// serverFaults flushes the server's scripts, kills its clients'
// connections and pauses its writes for 100 ms, in turn every 150 ms,
// until ctx ends.
func serverFaults(ctx context.Context, admin *redis.Client) {
	for i := 0; ctx.Err() == nil; i++ {
		switch i % 3 {
		case 0:
			admin.ScriptFlush(context.Background())
		case 1:
			admin.ClientKillByFilter(context.Background(), "TYPE", "normal", "SKIPME", "yes")
		case 2:
			admin.Do(context.Background(), "CLIENT", "PAUSE", 100, "WRITE")
		}
		time.Sleep(150 * time.Millisecond)
	}
}

func semaphoreHistory(t *testing.T, opts []Option, name string) {
	srv := redisserver.Start(t)
	admin := srv.Client(t)
	const n, workers, lease = 3, 8, time.Second
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Second)
	defer cancel()
	var mu sync.Mutex
	var ops []holdOp
	record := func(op holdOp) {
		mu.Lock()
		ops = append(ops, op)
		mu.Unlock()
	}
	var wg sync.WaitGroup
	var sections, lost atomic.Int64
	for w := 0; w < workers; w++ {
		c := redis.NewClient(&redis.Options{Addr: srv.Addr, MaxRetries: -1})
		t.Cleanup(func() { c.Close() })
		rl := NewRedisLock(FromGoRedis(c), "history", append([]Option{WithPermits(n), WithExpiry(lease)}, opts...)...)
		wg.Add(1)
		go func() {
			defer wg.Done()
			for ctx.Err() == nil {
				call := time.Now().UnixNano()
				if err := rl.AcquireWait(ctx); err != nil {
					if !errors.Is(err, ErrNotAcquired) && ctx.Err() == nil {
						time.Sleep(10 * time.Millisecond) // a killed connection: again
					}
					continue
				}
				record(holdOp{w, true, true, call, time.Now().UnixNano()})
				time.Sleep(time.Millisecond)
				call = time.Now().UnixNano()
				_, err := rl.ReleaseCtx(context.Background())
				ret := time.Now().UnixNano()
				if err != nil { // unanswered, or lost: the server frees it by its lease's end
					lost.Add(1)
					ret = time.Now().Add(lease).UnixNano()
				}
				record(holdOp{w, true, false, call, ret})
				sections.Add(1)
			}
		}()
	}
	// Holders that die: taken, never renewed nor released.
	wg.Add(1)
	go func() {
		defer wg.Done()
		for i := workers; ctx.Err() == nil; i++ {
			dead := NewRedisLock(FromGoRedis(admin), "history", append([]Option{WithPermits(n), WithExpiry(300 * time.Millisecond), WithoutWatchdog()}, opts...)...)
			call := time.Now().UnixNano()
			if dead.AcquireWait(ctx) == nil {
				ret := time.Now().UnixNano()
				record(holdOp{i, true, true, call, ret})
				record(holdOp{i, true, false, ret, time.Now().Add(300 * time.Millisecond).UnixNano()})
			}
			select {
			case <-ctx.Done():
			case <-time.After(400 * time.Millisecond):
			}
		}
	}()
	serverFaults(ctx, admin)
	wg.Wait()
	if sections.Load() < 100 {
		t.Fatalf("only %d sections", sections.Load())
	}
	var violations int64
	if r := checkHolders(n, ops); r != porcupine.Ok {
		violations = 1
		t.Errorf("%d operations: %v against a semaphore of %d", len(ops), r, n)
	}
	recordFault(t, faultRow{
		Case:      name + ": holders die, scripts flushed, connections killed, writes paused",
		Injection: "8 workers on 3 permits for 4 s; a holder that never renews nor releases every 0.4 s; SCRIPT FLUSH, CLIENT KILL and CLIENT PAUSE WRITE 100 ms in turn every 150 ms",
		Promise:   "never more than 3 inside: porcupine finds a semaphore of 3 that explains every section (a release unanswered counts until its lease's end)",
		Runs:      sections.Load(), Faults: 4000 / 150, Violations: violations,
	})
	t.Logf("%d sections, %d holders that died, %d releases unanswered or lost: a semaphore of %d explains them", sections.Load(), (len(ops)-2*int(sections.Load()))/2, lost.Load(), n)
}

// Found by the black-box review of issue 28, a test each.
func TestSemaphoreBlackBoxFindings(t *testing.T) {
	ctx := context.Background()
	srv := redisserver.Start(t)
	c, admin := srv.Client(t), srv.Client(t)
	s := FromGoRedis(c)

	t.Run("memory full: holders keep their permits, re-enter, renew and release", func(t *testing.T) {
		var holders []*RedisLock
		for i, opt := range []Option{WithPermits(2), WithShared()} {
			rl := NewRedisLock(s, fmt.Sprintf("oom:%d", i), opt, WithExpiry(300*time.Millisecond))
			mustAcquire(t, rl)
			holders = append(holders, rl)
		}
		must(t, admin.ConfigSet(ctx, "maxmemory-policy", "noeviction").Err())
		must(t, admin.ConfigSet(ctx, "maxmemory", "1").Err())
		defer admin.ConfigSet(ctx, "maxmemory", "0")
		for _, rl := range holders {
			if ok, err := rl.Acquire(); !ok || err != nil {
				t.Fatalf("%s: re-entry under OOM: %v, %v", rl.Key(), ok, err)
			}
			until := rl.Until()
			waitFor(t, 10*time.Second, "renewals under OOM", func() bool { return rl.Until().After(until.Add(300*time.Millisecond)) || isClosed(rl.Done()) })
			if isClosed(rl.Done()) {
				t.Fatalf("%s: lost under OOM: %v", rl.Key(), rl.Err())
			}
			mustRelease(t, rl)
			mustRelease(t, rl)
			if admin.Exists(ctx, rl.Key()).Val() != 0 {
				t.Fatalf("%s: not released under OOM", rl.Key())
			}
		}
	})

	t.Run("a writer that gave up holds new shares off for a second at most", func(t *testing.T) {
		r := NewRedisLock(s, "gaveup", WithShared())
		mustAcquire(t, r)
		wctx, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
		if err := NewRedisLock(s, "gaveup").AcquireWait(wctx); !errors.Is(err, ErrNotAcquired) {
			t.Fatalf("the writer: %v", err)
		}
		cancel()
		mustRelease(t, r)
		rctx, cancel := context.WithTimeout(ctx, 5*time.Second) // the mark was 2 leases (20 s)
		defer cancel()
		if err := r.AcquireWait(rctx); err != nil {
			t.Fatalf("a share after the writer gave up: %v", err)
		}
		mustRelease(t, r)
	})

	t.Run("permits beyond MaxPermits", func(t *testing.T) {
		for _, n := range []int{MaxPermits + 1, 1 << 53, 1<<63 - 1} {
			if _, err := NewRedisLock(s, "huge", WithPermits(n)).Acquire(); !errors.Is(err, ErrInvalidPermits) {
				t.Fatalf("WithPermits(%d): %v", n, err)
			}
		}
		big := NewRedisLock(s, "huge", WithPermits(MaxPermits))
		mustAcquire(t, big)
		if ok, err := NewRedisLock(s, "huge", WithPermits(MaxPermits-1)).Acquire(); ok || !errors.Is(err, ErrWrongKind) {
			t.Fatalf("MaxPermits-1 against MaxPermits: %v, %v", ok, err)
		}
		if st, err := big.Inspect(ctx); err != nil || st.Permits != MaxPermits || st.Expires.IsZero() || !st.Expires.After(time.Now()) {
			t.Fatalf("Inspect = %+v, %v", st, err)
		}
		mustRelease(t, big)
	})

	t.Run("the mark removed by an outsider: a release keeps the other holder", func(t *testing.T) {
		a, b := NewRedisLock(s, "unmarked", WithPermits(2)), NewRedisLock(s, "unmarked", WithPermits(2))
		mustAcquire(t, a)
		mustAcquire(t, b)
		must(t, admin.ZRem(ctx, relatedName("unmarked", "holders"), "redislock:permits").Err())
		mustRelease(t, a)
		if _, err := admin.ZScore(ctx, relatedName("unmarked", "holders"), b.Owner()).Result(); err != nil {
			t.Fatalf("a's release took b's permit too: %v", err)
		}
		mustRelease(t, b)
	})

	t.Run("the key persisted by an outsider gets an expiry again", func(t *testing.T) {
		a, b := NewRedisLock(s, "persisted", WithPermits(2)), NewRedisLock(s, "persisted", WithPermits(2))
		mustAcquire(t, a)
		must(t, admin.Persist(ctx, "persisted").Err())
		mustAcquire(t, b)
		if ttl := admin.PTTL(ctx, "persisted").Val(); ttl <= 0 {
			t.Fatalf("PTTL %v after an acquisition", ttl)
		}
		must(t, admin.Persist(ctx, "persisted").Err())
		until := a.Until()
		waitFor(t, 20*time.Second, "a renewal", func() bool { return a.Until().After(until) })
		if ttl := admin.PTTL(ctx, "persisted").Val(); ttl <= 0 {
			t.Fatalf("PTTL %v after a renewal", ttl)
		}
		releaseAll(a, b)
	})

	t.Run("a holder scored far ahead by an outsider is listed with a positive lease", func(t *testing.T) {
		a := NewRedisLock(s, "far", WithPermits(2))
		mustAcquire(t, a)
		must(t, admin.ZAdd(ctx, relatedName("far", "holders"), redis.Z{Score: 9e15, Member: "outsider"}).Err())
		holders, err := a.Holders(ctx)
		if err != nil || len(holders) != 2 || slices.ContainsFunc(holders, func(h Holder) bool { return h.TTL <= 0 }) {
			t.Fatalf("Holders = %v, %v", holders, err)
		}
		mustRelease(t, a)
	})
}

// TestFairSemaphoreServesWaitersInOrder: with WithFairness, each freed
// permit goes to the longest waiter, each waiter on a client of its own
// (as in other processes), and a newcomer does not barge in ahead of them.
func TestFairSemaphoreServesWaitersInOrder(t *testing.T) {
	onServers(t, func(t *testing.T, c, admin *redis.Client) {
		ctx := context.Background()
		addr := c.Options().Addr
		sem := func() *RedisLock {
			return NewRedisLock(FromGoRedis(newClient(t, addr)), "fair-pool", WithPermits(2), WithFairness(), WithExpiry(2*time.Second))
		}
		a, b := sem(), sem()
		mustAcquire(t, a)
		mustAcquire(t, b)
		var mu sync.Mutex
		var order []int
		waiters := make([]*RedisLock, 3)
		got := make(chan error, len(waiters))
		for i := range waiters {
			waiters[i] = sem()
			go func() {
				err := waiters[i].AcquireWait(ctx)
				mu.Lock()
				order = append(order, i)
				mu.Unlock()
				got <- err
			}()
			waitQueued(t, admin, "fair-pool", int64(i+1))
		}
		if ok, err := sem().Acquire(); ok || err != nil {
			t.Fatalf("a newcomer while 3 wait: %v, %v", ok, err)
		}
		mustRelease(t, a)
		if err := <-got; err != nil {
			t.Fatal(err)
		}
		mustRelease(t, b)
		if err := <-got; err != nil {
			t.Fatal(err)
		}
		mustRelease(t, waiters[0])
		if err := <-got; err != nil {
			t.Fatal(err)
		}
		if !slices.Equal(order, []int{0, 1, 2}) {
			t.Fatalf("served in the order %v; want arrival order", order)
		}
		if st, err := a.Inspect(ctx); err != nil || st.Holders != 2 || st.Waiters != 0 {
			t.Fatalf("Inspect = %+v, %v", st, err)
		}
		mustRelease(t, waiters[1])
		mustRelease(t, waiters[2])
		if admin.Exists(ctx, "fair-pool").Val() != 0 {
			t.Fatal("the key outlives its holders")
		}
	})
}

// TestWatchSeesHoldersComeAndGo: Watch reports a holder replaced by
// another, though their number stays the same.
func TestWatchSeesHoldersComeAndGo(t *testing.T) {
	_, c := newMini(t)
	s := FromGoRedis(c)
	a, b := NewRedisLock(s, "watched", WithPermits(2)), NewRedisLock(s, "watched", WithPermits(2))
	mustAcquire(t, a)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	seen := make(chan Status, 16)
	go a.Watch(ctx, 10*time.Millisecond, func(st Status) { seen <- st })
	if st := <-seen; st.Holders != 1 || st.Permits != 2 {
		t.Fatalf("first status %+v", st)
	}
	mustRelease(t, a)
	mustAcquire(t, b)                        // one holder for another, before a read may see the key free
	for st := (Status{}); st.Holders != 1; { // b's hold, seen as a change
		select {
		case st = <-seen:
		case <-time.After(10 * time.Second):
			t.Fatal("Watch did not report b taking a's place")
		}
	}
	mustRelease(t, b)
}

// TestFencedHolders: WithFencing gives each first acquisition of a
// semaphore's permit or a shared lock's share a token from the key's
// counter, strictly increasing across holders, kept by re-entries and
// listed by Holders; a holder's token leaves with it, and with a holder
// dropped when its lease ended.
func TestFencedHolders(t *testing.T) {
	onServers(t, func(t *testing.T, c, admin *redis.Client) {
		ctx := context.Background()
		s := FromGoRedis(c)
		for i, opt := range []Option{WithPermits(2), WithShared()} {
			key := fmt.Sprintf("fenced:%d", i)
			hold := func(o ...Option) *RedisLock {
				return NewRedisLock(s, key, append([]Option{opt, WithFencing()}, o...)...)
			}
			a, b := hold(), hold()
			mustAcquire(t, a)
			mustAcquire(t, b)
			if a.Token() <= 0 || b.Token() <= a.Token() {
				t.Fatalf("%s: tokens %d then %d", key, a.Token(), b.Token())
			}
			first := a.Token()
			mustAcquire(t, a) // a re-entry keeps the token
			if a.Token() != first {
				t.Fatalf("%s: a re-entry changed the token", key)
			}
			holders, err := a.Holders(ctx)
			if err != nil || len(holders) != 2 {
				t.Fatalf("%s: Holders = %v, %v", key, holders, err)
			}
			for _, h := range holders {
				if want := map[string]int64{a.Owner(): a.Token(), b.Owner(): b.Token()}[h.Owner]; h.Token != want {
					t.Fatalf("%s: holder %s listed with token %d, not %d", key, h.Owner, h.Token, want)
				}
			}
			if st, err := a.Inspect(ctx); err != nil || st.Holders != 2 || st.Fence != b.Token() {
				t.Fatalf("%s: Inspect = %+v, %v", key, st, err)
			}
			mustRelease(t, a)
			mustRelease(t, a)
			if admin.ZScore(ctx, relatedName(key, "holders"), "#"+holderID(a)).Err() == nil {
				t.Fatalf("%s: a's token outlives its release", key)
			}
			d := hold()
			mustAcquire(t, d)
			if d.Token() <= b.Token() {
				t.Fatalf("%s: the next token %d is not above %d", key, d.Token(), b.Token())
			}
			releaseAll(b, d)
			if n := admin.Exists(ctx, key).Val(); n != 0 {
				t.Fatalf("%s outlives its holders", key)
			}
		}
		// A dead holder dropped when its lease ended takes its token along.
		dead := NewRedisLock(s, "fenced-dead", WithPermits(1), WithFencing(), WithExpiry(100*time.Millisecond), WithoutWatchdog())
		mustAcquire(t, dead)
		id := dead.Owner()
		next := NewRedisLock(s, "fenced-dead", WithPermits(1), WithFencing())
		waitFor(t, 10*time.Second, "the dead holder's permit", func() bool { ok, err := next.Acquire(); return ok && err == nil })
		if admin.ZScore(ctx, relatedName("fenced-dead", "holders"), "#"+id).Err() == nil || next.Token() <= 0 {
			t.Fatalf("the dropped holder's token stays, or the next has none (%d)", next.Token())
		}
		// Found by the third black-box round: Holders failed on a corrupt
		// counter, which it does not need.
		must(t, admin.Set(ctx, relatedName("fenced-dead", "fence"), "garbage", 0).Err())
		if holders, err := next.Holders(ctx); err != nil || len(holders) != 1 || holders[0].Owner != next.Owner() {
			t.Fatalf("Holders with a corrupt counter = %v, %v", holders, err)
		}
		mustRelease(t, next)
		dead.Release()
	})
}

// TestFairFencedSemaphoreHandoff: a freed permit handed to a fenced fair
// waiter carries a token above the releaser's, kept in the key.
func TestFairFencedSemaphoreHandoff(t *testing.T) {
	srv := redisserver.Start(t)
	admin := srv.Client(t)
	sem := func() *RedisLock {
		return NewRedisLock(FromGoRedis(srv.Client(t)), "fair-fenced", WithPermits(1), WithFairness(), WithFencing())
	}
	holder, waiter := sem(), sem()
	mustAcquire(t, holder)
	got := make(chan error, 1)
	go func() { got <- waiter.AcquireWait(context.Background()) }()
	waitQueued(t, admin, "fair-fenced", 1)
	mustRelease(t, holder)
	if err := <-got; err != nil {
		t.Fatal(err)
	}
	stored, err := admin.ZScore(context.Background(), relatedName("fair-fenced", "holders"), "#"+waiter.Owner()).Result()
	if err != nil || waiter.Token() <= holder.Token() || int64(stored) != waiter.Token() {
		t.Fatalf("handed token %d (stored %v, %v) after %d", waiter.Token(), stored, err, holder.Token())
	}
	mustRelease(t, waiter)
}

// TestFairSharedServesInArrivalOrder: with WithFairness, the waiters of a
// key, shared and exclusive, each on a client of its own, are served in
// arrival order: a share waits behind an exclusive waiter that came before
// it (newcomers too, fair or not), and a release hands the key to every
// waiter for a share up to the next exclusive one at once.
func TestFairSharedServesInArrivalOrder(t *testing.T) {
	onServers(t, func(t *testing.T, c, admin *redis.Client) {
		ctx := context.Background()
		addr := c.Options().Addr
		lock := func(opts ...Option) *RedisLock {
			return NewRedisLock(FromGoRedis(newClient(t, addr)), "rw", append(opts, WithFairness(), WithExpiry(2*time.Second))...)
		}
		x0 := lock()
		mustAcquire(t, x0)
		var mu sync.Mutex
		var order []string
		waiters := map[string]*RedisLock{"s1": lock(WithShared()), "x2": lock(), "s3": lock(WithShared()), "s4": lock(WithShared())}
		got := make(chan error, len(waiters))
		for i, name := range []string{"s1", "x2", "s3", "s4"} {
			go func() {
				err := waiters[name].AcquireWait(ctx)
				mu.Lock()
				order = append(order, name)
				mu.Unlock()
				got <- err
			}()
			waitQueued(t, admin, "rw", int64(i+1))
		}
		served := func(n int) []string {
			t.Helper()
			for range n {
				if err := <-got; err != nil {
					t.Fatal(err)
				}
			}
			mu.Lock()
			defer mu.Unlock()
			return slices.Clone(order)
		}
		mustRelease(t, x0)
		if o := served(1); !slices.Equal(o, []string{"s1"}) {
			t.Fatalf("after the exclusive holder's release: %v; want s1 alone", o)
		}
		if ok, err := lock(WithShared()).Acquire(); ok || err != nil {
			t.Fatalf("a fair newcomer's share while x2 waits: %v, %v", ok, err)
		}
		if ok, err := NewRedisLock(FromGoRedis(c), "rw", WithShared()).Acquire(); ok || err != nil {
			t.Fatalf("a share that does not queue, while x2 waits: %v, %v", ok, err)
		}
		if st, err := x0.Inspect(ctx); err != nil || !st.Shared || st.Holders != 1 || st.Waiters != 3 {
			t.Fatalf("Inspect with s1 in = %+v, %v", st, err)
		}
		mustRelease(t, waiters["s1"])
		if o := served(1); !slices.Equal(o, []string{"s1", "x2"}) {
			t.Fatalf("after s1's release: %v", o)
		}
		mustRelease(t, waiters["x2"])
		// Both shares are handed by the release itself, before either waiter
		// has heard of it.
		if st, err := x0.Inspect(ctx); err != nil || !st.Shared || st.Holders != 2 || st.Waiters != 0 {
			t.Fatalf("Inspect after x2's release = %+v, %v", st, err)
		}
		if o := served(2); len(o) != 4 || !slices.Equal(o[:2], []string{"s1", "x2"}) {
			t.Fatalf("after x2's release: %v", o)
		}
		mustRelease(t, waiters["s3"])
		mustRelease(t, waiters["s4"])
		if n := admin.Exists(ctx, "rw", relatedName("rw", "queue"), relatedName("rw", "waiters")).Val(); n != 0 {
			t.Fatalf("%d keys outlive the holders and waiters", n)
		}

		// A share at the head of the queue takes the key once it is free,
		// an exclusive waiter behind it. Found by case 28b: the share took
		// the whole queue for the waiters ahead of it, and waited for the
		// exclusive one behind it, which waited for the share.
		mustAcquire(t, x0)
		for i, name := range []string{"s1", "x2"} {
			go func() { got <- waiters[name].AcquireWait(ctx) }()
			waitQueued(t, admin, "rw", int64(i+1))
		}
		must(t, admin.Del(ctx, "rw").Err()) // freed without a handoff: the waiters attempt
		select {
		case err := <-got:
			must(t, err)
		case <-time.After(10 * time.Second): // they attempt within a third of their lease
			t.Fatal("neither waiter got the free key within 10 s")
		}
		if waiters["s1"].Holds() != 1 || waiters["x2"].Holds() != 0 {
			t.Fatalf("after the key was freed: s1 holds %d, x2 %d", waiters["s1"].Holds(), waiters["x2"].Holds())
		}
		mustRelease(t, waiters["s1"])
		if err := <-got; err != nil {
			t.Fatal(err)
		}
		mustRelease(t, waiters["x2"])
	})
}

// The checker passes shares together, and catches a share beside an
// exclusive holder.
func TestSharedModelCatchesOverlap(t *testing.T) {
	ok := []holdOp{{0, true, true, 1, 2}, {1, true, true, 1, 3}, {0, true, false, 4, 5}, {1, true, false, 4, 6}, {2, false, true, 7, 8}, {2, false, false, 9, 10}}
	if r := checkHolders(0, ok); r != porcupine.Ok {
		t.Fatalf("two shares, then an exclusive holder: %v", r)
	}
	bad := append(slices.Clone(ok[:2]), holdOp{2, false, true, 2, 3}, holdOp{2, false, false, 4, 5}, ok[2], ok[3])
	if r := checkHolders(0, bad); r != porcupine.Illegal {
		t.Fatalf("an exclusive holder beside two shares passed: %v", r)
	}
}

// TestSharedHistory records every section of 5 shared and 2 exclusive
// workers of ours, go-zero's RedisLock and a raw SET NX on one key of a
// real server, with holders of ours that die holding it (never released,
// never renewed), while the server's scripts are flushed, its clients'
// connections killed and its writes paused for less than a lease;
// porcupine checks the history against a shared lock. The same with
// WithFairness for every lock of ours (case 28b).
func TestSharedHistory(t *testing.T) {
	t.Run("plain", func(t *testing.T) { sharedHistory(t, nil, "28. shared and exclusive") })
	t.Run("fair", func(t *testing.T) { sharedHistory(t, []Option{WithFairness()}, "28b. fair shared and exclusive") })
}

func sharedHistory(t *testing.T, opts []Option, name string) {
	srv := redisserver.Start(t)
	admin := srv.Client(t)
	const shares, exclusive, lease = 5, 2, time.Second
	// 4 s, or up to 12 s until there are enough sections of both kinds:
	// under load, writers that come first can keep the shares out long.
	start := time.Now()
	ctx, cancel := context.WithTimeout(context.Background(), 12*time.Second)
	defer cancel()
	var mu sync.Mutex
	var ops []holdOp
	record := func(op holdOp) {
		mu.Lock()
		ops = append(ops, op)
		mu.Unlock()
	}
	now := func() int64 { return time.Now().UnixNano() }
	var wg sync.WaitGroup
	var sections [2]atomic.Int64 // shared, exclusive
	section := func(client int, shared bool, take func() bool, give func() bool, leaseLeft time.Duration) {
		defer wg.Done()
		for ctx.Err() == nil {
			call := now()
			if !take() {
				continue
			}
			record(holdOp{client, shared, true, call, now()})
			time.Sleep(time.Millisecond)
			call = now()
			ret := now()
			if !give() { // unanswered, or lost: the server frees it by its lease's end
				ret = time.Now().Add(leaseLeft).UnixNano()
			} else {
				ret = now()
			}
			record(holdOp{client, shared, false, call, ret})
			if shared {
				sections[0].Add(1)
			} else {
				sections[1].Add(1)
				time.Sleep(250 * time.Millisecond) // else the shares seldom find the key free (writers come first)
			}
		}
	}
	for w := range shares + exclusive {
		c := redis.NewClient(&redis.Options{Addr: srv.Addr, MaxRetries: -1})
		t.Cleanup(func() { c.Close() })
		shared := w < shares
		o := append([]Option{WithExpiry(lease)}, opts...)
		if shared {
			o = append(o, WithShared())
		}
		rl := NewRedisLock(FromGoRedis(c), "rw-history", o...)
		wg.Add(1)
		go section(w, shared, func() bool {
			if err := rl.AcquireWait(ctx); err != nil {
				if !errors.Is(err, ErrNotAcquired) && ctx.Err() == nil {
					time.Sleep(10 * time.Millisecond) // a killed connection: again
				}
				return false
			}
			return true
		}, func() bool {
			_, err := rl.ReleaseCtx(context.Background())
			return err == nil
		}, lease)
	}
	// go-zero's RedisLock and a raw SET NX, exclusive holders polling.
	z := goZeroStore(t, srv.Addr)
	var zl *zredis.RedisLock
	const zeroLease = 1500 * time.Millisecond // go-zero adds 500 ms to its expiry
	wg.Add(2)
	go section(shares+exclusive, false, func() bool {
		// A lock of its own each time: go-zero's takes its own key again,
		// which a release its breaker refused leaves.
		zl = zredis.NewRedisLock(z, "rw-history")
		zl.SetExpire(1)
		ok, _ := zl.AcquireCtx(ctx) // WRONGTYPE while shares hold, which opens its breaker
		if !ok {
			time.Sleep(10 * time.Millisecond)
		}
		return ok
	}, func() bool {
		ok, err := zl.Release()
		return ok && err == nil
	}, zeroLease)
	raw := fmt.Sprint("raw-", rand.Int64())
	go section(shares+exclusive+1, false, func() bool {
		ok, err := admin.SetNX(ctx, "rw-history", raw, 300*time.Millisecond).Result()
		if !ok || err != nil {
			time.Sleep(time.Millisecond)
		}
		return ok && err == nil
	}, func() bool {
		n, err := admin.Eval(context.Background(), `if redis.call("GET", KEYS[1]) == ARGV[1] then return redis.call("DEL", KEYS[1]) end return 0`, []string{"rw-history"}, raw).Int()
		return n == 1 && err == nil
	}, 300*time.Millisecond)
	// Holders of ours that die: taken, never renewed nor released.
	wg.Add(1)
	go func() {
		defer wg.Done()
		for i := shares + exclusive + 2; ctx.Err() == nil; i++ {
			o := append([]Option{WithExpiry(300 * time.Millisecond), WithoutWatchdog()}, opts...)
			if i%2 == 0 {
				o = append(o, WithShared())
			}
			dead := NewRedisLock(FromGoRedis(admin), "rw-history", o...)
			call := now()
			if dead.AcquireWait(ctx) == nil {
				ret := now()
				record(holdOp{i, i%2 == 0, true, call, ret})
				record(holdOp{i, i%2 == 0, false, ret, time.Now().Add(300 * time.Millisecond).UnixNano()})
			}
			select {
			case <-ctx.Done():
			case <-time.After(time.Second):
			}
		}
	}()
	wg.Add(1)
	go func() {
		defer wg.Done()
		for ctx.Err() == nil && (time.Since(start) < 4*time.Second || sections[0].Load() < 30 || sections[1].Load() < 10) {
			time.Sleep(50 * time.Millisecond)
		}
		cancel()
	}()
	serverFaults(ctx, admin)
	wg.Wait()
	elapsed := time.Since(start)
	t.Logf("%d shared and %d exclusive sections in %v", sections[0].Load(), sections[1].Load(), elapsed.Round(time.Millisecond))
	if sections[0].Load() < 30 || sections[1].Load() < 10 {
		t.Fatal("too few sections of a kind to test anything")
	}
	var violations int64
	if r := checkHolders(0, ops); r != porcupine.Ok {
		violations = 1
		t.Errorf("%d operations: %v against a shared lock", len(ops), r)
	}
	recordFault(t, faultRow{
		Case:      name + ": holders die, scripts flushed, connections killed, writes paused",
		Injection: "5 shared and 2 exclusive workers (own clients), go-zero's RedisLock polling every 10 ms and a raw SET NX every 1 ms, for 4 s (up to 12 s until 30 shared and 10 exclusive sections); about every 1.3 s a holder that never renews nor releases (lease 300 ms, shared and exclusive in turn); SCRIPT FLUSH, CLIENT KILL and CLIENT PAUSE WRITE 100 ms in turn every 150 ms",
		Promise:   "no share beside an exclusive holder, no two exclusive holders: porcupine finds a shared lock that explains every take and give-back (an unanswered release counted until its lease's end)",
		Runs:      sections[0].Load() + sections[1].Load(), Faults: int64(elapsed / (150 * time.Millisecond)), Violations: violations,
	})
}

// TestFairSharesHandedWithoutPubSub: without pub/sub, the waiters for a
// share of the releasing Locker learn of their handoffs long before their
// next attempt (a third of their 30 s lease): the release's reply tells
// them (a message each), and a waiter handed a share lets the next of its
// Locker attempt at once.
func TestFairSharesHandedWithoutPubSub(t *testing.T) {
	onServers(t, func(t *testing.T, c, admin *redis.Client) {
		ctx := context.Background()
		l := NewLocker(FromGoRedis(c), WithPubSub(nil), WithFairness(), WithExpiry(30*time.Second))
		defer l.Close()
		x, shares := l.NewLock("quiet"), []*RedisLock{l.NewLock("quiet", WithShared()), l.NewLock("quiet", WithShared())}
		mustAcquire(t, x)
		got := make(chan error, len(shares))
		for i, rl := range shares {
			go func() { got <- rl.AcquireWait(ctx) }()
			waitQueued(t, admin, "quiet", int64(i+1))
		}
		mustRelease(t, x)
		for range shares {
			select {
			case err := <-got:
				must(t, err)
			case <-time.After(5 * time.Second):
				t.Fatal("a waiter for a share did not hear of its handoff")
			}
		}
		mustRelease(t, shares[0])
		mustRelease(t, shares[1])
	})
}

// TestFairShareGoesInWhenTheWriterAheadGivesUp: a fair share queued behind
// a fair exclusive waiter gets in as soon as that waiter gives up, not at
// its next timed attempt (a third of its 30 s lease). Found by the
// black-box review of fair shared locks: nothing woke it.
func TestFairShareGoesInWhenTheWriterAheadGivesUp(t *testing.T) {
	onServers(t, func(t *testing.T, c, admin *redis.Client) {
		ctx := context.Background()
		addr := c.Options().Addr
		lock := func(opts ...Option) *RedisLock {
			return NewRedisLock(FromGoRedis(newClient(t, addr)), "giveup-rw", append(opts, WithFairness(), WithExpiry(30*time.Second))...)
		}
		held, writer, reader := lock(WithShared()), lock(WithWaitTimeout(time.Hour)), lock(WithShared())
		mustAcquire(t, held)
		wctx, cancel := context.WithCancel(ctx)
		wrote := make(chan error, 1)
		go func() { wrote <- writer.AcquireWait(wctx) }()
		waitQueued(t, admin, "giveup-rw", 1)
		got := make(chan error, 1)
		go func() { got <- reader.AcquireWait(ctx) }()
		waitQueued(t, admin, "giveup-rw", 2)
		cancel()
		if err := <-wrote; !errors.Is(err, ErrNotAcquired) {
			t.Fatalf("the writer's wait: %v", err)
		}
		select {
		case err := <-got:
			must(t, err)
		case <-time.After(5 * time.Second):
			t.Fatal("the share was not let in when the writer ahead of it gave up")
		}
		mustRelease(t, reader)
		mustRelease(t, held)
	})
}
