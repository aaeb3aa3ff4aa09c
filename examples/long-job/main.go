// Command long-job is a nightly job that runs for many leases under one
// lock, shown both ways:
//
//   - with the library: the job takes the lock itself with Do; the watchdog
//     renews the lease while the job runs; the job stops cleanly when told
//     the lock was lost (Do's context ends), and WithMaxHold bounds it;
//
//     go run ./examples/long-job                       # an embedded Redis
//     go run ./examples/long-job -addr localhost:6379  # yours
//
//   - under "redislock run", with no lock code in the job at all: the
//     command holds and renews the lock while the job runs, and stops the
//     job with SIGTERM if the lock is lost;
//
//     go build -o /tmp/long-job ./examples/long-job
//     redislock run -addr localhost:6379 -ttl 1s nightly-report -- /tmp/long-job -under-run
//
//     (a built binary, not "go run", which would not pass SIGTERM on)
//
// Each step stands for a batch of work that is safe to stop between steps.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"

	"github.com/redislock/redislock"
)

// config is the job's flags.
type config struct {
	key      string
	steps    int
	step     time.Duration // how long one step works
	lease    time.Duration
	maxHold  time.Duration
	underRun bool // no lock of its own: "redislock run" holds it
}

func main() {
	var c config
	addr := flag.String("addr", "", "Redis address host:port (default: an embedded miniredis)")
	flag.StringVar(&c.key, "key", "nightly-report", "the lock's key")
	flag.IntVar(&c.steps, "steps", 12, "how many steps the job has")
	flag.DurationVar(&c.step, "step", 500*time.Millisecond, "how long each step works")
	flag.DurationVar(&c.lease, "lease", time.Second, "the lock's lease; the watchdog renews it every lease/3")
	flag.DurationVar(&c.maxHold, "max-hold", 30*time.Second, "stop the job and release the lock after this long")
	flag.BoolVar(&c.underRun, "under-run", false, `take no lock: run under "redislock run", which holds it`)
	flag.Parse()

	// SIGINT and SIGTERM stop the job between steps ("redislock run" sends
	// SIGTERM when it loses the lock).
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	var err error
	if c.underRun {
		_, err = work(ctx, c, os.Stdout)
	} else {
		rdb := redis.NewClient(&redis.Options{Addr: redisAddr(*addr)})
		defer rdb.Close()
		_, err = job(ctx, c, rdb, os.Stdout)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "long-job:", err)
		os.Exit(1)
	}
}

// redisAddr returns addr, or the address of an embedded miniredis whose
// TTLs follow real time.
func redisAddr(addr string) string {
	if addr != "" {
		return addr
	}
	mr := miniredis.NewMiniRedis()
	mr.ClockTTL(true) // TTLs follow the wall clock, as on a real server
	if err := mr.Start(); err != nil {
		log.Fatal(err)
	}
	return mr.Addr()
}

// job runs the steps under the lock, and returns how many it finished.
// It returns an error matching redislock.ErrLockLost or
// ErrMaxHoldExceeded when the hold ended before the job did: the step under
// way is abandoned and no step starts after that.
func job(ctx context.Context, c config, rdb redis.UniversalClient, out io.Writer) (int, error) {
	lock := redislock.NewRedisLock(redislock.FromGoRedis(rdb), c.key,
		redislock.WithExpiry(c.lease), redislock.WithMaxHold(c.maxHold))
	done := 0
	err := lock.Do(ctx, func(ctx context.Context) error {
		fmt.Fprintf(out, "holding %q as %s: %d steps of %v under a %v lease\n", c.key, lock.Owner(), c.steps, c.step, c.lease)
		var err error
		done, err = steps(ctx, c, out, func() string {
			return fmt.Sprintf(" (held until %s: the watchdog renews the lease)", lock.Until().Format("15:04:05.000"))
		})
		return err
	})
	switch {
	case errors.Is(err, redislock.ErrLockLost), errors.Is(err, redislock.ErrMaxHoldExceeded):
		// Do joined the reason the hold ended; the lock is not ours any
		// more, and nothing else is written under it.
		fmt.Fprintf(out, "stopped cleanly after %d of %d steps: %v\n", done, c.steps, err)
	case err == nil:
		fmt.Fprintf(out, "all %d steps done; lock released\n", done)
	}
	return done, err
}

// work runs the steps without a lock of its own, for "redislock run".
func work(ctx context.Context, c config, out io.Writer) (int, error) {
	fmt.Fprintf(out, "under redislock run as owner %s: %d steps of %v\n", os.Getenv("REDISLOCK_OWNER"), c.steps, c.step)
	done, err := steps(ctx, c, out, func() string { return "" })
	if err != nil {
		fmt.Fprintf(out, "stopped cleanly after %d of %d steps: %v\n", done, c.steps, err)
		return done, err
	}
	fmt.Fprintf(out, "all %d steps done\n", done)
	return done, nil
}

// steps works c.steps steps, each c.step long, and stops between them, or
// abandons the one under way, when ctx ends.
func steps(ctx context.Context, c config, out io.Writer, note func() string) (int, error) {
	t := time.NewTimer(c.step)
	defer t.Stop()
	for i := 1; i <= c.steps; i++ {
		t.Reset(c.step)
		select {
		case <-ctx.Done():
			return i - 1, context.Cause(ctx)
		case <-t.C:
		}
		fmt.Fprintf(out, "step %d/%d done%s\n", i, c.steps, note())
	}
	return c.steps, nil
}
