package main

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/redislock/redislock/internal/redisserver"
)

// TestPoolOnARealServer runs three pools at once, as three processes
// would, each with a client of its own, on a real redis-server: 12 workers
// in all share 3 permits, never more than 3 calls run at once across the
// pools, and every call is made.
func TestPoolOnARealServer(t *testing.T) {
	srv := redisserver.Start(t)
	c := config{key: "partner-api", permits: 3, workers: 4, calls: 3}
	var mu sync.Mutex
	inside, most, calls := 0, 0, 0
	call := func(ctx context.Context, _, _ int) error {
		mu.Lock()
		inside++
		most, calls = max(most, inside), calls+1
		mu.Unlock()
		time.Sleep(20 * time.Millisecond)
		mu.Lock()
		inside--
		mu.Unlock()
		return nil
	}
	var wg sync.WaitGroup
	for range 3 {
		rdb := redis.NewClient(&redis.Options{Addr: srv.Addr})
		t.Cleanup(func() { rdb.Close() })
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := pool(context.Background(), c, rdb, call); err != nil {
				t.Error(err)
			}
		}()
	}
	wg.Wait()
	if most > 3 || most < 2 || calls != 3*4*3 {
		t.Fatalf("at most %d calls at once fleet-wide with 3 permits; %d calls", most, calls)
	}
	t.Logf("%d calls, at most %d at once", calls, most)
}

// TestDemoRuns runs the program as its README says, on its embedded Redis.
func TestDemoRuns(t *testing.T) {
	if err := pool(context.Background(), config{key: "k", permits: 2, workers: 3, calls: 2}, redis.NewClient(&redis.Options{Addr: redisAddr("")}),
		func(context.Context, int, int) error { return nil }); err != nil {
		t.Fatal(err)
	}
}
