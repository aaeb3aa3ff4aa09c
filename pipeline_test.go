package redislock

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/redislock/redislock/internal/redisserver"
)

// pipelined is what the tests need of a client or its AutoPipeliner.
type pipelined interface {
	redis.Scripter
	Subscriber
}

// autoPipeline returns c's AutoPipeliner.
func autoPipeline(t *testing.T, c interface {
	AutoPipeline() (*redis.AutoPipeliner, error)
}) *redis.AutoPipeliner {
	t.Helper()
	ap, err := c.AutoPipeline()
	if err != nil {
		t.Fatal(err)
	}
	return ap
}

// crowd has workers goroutines, each with its own lock on key made by
// newLock, take turns rounds times, and fails if more than n are ever
// inside at once, if a section is lost, or (fenced) if a token does not
// exceed the one of a section that ended before it began.
func crowd(t *testing.T, key string, n, workers, rounds int, newLock func() *RedisLock) {
	t.Helper()
	var inside, most, sections atomic.Int64
	var mu sync.Mutex
	var ended int64 // the highest token of a section ended
	var wg sync.WaitGroup
	for range workers {
		rl := newLock()
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range rounds {
				if err := rl.AcquireWait(context.Background()); err != nil {
					t.Errorf("%s: %v", key, err)
					return
				}
				mu.Lock()
				if rl.opts.fencing && n == 1 && rl.Token() <= ended {
					t.Errorf("%s: token %d not above %d, of a section ended before", key, rl.Token(), ended)
				}
				mu.Unlock()
				now := inside.Add(1)
				for m := most.Load(); now > m && !most.CompareAndSwap(m, now); m = most.Load() {
				}
				time.Sleep(100 * time.Microsecond)
				inside.Add(-1)
				mu.Lock()
				ended = max(ended, rl.Token())
				mu.Unlock()
				if ok, err := rl.Release(); !ok || err != nil {
					t.Errorf("%s: Release = %v, %v", key, ok, err)
					return
				}
				sections.Add(1)
			}
		}()
	}
	wg.Wait()
	if most.Load() > int64(n) || sections.Load() != int64(workers*rounds) {
		t.Fatalf("%s: at most %d inside (of %d), %d sections of %d", key, most.Load(), n, sections.Load(), workers*rounds)
	}
}

// The contract through go-redis's AutoPipeliner of a Client, on a real
// server: concurrent calls share round trips, and every kind keeps its
// promises.
func TestAutoPipelinedClient(t *testing.T) {
	srv := redisserver.Start(t)
	admin := srv.Client(t)
	c := newClient(t, srv.Addr)
	ap := autoPipeline(t, c)
	s := FromGoRedis(ap)
	ctx := context.Background()

	t.Run("one primary", func(t *testing.T) {
		l := NewLocker(s)
		defer l.Close()
		if !l.store.Single || !l.store.CanWait() || l.store.Sub == nil {
			t.Fatalf("the store of a Client's AutoPipeliner: Single %v, CanWait %v, pub/sub %v", l.store.Single, l.store.CanWait(), l.store.Sub != nil)
		}
	})
	t.Run("re-entry", func(t *testing.T) {
		rl := NewRedisLock(s, "ap:reentry")
		mustAcquire(t, rl)
		mustAcquire(t, rl)
		mustRelease(t, rl)
		if v := admin.Get(ctx, "ap:reentry").Val(); v != holderID(rl) {
			t.Fatalf("after the inner release the key holds %q", v)
		}
		mustRelease(t, rl)
		if admin.Exists(ctx, "ap:reentry").Val() != 0 {
			t.Fatal("the key outlived the last release")
		}
	})
	t.Run("wake-up", func(t *testing.T) {
		t.Logf("woken %v after the release", requireReleaseWakes(t, ap, "ap:wake"))
	})
	t.Run("fair", func(t *testing.T) {
		order := fairOrder(t, 5, "ap:fair", admin, func(int) (Scripter, Subscriber) { return s, ap })
		if fmt.Sprint(order) != "[1 2 3 4 5]" {
			t.Fatalf("fair waiters served in order %v", order)
		}
	})
	kinds := []struct {
		name string
		n    int
		opts []Option
	}{
		{"plain", 1, nil},
		{"fenced", 1, []Option{WithFencing()}},
		{"fair", 1, []Option{WithFairness(), WithFencing()}},
		{"permits", 3, []Option{WithPermits(3)}},
	}
	for _, k := range kinds {
		t.Run("crowd "+k.name, func(t *testing.T) {
			crowd(t, "ap:crowd:"+k.name, k.n, 16, 25, func() *RedisLock { return NewRedisLock(s, "ap:crowd:"+k.name, k.opts...) })
		})
	}
	t.Run("shared", func(t *testing.T) {
		a, b := NewRedisLock(s, "ap:shared", WithShared()), NewRedisLock(s, "ap:shared", WithShared())
		writer := NewRedisLock(s, "ap:shared")
		mustAcquire(t, a)
		mustAcquire(t, b)
		got := make(chan error, 1)
		go func() { got <- writer.AcquireWait(ctx) }()
		mustRelease(t, a)
		select {
		case err := <-got:
			t.Fatalf("the writer got in beside a share: %v", err)
		case <-time.After(50 * time.Millisecond):
		}
		mustRelease(t, b)
		if err := <-got; err != nil {
			t.Fatal(err)
		}
		mustRelease(t, writer)
	})
	t.Run("renewal batches", func(t *testing.T) {
		// 300 locks with a 300 ms lease held for four leases: a renewal
		// every 100 ms each, about 3,600 in all, in scripts of up to 100
		// leases through the client's pipelines.
		l := NewLocker(s)
		defer l.Close()
		calls := func() int64 { return evalCalls(t, admin) }
		var held []*RedisLock
		for i := range 300 {
			rl := l.NewLock("ap:held:"+strconv.Itoa(i), WithExpiry(300*time.Millisecond))
			mustAcquire(t, rl)
			held = append(held, rl)
		}
		before := calls()
		time.Sleep(1200 * time.Millisecond)
		scripts := calls() - before
		for _, rl := range held {
			if isClosed(rl.Done()) || admin.Get(ctx, rl.key).Val() != holderID(rl) {
				t.Fatalf("%s lost: %v", rl.key, rl.Err())
			}
		}
		if scripts == 0 || scripts > 300 {
			t.Fatalf("%d scripts renewed 300 locks for four leases: not in batches", scripts)
		}
		t.Logf("%d scripts renewed 300 locks over four leases", scripts)
		releaseAll(held...)
	})
	t.Run("replicas", func(t *testing.T) { // none online: reported at once, not waited out
		rl := NewRedisLock(s, "ap:replicas", WithReplicas(1))
		if ok, err := rl.Acquire(); ok || !errors.Is(err, ErrNotReplicated) || errors.Is(err, errors.ErrUnsupported) {
			t.Fatalf("WithReplicas(1) without replicas through a Client's AutoPipeliner: %v, %v", ok, err)
		}
		if admin.Exists(ctx, "ap:replicas").Val() != 0 {
			t.Fatal("an acquisition not replicated left its key")
		}
	})
}

// evalCalls returns how many scripts the server has run.
func evalCalls(t *testing.T, admin *redis.Client) int64 {
	t.Helper()
	var n int64
	for _, line := range strings.Split(admin.Info(context.Background(), "commandstats").Val(), "\n") {
		if strings.HasPrefix(line, "cmdstat_evalsha:") || strings.HasPrefix(line, "cmdstat_eval:") {
			calls, _, _ := strings.Cut(strings.TrimPrefix(line[strings.Index(line, ":")+1:], "calls="), ",")
			v, err := strconv.ParseInt(calls, 10, 64)
			if err != nil {
				t.Fatalf("commandstats line %q", line)
			}
			n += v
		}
	}
	return n
}

// The contract through the AutoPipeliner of a ClusterClient: keys on
// every node, wake-ups, renewal batches, and WithReplicas refused (WAIT
// cannot follow a script to its key's node through it).
func TestAutoPipelinedCluster(t *testing.T) {
	c, _ := startCluster(t)
	ap := autoPipeline(t, c)
	s := FromGoRedis(ap)
	ctx := context.Background()
	nodes := map[string]bool{}
	l := NewLocker(s)
	defer l.Close()
	var held []*RedisLock
	for i := range 60 {
		key := "ap:cluster:" + strconv.Itoa(i)
		rl := l.NewLock(key, WithExpiry(300*time.Millisecond), WithFencing())
		mustAcquire(t, rl)
		if ok, err := NewRedisLock(s, key).Acquire(); ok || err != nil {
			t.Fatalf("%s: a second lock got %v, %v", key, ok, err)
		}
		node, err := c.MasterForKey(ctx, key)
		if err != nil {
			t.Fatal(err)
		}
		nodes[node.Options().Addr] = true
		held = append(held, rl)
	}
	time.Sleep(time.Second) // three leases, renewed in batches to each node
	for _, rl := range held {
		if isClosed(rl.Done()) || c.Get(ctx, rl.key).Val() != holderID(rl) {
			t.Fatalf("%s lost: %v", rl.key, rl.Err())
		}
	}
	releaseAll(held...)
	if len(nodes) < 3 {
		t.Fatalf("keys on %d nodes: the test did not cross them", len(nodes))
	}
	t.Logf("woken %v after the release", requireReleaseWakes(t, ap, "ap:cluster:wake"))
	crowd(t, "ap:cluster:fair", 1, 8, 10, func() *RedisLock { return NewRedisLock(s, "ap:cluster:fair", WithFairness(), WithFencing()) })
	rl := NewRedisLock(s, "ap:cluster:replicas", WithReplicas(1))
	if ok, err := rl.Acquire(); ok || !errors.Is(err, ErrNotReplicated) || !errors.Is(err, errors.ErrUnsupported) {
		t.Fatalf("WithReplicas(1) through a ClusterClient's AutoPipeliner: %v, %v", ok, err)
	}
}
