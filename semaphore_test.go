package redislock

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

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
			{[]Option{WithPermits(2), WithFairness()}, errors.ErrUnsupported},
			{[]Option{WithShared(), WithFencing()}, errors.ErrUnsupported},
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
	z := goZeroStore(srv.Addr)
	theirs := NewRedisLock(z, "cfg") // go-zero's store, exclusive
	ours := NewRedisLock(FromGoRedis(srv.Client(t)), "cfg", WithShared())
	mustAcquire(t, ours)
	if ok, err := theirs.Acquire(); ok || err != nil {
		t.Fatalf("exclusive through go-zero under a share: %v, %v", ok, err)
	}
	zl := zredis.NewRedisLock(z, "cfg")
	// go-zero's script GETs the key first: a share's sorted set makes it
	// fail with WRONGTYPE, and it takes nothing.
	if ok, err := zl.Acquire(); ok || err == nil || !strings.Contains(err.Error(), "WRONGTYPE") {
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
func TestSharedWriterGetsInUnderReaders(t *testing.T) {
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
	w := NewRedisLock(FromGoRedis(srv.Client(t)), "catalogue", WithExpiry(time.Second))
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
	if overlap.Load() {
		t.Fatal("a share began while the writer held the key")
	}
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
		if err != nil || st.Owner != b.Owner() {
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
