// Command semaphore is a pool of workers that call a partner API which
// allows at most a few calls at once, fleet-wide: each worker takes one of
// the permits of a semaphore on Redis around each call, so however many
// workers (and processes) there are, no more than -permits calls run at
// once.
//
//	go run ./examples/semaphore                       # an embedded Redis
//	go run ./examples/semaphore -addr localhost:6379  # yours: run it twice at once
package main

import (
	"context"
	"flag"
	"fmt"
	"log"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"

	"github.com/redislock/redislock"
)

// config is the pool's flags.
type config struct {
	key     string
	permits int // calls at once, fleet-wide
	workers int // workers in this process
	calls   int // calls each worker makes
}

func main() {
	var c config
	addr := flag.String("addr", "", "Redis address host:port (default: an embedded miniredis)")
	flag.StringVar(&c.key, "key", "partner-api", "the semaphore's key")
	flag.IntVar(&c.permits, "permits", 3, "how many calls may run at once, fleet-wide")
	flag.IntVar(&c.workers, "workers", 8, "workers in this process")
	flag.IntVar(&c.calls, "calls", 4, "calls each worker makes")
	length := flag.Duration("call", 200*time.Millisecond, "how long one call takes")
	flag.Parse()

	rdb := redis.NewClient(&redis.Options{Addr: redisAddr(*addr)})
	defer rdb.Close()
	var inside, most atomic.Int64
	call := func(ctx context.Context, worker, i int) error { // the partner API, in this demo
		n := inside.Add(1)
		defer inside.Add(-1)
		for m := most.Load(); n > m && !most.CompareAndSwap(m, n); m = most.Load() {
		}
		fmt.Printf("worker %d: call %d (%d under way in this process)\n", worker, i, n)
		select {
		case <-time.After(*length):
			return nil
		case <-ctx.Done(): // the permit was lost: stop
			return context.Cause(ctx)
		}
	}
	if err := pool(context.Background(), c, rdb, call); err != nil {
		fmt.Fprintln(os.Stderr, "semaphore:", err)
		os.Exit(1)
	}
	fmt.Printf("done: at most %d calls at once in this process, with %d permits fleet-wide\n", most.Load(), c.permits)
}

// redisAddr returns addr, or the address of an embedded miniredis whose
// TTLs follow real time.
func redisAddr(addr string) string {
	if addr != "" {
		return addr
	}
	mr := miniredis.NewMiniRedis()
	mr.ClockTTL(true)
	if err := mr.Start(); err != nil {
		log.Fatal(err)
	}
	return mr.Addr()
}

// pool runs the workers, each making its calls one after another, each
// call holding one of the semaphore's permits; it returns the first error.
func pool(ctx context.Context, c config, rdb redis.UniversalClient, call func(ctx context.Context, worker, i int) error) error {
	var wg sync.WaitGroup
	errs := make(chan error, c.workers)
	for w := 1; w <= c.workers; w++ {
		// A RedisLock per worker: each holds its own permit.
		permit := redislock.NewRedisLock(redislock.FromGoRedis(rdb), c.key, redislock.WithPermits(c.permits))
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 1; i <= c.calls; i++ {
				err := permit.Do(ctx, func(ctx context.Context) error { return call(ctx, w, i) })
				if err != nil {
					errs <- fmt.Errorf("worker %d: %w", w, err)
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	return <-errs
}
