package redislock

import (
	"context"
	"fmt"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/redislock/redislock/internal/redisserver"
	"github.com/redislock/redislock/internal/store"
)

// Benchmarks against a real redis-server that they start. Each pair runs our
// lock and, as the baseline, the same round trips done with raw go-redis
// EVALSHA of the classic scripts, on the same server and client.

var (
	rawAcquire = redis.NewScript(`return redis.call("SET", KEYS[1], ARGV[1], "NX", "PX", ARGV[2])`)
	rawRelease = redis.NewScript(`if redis.call("GET", KEYS[1]) == ARGV[1] then return redis.call("DEL", KEYS[1]) end return 0`)
	rawExtend  = redis.NewScript(`if redis.call("GET", KEYS[1]) == ARGV[1] then return redis.call("PEXPIRE", KEYS[1], ARGV[2]) end return 0`)
)

func benchClient(b *testing.B) *redis.Client {
	srv := redisserver.Start(b)
	c := redis.NewClient(&redis.Options{Addr: srv.Addr, PoolSize: 64})
	b.Cleanup(func() { _ = c.Close() })
	ctx := context.Background()
	for _, s := range []*redis.Script{rawAcquire, rawRelease, rawExtend, acquireScript, extendScript, releaseScript, store.PermitAcquire.Script} {
		if err := s.Load(ctx, c).Err(); err != nil {
			b.Fatal(err)
		}
	}
	return c
}

// rawPair is one acquire+release with raw go-redis EVALSHA.
func rawPair(ctx context.Context, c *redis.Client, keys []string, id string) error {
	if err := c.EvalSha(ctx, rawAcquire.Hash(), keys, id, 10000).Err(); err != nil {
		return err
	}
	return c.EvalSha(ctx, rawRelease.Hash(), keys, id).Err()
}

func BenchmarkAcquireRelease(b *testing.B) {
	c := benchClient(b)
	ctx := context.Background()
	b.Run("impl=raw-evalsha", func(b *testing.B) {
		b.ReportAllocs()
		keys := []string{"bench:raw"}
		for i := 0; i < b.N; i++ {
			if err := rawPair(ctx, c, keys, "fixed-owner-id-0123456789"); err != nil {
				b.Fatal(err)
			}
		}
	})
	// A plain lock, a permit of a semaphore with another holder (so that
	// the key stays), and a share beside another (issue 28: within 1.10×
	// a plain lock's pair).
	for _, kind := range []struct {
		name string
		opts []Option
	}{{"redislock", nil}, {"redislock-semaphore", []Option{WithPermits(8)}}, {"redislock-shared", []Option{WithShared()}}} {
		b.Run("impl="+kind.name, func(b *testing.B) {
			b.ReportAllocs()
			if kind.opts != nil {
				other := NewRedisLock(FromGoRedis(c), "bench:"+kind.name, kind.opts...)
				if ok, err := other.AcquireCtx(ctx); !ok || err != nil {
					b.Fatal(ok, err)
				}
				defer other.ReleaseCtx(ctx)
			}
			rl := NewRedisLock(FromGoRedis(c), "bench:"+kind.name, kind.opts...)
			for i := 0; i < b.N; i++ {
				if ok, err := rl.AcquireCtx(ctx); !ok || err != nil {
					b.Fatal(ok, err)
				}
				if ok, err := rl.ReleaseCtx(ctx); !ok || err != nil {
					b.Fatal(ok, err)
				}
			}
		})
	}
	// Our client code alone: a new RedisLock per pair, on a store that
	// answers at once.
	b.Run("impl=redislock-no-network", func(b *testing.B) {
		b.ReportAllocs()
		for i := 0; i < b.N; i++ {
			rl := NewRedisLock(instantStore{}, "bench:ours")
			if ok, err := rl.AcquireCtx(ctx); !ok || err != nil {
				b.Fatal(ok, err)
			}
			if ok, err := rl.ReleaseCtx(ctx); !ok || err != nil {
				b.Fatal(ok, err)
			}
		}
	})
}

// BenchmarkPermitPairs interleaves, pair by pair, a plain lock's
// acquire+release, a semaphore permit's (another holder holds one of its 8
// permits) and a shared lock's (beside another share), so that the
// loopback's drift hits all alike, and reports each kind's time over the
// plain lock's (issue 28: at most 1.10).
func BenchmarkPermitPairs(b *testing.B) {
	c := benchClient(b)
	ctx := context.Background()
	kinds := [][]Option{nil, {WithPermits(8)}, {WithShared()}}
	locks := make([]*RedisLock, len(kinds))
	for i, opts := range kinds {
		key := fmt.Sprintf("bench:pairs:%d", i)
		if opts != nil {
			other := NewRedisLock(FromGoRedis(c), key, opts...)
			if ok, err := other.AcquireCtx(ctx); !ok || err != nil {
				b.Fatal(ok, err)
			}
			defer other.ReleaseCtx(ctx)
		}
		locks[i] = NewRedisLock(FromGoRedis(c), key, opts...)
	}
	spent := make([]time.Duration, len(kinds))
	b.ResetTimer()
	for n := 0; n < b.N; n++ {
		timePairs(b, locks, spent)
	}
	b.ReportMetric(float64(spent[1])/float64(spent[0]), "semaphore/lock")
	b.ReportMetric(float64(spent[2])/float64(spent[0]), "shared/lock")
	b.ReportMetric(micros(spent[0])/float64(b.N), "lock-µs/pair")
}

// pairOnce makes one acquire+release pair of rl, and reports whether both
// succeeded (a failure is b's error).
func pairOnce(b *testing.B, ctx context.Context, rl *RedisLock) bool {
	if ok, err := rl.AcquireCtx(ctx); !ok || err != nil {
		b.Error(ok, err)
		return false
	}
	if ok, err := rl.ReleaseCtx(ctx); !ok || err != nil {
		b.Error(ok, err)
		return false
	}
	return true
}

// timePairs makes one acquire+release pair of each lock, adding its time
// to spent's.
func timePairs(b *testing.B, locks []*RedisLock, spent []time.Duration) {
	ctx := context.Background()
	for i, rl := range locks {
		t0 := time.Now()
		if ok, err := rl.AcquireCtx(ctx); !ok || err != nil {
			b.Fatal(ok, err)
		}
		if ok, err := rl.ReleaseCtx(ctx); !ok || err != nil {
			b.Fatal(ok, err)
		}
		spent[i] += time.Since(t0)
	}
}

// instantStore answers acquire.lua and release.lua at once, as a free lock
// would.
type instantStore struct{}

func (instantStore) ScriptRunCtx(_ context.Context, script *redis.Script, _ []string, _ ...any) (any, error) {
	if script == acquireScript {
		return "OK", nil
	}
	return int64(1), nil
}

func BenchmarkAcquireReleaseParallel(b *testing.B) {
	c := benchClient(b)
	ctx := context.Background()
	var n atomic.Int64
	b.Run("impl=raw-evalsha", func(b *testing.B) {
		b.ReportAllocs()
		b.SetParallelism(8)
		b.RunParallel(func(pb *testing.PB) {
			keys := []string{"bench:raw:" + strconv.FormatInt(n.Add(1), 10)}
			for pb.Next() {
				if err := rawPair(ctx, c, keys, "fixed-owner-id-0123456789"); err != nil {
					b.Error(err)
					return
				}
			}
		})
	})
	b.Run("impl=redislock", func(b *testing.B) {
		b.ReportAllocs()
		b.SetParallelism(8)
		b.RunParallel(func(pb *testing.PB) {
			rl := NewRedisLock(FromGoRedis(c), "bench:ours:"+strconv.FormatInt(n.Add(1), 10))
			for pb.Next() {
				if !pairOnce(b, ctx, rl) {
					return
				}
			}
		})
	})
}

// BenchmarkInterleaved times a raw acquire+release pair and a redislock
// one back to back in every iteration, so that the drift of loopback round
// trips on a shared machine hits both alike; it reports each one's time per
// pair and ours/raw as ratio (targets: 1.03 serial, 1.05 parallel). Each
// pair makes a new RedisLock, as go-zero code does. scripts times our two
// scripts sent with raw go-redis instead, the server's share of the
// difference. parallel runs 16 goroutines, each with its own key.
func BenchmarkInterleaved(b *testing.B) {
	c := benchClient(b)
	ctx := context.Background()
	var n atomic.Int64
	pair := func(b *testing.B, keys []string, key string, rawNs, oursNs *atomic.Int64) bool {
		t0 := time.Now()
		if err := rawPair(ctx, c, keys, "fixed-owner-id-0123456789"); err != nil {
			b.Error(err)
			return false
		}
		t1 := time.Now()
		if !pairOnce(b, ctx, NewRedisLock(FromGoRedis(c), key)) {
			return false
		}
		rawNs.Add(int64(t1.Sub(t0)))
		oursNs.Add(int64(time.Since(t1)))
		return true
	}
	report := func(b *testing.B, rawNs, oursNs *atomic.Int64) {
		b.ReportMetric(float64(rawNs.Load())/float64(b.N), "raw-ns/pair")
		b.ReportMetric(float64(oursNs.Load())/float64(b.N), "redislock-ns/pair")
		b.ReportMetric(float64(oursNs.Load())/float64(rawNs.Load()), "ratio")
	}
	b.Run("serial", func(b *testing.B) {
		var rawNs, oursNs atomic.Int64
		keys := []string{"bench:i:raw"}
		for i := 0; i < b.N; i++ {
			if !pair(b, keys, "bench:i:ours", &rawNs, &oursNs) {
				return
			}
		}
		report(b, &rawNs, &oursNs)
	})
	// Our two scripts alone, sent with raw go-redis as the baseline is:
	// what the server's extra work (the release marker, the check of
	// given-up attempts, the PUBLISH) costs, without our client code.
	b.Run("scripts", func(b *testing.B) {
		var rawNs, scriptsNs time.Duration
		keys := []string{"bench:i:raw"}
		acquireKeys := []string{"bench:i:s", relatedName("bench:i:s", "abandoned"), relatedName("bench:i:s", "holders")}
		releaseKeys := []string{"bench:i:s", relatedName("bench:i:s", "releases"), relatedName("bench:i:s", "holders")}
		channel := relatedName("bench:i:s", "released")
		for i := 0; i < b.N; i++ {
			t0 := time.Now()
			if err := rawPair(ctx, c, keys, "fixed-owner-id-0123456789"); err != nil {
				b.Fatal(err)
			}
			t1 := time.Now()
			id := newID()
			if err := c.EvalSha(ctx, acquireScript.Hash(), acquireKeys, id, DefaultExpiry.Milliseconds()).Err(); err != nil {
				b.Fatal(err)
			}
			if n, err := c.EvalSha(ctx, releaseScript.Hash(), releaseKeys, id, channel).Int64(); n != 1 || err != nil {
				b.Fatal(n, err)
			}
			rawNs, scriptsNs = rawNs+t1.Sub(t0), scriptsNs+time.Since(t1)
		}
		b.ReportMetric(float64(scriptsNs)/float64(rawNs), "ratio")
	})
	b.Run("parallel", func(b *testing.B) {
		var rawNs, oursNs atomic.Int64
		b.SetParallelism(8)
		b.RunParallel(func(pb *testing.PB) {
			i := strconv.FormatInt(n.Add(1), 10)
			keys := []string{"bench:i:raw:" + i}
			key := "bench:i:ours:" + i
			for pb.Next() {
				if !pair(b, keys, key, &rawNs, &oursNs) {
					return
				}
			}
		})
		report(b, &rawNs, &oursNs)
	})
}

// BenchmarkReentry is one nested acquire+release on a held lock: one round
// trip (ownership check and lease refresh), against one raw EVALSHA.
func BenchmarkReentry(b *testing.B) {
	c := benchClient(b)
	ctx := context.Background()
	b.Run("impl=raw-evalsha", func(b *testing.B) {
		b.ReportAllocs()
		keys := []string{"bench:raw-reentry"}
		if err := c.Set(ctx, keys[0], "owner", time.Minute).Err(); err != nil {
			b.Fatal(err)
		}
		for i := 0; i < b.N; i++ {
			if err := c.EvalSha(ctx, rawExtend.Hash(), keys, "owner", 60000).Err(); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("impl=redislock", func(b *testing.B) {
		b.ReportAllocs()
		rl := NewRedisLock(FromGoRedis(c), "bench:reentry", WithExpiry(time.Minute))
		if ok, err := rl.Acquire(); !ok || err != nil {
			b.Fatal(ok, err)
		}
		defer rl.Release()
		b.ResetTimer()
		for i := 0; i < b.N; i++ {
			if ok, err := rl.AcquireCtx(ctx); !ok || err != nil {
				b.Fatal(ok, err)
			}
			if ok, err := rl.ReleaseCtx(ctx); !ok || err != nil {
				b.Fatal(ok, err)
			}
		}
	})
}

// BenchmarkHeldLocks holds 1,000 locks with the watchdog running for four
// renewal intervals and reports what that costs: Redis commands per renewal
// interval, goroutines, heap and stack bytes per held lock. The watchdog
// runs on timers, so a held lock should cost no goroutine between renewals.
// BenchmarkHeldLocks holds 10,000 locks with a 3 s lease (renewed every
// second) and measures, over four renewal intervals: renewals and round
// trips (pipelines) per interval, the client's CPU per lock per second, the
// server's CPU per renewal, and goroutines and heap per held lock.
//
// kind=lock holds 10,000 locks; kind=permit 10,000 permits of 100
// semaphores of 100 permits each (issue 28: within 1.20× the locks'
// client CPU).
func BenchmarkHeldLocks(b *testing.B) {
	c := benchClient(b)
	warmPool(b, c)
	b.Run("kind=lock", func(b *testing.B) { heldLocks(b, c, "held:%d", 0) })
	b.Run("kind=permit", func(b *testing.B) { heldLocks(b, c, "held:permit:%d", 100) })
}

// heldLocks is BenchmarkHeldLocks, of locks on the keys key%d, or of
// permits of semaphores of permits each, 10,000 holders in all.
func heldLocks(b *testing.B, c *redis.Client, key string, permits int) {
	const locks = 10000
	const lease = 3 * time.Second
	interval := lease / 3
	hook := &pipelineCounter{}
	c.AddHook(hook)
	opts := []Option{WithExpiry(lease)}
	if permits > 0 {
		opts = append(opts, WithPermits(permits))
	}
	for i := 0; i < b.N; i++ {
		runtime.GC()
		var before runtime.MemStats
		runtime.ReadMemStats(&before)
		g0 := runtime.NumGoroutine()

		held := make([]*RedisLock, locks)
		for j := range held {
			n := j
			if permits > 0 {
				n = j % (locks / permits)
			}
			held[j] = NewRedisLock(FromGoRedis(c), fmt.Sprintf(key, n), opts...)
			if ok, err := held[j].Acquire(); !ok || err != nil {
				b.Fatal(ok, err)
			}
		}

		// After one renewal interval every hold has been renewed; measure
		// memory then, and the work of the next four intervals.
		time.Sleep(interval + interval/2)
		runtime.GC()
		var after runtime.MemStats
		runtime.ReadMemStats(&after)
		g2 := runtime.NumGoroutine()
		// A lock's renewal is one PEXPIRE on the server, a holder's one
		// ZADD (and a PEXPIRE of each of its two keys).
		renewal := "pexpire"
		if permits > 0 {
			renewal = "zadd"
		}
		c0, p0, srv0, cpu0 := commandCalls(b, c, renewal), hook.pipelines.Load(), serverCPU(b, c), processCPU()
		time.Sleep(4 * interval)
		c1, p1, srv1, cpu1 := commandCalls(b, c, renewal), hook.pipelines.Load(), serverCPU(b, c), processCPU()

		for _, rl := range held {
			if isClosed(rl.Done()) {
				b.Fatalf("%s lost: %v", rl.Key(), rl.Err())
			}
			if ok, err := rl.Release(); !ok || err != nil {
				b.Fatal(ok, err)
			}
		}
		renewals := float64(c1 - c0)
		seconds := (4 * interval).Seconds()
		b.ReportMetric(renewals/4, "renewals/interval")
		b.ReportMetric(float64(p1-p0)/4, "roundtrips/interval")
		b.ReportMetric(float64(cpu1-cpu0)/float64(time.Microsecond)/locks/seconds, "client-µs/lock/s")
		b.ReportMetric((srv1-srv0)*1e6/renewals, "server-µs/renewal")
		b.ReportMetric(float64(g2-g0)/locks, "goroutines/lock")
		b.ReportMetric(float64(int64(after.HeapAlloc)-int64(before.HeapAlloc))/locks, "heapB/lock")
	}
}

// processCPU is the CPU time (user and system) this process has used.
func processCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// serverCPU is the CPU seconds (user and system) the server has used, from
// INFO cpu.
func serverCPU(b *testing.B, c *redis.Client) float64 {
	info, err := c.Info(context.Background(), "cpu").Result()
	if err != nil {
		b.Fatal(err)
	}
	var total float64
	for _, line := range strings.Split(info, "\r\n") {
		for _, field := range []string{"used_cpu_sys:", "used_cpu_user:"} {
			if v, ok := strings.CutPrefix(line, field); ok {
				f, err := strconv.ParseFloat(v, 64)
				if err != nil {
					b.Fatal(err)
				}
				total += f
			}
		}
	}
	return total
}

// warmPool grows the client's connection pool to its full size, so that the
// memory of its connections is not counted as the locks'.
func warmPool(b *testing.B, c *redis.Client) {
	var wg sync.WaitGroup
	for g := 0; g < 2*c.Options().PoolSize; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for j := 0; j < 20; j++ {
				if err := c.Do(context.Background(), "DEBUG", "SLEEP", "0").Err(); err != nil {
					b.Error(err)
					return
				}
			}
		}()
	}
	wg.Wait()
}

// commandCalls reads how many times the server ran cmd, from INFO
// commandstats (a line such as cmdstat_evalsha:calls=12,usec=...).
func commandCalls(b testing.TB, c *redis.Client, cmd string) int64 {
	info, err := c.Info(context.Background(), "commandstats").Result()
	if err != nil {
		b.Fatal(err)
	}
	for _, line := range strings.Split(info, "\r\n") {
		if v, ok := strings.CutPrefix(line, "cmdstat_"+cmd+":calls="); ok {
			v, _, _ = strings.Cut(v, ",")
			n, err := strconv.ParseInt(v, 10, 64)
			if err != nil {
				b.Fatal(err)
			}
			return n
		}
	}
	return 0
}

// BenchmarkContention runs waiters goroutines, each with its own RedisLock,
// contending for one key until b.N acquisitions, holding it for hold each
// time. mode is how they wait: wakeup (AcquireWait with pub/sub), retry
// (AcquireWait with DefaultRetry alone), poll1ms (AcquireCtx every 1ms,
// as go-zero users loop), fair-retry (retry with WithFairness), or
// fair-permits (fair-retry of a semaphore of 2 permits: issue 28's
// handoff of a freed permit). It reports acquisitions per second, the
// release call's p50, the handoff
// from one holder's Release call to the next different holder's
// acquisition, EVALSHA+EVAL calls per acquisition (releases included), and
// the wait of each acquisition (its spread shows the turn taking).
func BenchmarkContention(b *testing.B) {
	c := benchClient(b)
	for _, waiters := range []int{8, 32} {
		for _, hold := range []time.Duration{0, time.Millisecond} {
			for _, mode := range []string{"wakeup", "retry", "poll1ms", "fair-retry", "fair-permits"} {
				b.Run(fmt.Sprintf("waiters=%d/hold=%v/mode=%s", waiters, hold, mode), func(b *testing.B) {
					benchContention(b, c, waiters, hold, mode)
				})
			}
		}
	}
}

var contentionKeys atomic.Int64

func benchContention(b *testing.B, c *redis.Client, waiters int, hold time.Duration, mode string) {
	key := fmt.Sprintf("bench:contended:%d", contentionKeys.Add(1))
	var opts []Option
	if mode != "wakeup" {
		opts = append(opts, WithPubSub(nil))
	}
	if strings.HasPrefix(mode, "fair-") {
		opts = append(opts, WithFairness())
	}
	if mode == "fair-permits" {
		opts = append(opts, WithPermits(2))
	}
	var (
		remaining                atomic.Int64
		lastHolder, lastRelease  atomic.Int64
		mu                       sync.Mutex
		handoffs, waits, holding []time.Duration
		releases                 []time.Duration
		wg                       sync.WaitGroup
	)
	remaining.Store(int64(b.N))
	calls0 := commandCalls(b, c, "evalsha") + commandCalls(b, c, "eval")
	b.ResetTimer()
	start := time.Now()
	for g := 1; g <= waiters; g++ {
		rl := NewRedisLock(FromGoRedis(c), key, opts...)
		wg.Add(1)
		go func() {
			defer wg.Done()
			ctx := context.Background()
			for remaining.Add(-1) >= 0 {
				t0 := time.Now()
				if mode == "poll1ms" {
					for {
						ok, err := rl.AcquireCtx(ctx)
						if err != nil {
							b.Error(err)
							return
						}
						if ok {
							break
						}
						time.Sleep(time.Millisecond)
					}
				} else if err := rl.AcquireWait(ctx); err != nil {
					b.Error(err)
					return
				}
				got := time.Now()
				var handoff time.Duration = -1
				if prev := lastHolder.Load(); prev != 0 && prev != int64(g) {
					handoff = got.Sub(time.Unix(0, lastRelease.Load()))
				}
				holdFor(hold)
				held := time.Since(got)
				lastHolder.Store(int64(g))
				released := time.Now()
				lastRelease.Store(released.UnixNano())
				if ok, err := rl.Release(); !ok || err != nil {
					b.Error(ok, err)
					return
				}
				mu.Lock()
				releases = append(releases, time.Since(released))
				waits, holding = append(waits, got.Sub(t0)), append(holding, held)
				if handoff >= 0 {
					handoffs = append(handoffs, handoff)
				}
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	elapsed := time.Since(start)
	b.StopTimer()
	calls := commandCalls(b, c, "evalsha") + commandCalls(b, c, "eval") - calls0
	b.ReportMetric(float64(b.N)/elapsed.Seconds(), "acq/s")
	b.ReportMetric(float64(calls)/float64(b.N), "scripts/acq")
	b.ReportMetric(micros(percentile(handoffs, 50)), "handoff-p50-µs")
	b.ReportMetric(micros(percentile(releases, 50)), "release-p50-µs")
	b.ReportMetric(micros(percentile(handoffs, 99)), "handoff-p99-µs")
	b.ReportMetric(micros(percentile(waits, 50))/1000, "wait-p50-ms")
	b.ReportMetric(micros(percentile(waits, 99))/1000, "wait-p99-ms")
	if hold > 0 {
		b.ReportMetric(micros(percentile(holding, 50)), "hold-p50-µs")
	}
}

// holdFor holds for d, yielding the processor meanwhile. time.Sleep alone
// overshoots a 1ms hold by about 10%, which would count against the lock.
func holdFor(d time.Duration) {
	end := time.Now().Add(d)
	if d > 2*time.Millisecond { // sleeps are rounded up to whole milliseconds here
		time.Sleep(d - 1500*time.Microsecond)
	}
	for time.Now().Before(end) {
		runtime.Gosched()
	}
}

func micros(d time.Duration) float64 { return float64(d) / float64(time.Microsecond) }

// percentile returns the p-th percentile of ds (which it sorts).
func percentile(ds []time.Duration, p int) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	slices.Sort(ds)
	return ds[min(len(ds)-1, len(ds)*p/100)]
}

// BenchmarkScheduler measures the renewal scheduler alone, without a
// network: 10,000 holds of a 3 s lease, taken in ten groups a tenth of a
// second apart, on a fake clock, through a pipeline that answers every
// renewal at once. An op is one run of the scheduler (about 2,000
// renewals); it reports the process's CPU per renewal.
func BenchmarkScheduler(b *testing.B) {
	const locks = 10000
	const lease = 3 * time.Second
	clk := newFakeClock()
	l := newLocker(acquiredStore{}, clk, nil, false, nil)
	var renewed atomic.Int64
	l.store.SetPipeline(func(ctx context.Context, fn func(redis.Pipeliner) error) error {
		return fn(renewingPipe{renewed: &renewed})
	})
	for j := 0; j < locks; j++ {
		if ok, err := l.NewLock(fmt.Sprint("held:", j), WithExpiry(lease)).Acquire(); !ok || err != nil {
			b.Fatal(ok, err)
		}
		if j%1000 == 999 {
			clk.Advance(lease / 30)
		}
	}
	b.ReportAllocs()
	b.ResetTimer()
	n0, cpu0 := renewed.Load(), processCPU()
	for i := 0; i < b.N; i++ {
		clk.Step(b)
	}
	b.StopTimer()
	b.ReportMetric(float64(processCPU()-cpu0)/float64(renewed.Load()-n0), "cpu-ns/renewal")
	b.ReportMetric(float64(renewed.Load()-n0)/float64(b.N), "renewals/op")
	if err := l.Close(); err != nil {
		b.Fatal(err)
	}
}

// acquiredStore takes every lock and releases it.
type acquiredStore struct{}

func (acquiredStore) ScriptRunCtx(_ context.Context, script *redis.Script, _ []string, _ ...any) (any, error) {
	if script == acquireScript {
		return "OK", nil
	}
	return int64(1), nil
}

// renewingPipe answers the calls of a pipeline: each key renewed, each
// release done.
type renewingPipe struct {
	redis.Pipeliner
	renewed *atomic.Int64
}

func (p renewingPipe) EvalSha(ctx context.Context, sha string, keys []string, _ ...any) *redis.Cmd {
	cmd := redis.NewCmd(ctx)
	if sha != extendScript.Hash() {
		cmd.SetVal(int64(1))
		return cmd
	}
	p.renewed.Add(int64(len(keys)))
	codes := make([]any, len(keys))
	for i := range codes {
		codes[i] = int64(1)
	}
	cmd.SetVal(codes)
	return cmd
}

// BenchmarkSaturated: 32 goroutines saturate the machine with
// acquire+release pairs, each on its own key, in alternating phases (all
// raw go-redis EVALSHA pairs, then all ours, four times). It reports our
// time per pair over raw, and redis-server's CPU per pair (INFO cpu) for
// each and their ratio. b.N is the number of pairs of each kind.
func BenchmarkSaturated(b *testing.B) {
	c := benchClient(b)
	ctx := context.Background()
	const workers, rounds = 32, 4
	warmPool(b, c)
	locks := make([]*RedisLock, workers)
	for i := range locks {
		locks[i] = NewRedisLock(FromGoRedis(c), fmt.Sprint("bench:sat:ours:", i))
	}
	per := max(b.N/(workers*rounds), 1) // pairs of each goroutine in each phase
	phase := func(ours bool) (time.Duration, float64) {
		cpu0, t0 := serverCPU(b, c), time.Now()
		var wg sync.WaitGroup
		for w := range workers {
			wg.Add(1)
			go func() {
				defer wg.Done()
				keys := []string{fmt.Sprint("bench:sat:raw:", w)}
				for range per {
					if !ours {
						if err := rawPair(ctx, c, keys, "fixed-owner-id-0123456789"); err != nil {
							b.Error(err)
							return
						}
						continue
					}
					if !pairOnce(b, ctx, locks[w]) {
						return
					}
				}
			}()
		}
		wg.Wait()
		return time.Since(t0), serverCPU(b, c) - cpu0
	}
	b.ResetTimer()
	var rawT, oursT time.Duration
	var rawCPU, oursCPU float64
	for range rounds {
		t, cpu := phase(false)
		rawT, rawCPU = rawT+t, rawCPU+cpu
		t, cpu = phase(true)
		oursT, oursCPU = oursT+t, oursCPU+cpu
	}
	pairs := float64(rounds * workers * per)
	b.ReportMetric(float64(oursT)/float64(rawT), "ratio")
	b.ReportMetric(oursCPU/rawCPU, "server-ratio")
	b.ReportMetric(rawCPU*1e6/pairs, "raw-server-µs/pair")
	b.ReportMetric(oursCPU*1e6/pairs, "redislock-server-µs/pair")
	b.ReportMetric(float64(rawT)/pairs/1e3, "raw-µs/pair")
}

// BenchmarkReplicasPair: an acquire+release pair of a lock made
// WithReplicas(1), whose acquisition waits for its primary's one replica
// on loopback, interleaved pair by pair with a lock's without, on one
// client: the ratio of their times; and, as the floor of that ratio, raw
// go-redis pairs (SET NX PX, DEL) with and without a WAIT 1 pipelined
// after the SET.
func BenchmarkReplicasPair(b *testing.B) {
	primary := redisserver.Start(b)
	redisserver.Start(b, "--replicaof", "127.0.0.1", strconv.Itoa(primary.Port))
	primary.WaitReplicas(b, 1)
	ctx := context.Background()
	c := redis.NewClient(&redis.Options{Addr: primary.Addr, PoolSize: 64})
	b.Cleanup(func() { _ = c.Close() })
	locks := []*RedisLock{NewRedisLock(FromGoRedis(c), "bench:replicas:0"), NewRedisLock(FromGoRedis(c), "bench:replicas:1", WithReplicas(1))}
	spent := make([]time.Duration, len(locks))
	for _, rl := range locks { // scripts loaded, replicas known online
		if ok, err := rl.AcquireCtx(ctx); !ok || err != nil {
			b.Fatal(ok, err)
		}
		rl.ReleaseCtx(ctx)
	}
	var raw [2]time.Duration
	rawPair := func(wait bool) error {
		_, err := c.Pipelined(ctx, func(p redis.Pipeliner) error {
			p.SetNX(ctx, "bench:replicas:raw", "id", 10*time.Second)
			if wait {
				p.Do(ctx, "WAIT", 1, 1000)
			}
			return nil
		})
		if err == nil {
			err = c.Del(ctx, "bench:replicas:raw").Err()
		}
		return err
	}
	b.ResetTimer()
	for n := 0; n < b.N; n++ {
		timePairs(b, locks, spent)
		for i, wait := range []bool{false, true} {
			t0 := time.Now()
			if err := rawPair(wait); err != nil {
				b.Fatal(err)
			}
			raw[i] += time.Since(t0)
		}
	}
	b.ReportMetric(float64(spent[1])/float64(spent[0]), "replicas/plain")
	b.ReportMetric(float64(raw[1])/float64(raw[0]), "raw-wait/raw")
	b.ReportMetric(micros(spent[0])/float64(b.N), "plain-µs/pair")
	b.ReportMetric(micros(spent[1])/float64(b.N), "replicas-µs/pair")
}

// BenchmarkElection measures an election's two latencies on a real server:
// from a leader's Resign to the Campaign of the candidate waiting behind
// it returning (each op: one handover), beside Resign's own round trip;
// and, in "observe", from a Proclaim's reply to each of 100 observers on
// another client receiving the value, in round trips (PING's p50).
func BenchmarkElection(b *testing.B) {
	c := benchClient(b)
	ctx := context.Background()
	b.Run("handover", func(b *testing.B) {
		key := fmt.Sprintf("bench:election:%d", contentionKeys.Add(1))
		var es [2]*Election
		for i := range es { // a client each, as two processes would have
			ci := redis.NewClient(&redis.Options{Addr: c.Options().Addr})
			b.Cleanup(func() { _ = ci.Close() })
			es[i] = NewElection(FromGoRedis(ci), key)
		}
		if err := es[0].Campaign(ctx, "0"); err != nil {
			b.Fatal(err)
		}
		var handovers, resigns, after []time.Duration
		b.ResetTimer()
		for n := 0; n < b.N; n++ {
			leader, next := es[n%2], es[(n+1)%2]
			elected := make(chan time.Time, 1)
			go func() {
				if err := next.Campaign(ctx, "x"); err != nil {
					b.Error(err)
				}
				elected <- time.Now()
			}()
			for c.ZCard(ctx, next.rl.names.queue).Val() == 0 { // queued behind the leader
				time.Sleep(50 * time.Microsecond)
			}
			t0 := time.Now()
			if err := leader.Resign(ctx); err != nil {
				b.Fatal(err)
			}
			resigned := time.Since(t0)
			handover := (<-elected).Sub(t0)
			handovers, resigns, after = append(handovers, handover), append(resigns, resigned), append(after, handover-resigned)
		}
		b.StopTimer()
		_ = es[b.N%2].Resign(ctx)
		b.ReportMetric(micros(percentile(handovers, 50)), "p50-handover-µs")
		b.ReportMetric(micros(percentile(resigns, 50)), "p50-resign-µs")
		b.ReportMetric(micros(percentile(after, 50)), "p50-after-resign-µs")
	})
	b.Run("observe", func(b *testing.B) {
		key := fmt.Sprintf("bench:election:%d", contentionKeys.Add(1))
		leader := NewElection(FromGoRedis(c), key)
		if err := leader.Campaign(ctx, "v0"); err != nil {
			b.Fatal(err)
		}
		defer leader.Resign(ctx)
		oc := redis.NewClient(&redis.Options{Addr: c.Options().Addr, PoolSize: 8})
		b.Cleanup(func() { _ = oc.Close() })
		locker := NewLocker(FromGoRedis(oc))
		defer locker.Close()
		octx, stop := context.WithCancel(ctx)
		defer stop()
		const observers = 100
		var mu sync.Mutex
		received := map[string][]time.Time{} // value: when each observer got it
		var ready, done sync.WaitGroup
		for range observers {
			ch := locker.NewElection(key).Observe(octx)
			ready.Add(1)
			done.Add(1)
			go func() {
				defer done.Done()
				first := true
				for v := range ch {
					at := time.Now()
					mu.Lock()
					received[v] = append(received[v], at)
					mu.Unlock()
					if first {
						ready.Done()
						first = false
					}
				}
			}()
		}
		ready.Wait()
		var pings []time.Duration
		for range 200 {
			t0 := time.Now()
			c.Ping(ctx)
			pings = append(pings, time.Since(t0))
		}
		var delays []time.Duration
		b.ResetTimer()
		for n := 0; n < b.N; n++ {
			value := "v" + strconv.Itoa(n+1)
			if err := leader.Proclaim(ctx, value); err != nil {
				b.Fatal(err)
			}
			replied := time.Now()
			for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(20 * time.Microsecond) {
				mu.Lock()
				got := received[value]
				mu.Unlock()
				if len(got) == observers {
					for _, at := range got {
						delays = append(delays, at.Sub(replied))
					}
					break
				}
				if time.Now().After(deadline) {
					b.Fatalf("%d of %d observers received %q", len(got), observers, value)
				}
			}
		}
		b.StopTimer()
		stop()
		done.Wait()
		rt := percentile(pings, 50)
		b.ReportMetric(micros(percentile(delays, 50)), "p50-µs")
		b.ReportMetric(float64(percentile(delays, 50))/float64(rt), "p50-round-trips")
		b.ReportMetric(micros(rt), "round-trip-µs")
	})
}

// BenchmarkServerWork: redis-server's CPU per acquire+release pair, the
// pairs sent in pipelines of 100 so that what is measured is the server's
// work, not its network: the raw go-redis pair, then ours (a lock, a
// fenced lock, a permit beside another holder, a share beside another),
// in alternating blocks, each on keys of its own. It reports server µs
// per pair and ours over raw.
func BenchmarkServerWork(b *testing.B) {
	c := benchClient(b)
	ctx := context.Background()
	type call struct {
		script *redis.Script
		keys   []string
		args   []any
	}
	for _, kind := range []struct {
		name string
		opts []Option
	}{{"lock", nil}, {"fenced", []Option{WithFencing()}}, {"semaphore", []Option{WithPermits(8)}}, {"shared", []Option{WithShared()}}} {
		b.Run("kind="+kind.name, func(b *testing.B) {
			const batch = 100
			var raw, ours []call
			for i := range batch {
				key := fmt.Sprint("bench:work:", kind.name, ":", i)
				rl := NewRedisLock(FromGoRedis(c), key, kind.opts...)
				id := fmt.Sprintf("bench-work-owner-%08d", i)
				take := call{acquireScript, rl.names.acquire, []any{id, int64(30000)}}
				if rl.mode == permitMode { // another holder keeps the key, as in a busy semaphore
					mustAcquire(b, NewRedisLock(FromGoRedis(c), key, kind.opts...))
					take = call{store.PermitAcquire.Script, rl.names.acquire, []any{id, int64(30000), rl.opts.permits}}
				}
				ours = append(ours, take, call{rl.mode.release.Script, rl.names.release, []any{id, rl.names.channel}})
				rawKeys := []string{"bench:work:raw:" + kind.name + ":" + strconv.Itoa(i)}
				raw = append(raw, call{rawAcquire, rawKeys, []any{id, int64(30000)}}, call{rawRelease, rawKeys, []any{id}})
			}
			run := func(calls []call, n int) float64 {
				cpu := serverCPU(b, c)
				for range n {
					cmds, err := c.Pipelined(ctx, func(p redis.Pipeliner) error {
						for _, call := range calls {
							p.EvalSha(ctx, call.script.Hash(), call.keys, call.args...)
						}
						return nil
					})
					if err != nil {
						b.Fatal(err)
					}
					for i := 0; i < len(cmds); i += 2 {
						v, _ := cmds[i].(*redis.Cmd).Result()
						if token, ok := v.([]any); ok && len(token) == 2 { // fenced: {"OK", token}
							v = token[0]
						}
						if v != "OK" {
							b.Fatalf("acquisition %d: %v", i/2, v)
						}
					}
				}
				return serverCPU(b, c) - cpu
			}
			run(ours, 1)
			run(raw, 1)
			b.ResetTimer()
			blocks := max(b.N/batch, 1)
			var rawCPU, oursCPU float64
			for i := 0; i < blocks; i += 10 {
				n := min(10, blocks-i)
				rawCPU += run(raw, n)
				oursCPU += run(ours, n)
			}
			pairs := float64(blocks * batch)
			b.ReportMetric(rawCPU*1e6/pairs, "raw-server-µs/pair")
			b.ReportMetric(oursCPU*1e6/pairs, "server-µs/pair")
			b.ReportMetric(oursCPU/rawCPU, "server-ratio")
		})
	}
}

// BenchmarkAutoPipeliner: acquire+release pairs through go-redis's
// AutoPipeliner of the client beside the client itself. serial: one
// goroutine, a pair through each in turn: the pipeliner's time over the
// client's. saturated: 32 goroutines, a key each, in alternating phases
// (the raw pair and ours, through the client and through the pipeliner):
// pairs per second of each, and redis-server's CPU per pair through the
// pipeliner, ours over raw.
func BenchmarkAutoPipeliner(b *testing.B) {
	c := benchClient(b)
	ap, err := c.AutoPipeline()
	if err != nil {
		b.Fatal(err)
	}
	ctx := context.Background()
	b.Run("serial", func(b *testing.B) {
		plain, piped := NewRedisLock(FromGoRedis(c), "bench:ap:plain"), NewRedisLock(FromGoRedis(ap), "bench:ap:piped")
		spent := make([]time.Duration, 2)
		for range b.N {
			timePairs(b, []*RedisLock{plain, piped}, spent)
		}
		b.ReportMetric(float64(spent[1])/float64(spent[0]), "pipelined/plain")
		b.ReportMetric(micros(spent[0])/float64(b.N), "plain-µs/pair")
	})
	b.Run("saturated", func(b *testing.B) {
		const workers, rounds = 32, 4
		per := max(b.N/(workers*rounds), 1)
		clients := []redis.Scripter{c, ap}
		phase := func(client int, ours bool) (float64, float64) {
			cpu0, t0 := serverCPU(b, c), time.Now()
			var wg sync.WaitGroup
			for w := range workers {
				key := fmt.Sprint("bench:ap:", client, ":", ours, ":", w)
				rl := NewRedisLock(FromGoRedis(clients[client]), key)
				wg.Add(1)
				go func() {
					defer wg.Done()
					for range per {
						if !ours {
							if err := rawAcquire.Run(ctx, clients[client], []string{key}, "fixed-owner-id-0123456789", 10000).Err(); err != nil {
								b.Error(err)
								return
							}
							if err := rawRelease.Run(ctx, clients[client], []string{key}, "fixed-owner-id-0123456789").Err(); err != nil {
								b.Error(err)
								return
							}
							continue
						}
						if !pairOnce(b, ctx, rl) {
							return
						}
					}
				}()
			}
			wg.Wait()
			return time.Since(t0).Seconds(), serverCPU(b, c) - cpu0
		}
		var secs, cpu [2][2]float64 // [client][ours]
		b.ResetTimer()
		for range rounds {
			for client := range clients {
				for o, ours := range []bool{false, true} {
					s, u := phase(client, ours)
					secs[client][o] += s
					cpu[client][o] += u
				}
			}
		}
		pairs := float64(rounds * workers * per)
		b.ReportMetric(pairs/secs[0][0], "raw-pairs/s")
		b.ReportMetric(pairs/secs[0][1], "redislock-pairs/s")
		b.ReportMetric(pairs/secs[1][0], "raw-pipelined-pairs/s")
		b.ReportMetric(pairs/secs[1][1], "redislock-pipelined-pairs/s")
		b.ReportMetric(cpu[1][1]/cpu[1][0], "pipelined-server-ratio")
	})
}
