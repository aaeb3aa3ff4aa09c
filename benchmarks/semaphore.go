package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/redislock/redislock"
)

// The semaphore scenario: 12 workers share 3 permits, each taking one for
// a 1 ms section, again and again. There is no semaphore in the other Go
// libraries: users take one of N locks (N keys) instead, trying each in
// turn and sleeping 1 ms when all are taken. redislock takes part both
// ways: WithPermits(3), waiting with AcquireWait; and as 3 keys.
const (
	permits     = 3
	semWorkers  = 12
	semSection  = time.Millisecond
	semOursName = "redislock, WithPermits"
)

// semaphoreNames are the contenders of the semaphore scenario.
var semaphoreNames = []string{semOursName, "redislock, 3 keys", "bsm/redislock, 3 keys", "redsync, 3 keys"}

// semResult is what a semaphore run measured.
type semResult struct {
	name     string
	perSec   float64 // sections per second
	most     int64   // the most sections under way at once (at most permits)
	minShare float64 // the fewest sections of a worker over the most
}

// semaphoreRun runs the scenario for d with the named contender.
func semaphoreRun(name, addr string, d time.Duration) semResult {
	var take func(ctx context.Context, w int) (release func(), err error)
	var done func()
	if name == semOursName {
		c := redis.NewClient(&redis.Options{Addr: addr, PoolSize: 64})
		done = func() { c.Close() }
		locks := make([]*redislock.RedisLock, semWorkers)
		for w := range locks {
			locks[w] = redislock.NewRedisLock(redislock.FromGoRedis(c), "bench:sem", redislock.WithPermits(permits), redislock.WithExpiry(lease))
		}
		take = func(ctx context.Context, w int) (func(), error) {
			if err := locks[w].AcquireWait(ctx); err != nil {
				return nil, err
			}
			return func() { locks[w].ReleaseCtx(ctx) }, nil
		}
	} else {
		lib := newLibrary(name[:len(name)-len(", 3 keys")], addr)
		done = lib.close
		keys := make([][]lock, semWorkers) // a lock per worker per key
		for w := range keys {
			for k := 0; k < permits; k++ {
				keys[w] = append(keys[w], lib.new(fmt.Sprintf("bench:sem:%d", k)))
			}
		}
		take = func(ctx context.Context, w int) (func(), error) {
			for {
				for i := range permits {
					l := keys[w][(w+i)%permits]
					if ok, err := l.try(ctx); err != nil {
						return nil, err
					} else if ok {
						return func() { l.release(ctx) }, nil
					}
				}
				select {
				case <-ctx.Done():
					return nil, ctx.Err()
				case <-time.After(time.Millisecond):
				}
			}
		}
	}
	defer done()
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	var inside, most atomic.Int64
	counts := make([]int, semWorkers)
	var wg sync.WaitGroup
	for w := range semWorkers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for ctx.Err() == nil {
				release, err := take(ctx, w)
				if err != nil {
					if ctx.Err() == nil && !errors.Is(err, context.DeadlineExceeded) { // a wait that cannot end before d does not begin
						fmt.Fprintln(os.Stderr, name, "semaphore:", err)
					}
					return
				}
				n := inside.Add(1)
				for m := most.Load(); n > m && !most.CompareAndSwap(m, n); m = most.Load() {
				}
				time.Sleep(semSection)
				inside.Add(-1)
				counts[w]++
				release()
			}
		}()
	}
	wg.Wait()
	total, fewest, largest := 0, counts[0], 0
	for _, n := range counts {
		total += n
		fewest, largest = min(fewest, n), max(largest, n)
	}
	r := semResult{name: name, perSec: float64(total) / d.Seconds(), most: most.Load()}
	if largest > 0 {
		r.minShare = float64(fewest) / float64(largest)
	}
	return r
}
