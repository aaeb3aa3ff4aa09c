package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"sync"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"

	"github.com/redislock/redislock"
)

// demo runs the narrated tour. Its scenes are timed to finish in about 20s.
func demo(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("demo", flag.ContinueOnError)
	fs.SetOutput(stderr)
	addr := fs.String("addr", "", "Redis address host:port (default: an embedded miniredis)")
	fast := fs.Bool("fast", false, "shorten every wait tenfold (for tests)")
	if err := fs.Parse(args); err != nil {
		return parseStatus(err)
	}

	out := &syncWriter{w: stdout} // the narration and the library's lines share it
	d := &tour{out: out, start: time.Now(), scale: 1, prefix: "redislock-demo:"}
	if *fast {
		d.scale = 10
	}
	where := *addr
	if where == "" {
		mr := miniredis.NewMiniRedis()
		mr.ClockTTL(true) // TTLs follow the wall clock, as on a real server
		if err := mr.Start(); err != nil {
			fmt.Fprintf(stderr, "redislock demo: embedded Redis: %v\n", err)
			return 1
		}
		defer mr.Close()
		where = mr.Addr()
		d.say("Using an embedded Redis (miniredis) on %s. Give -addr host:port to use yours.", where)
	} else {
		d.say("Using the Redis at %s; keys go under %q.", where, d.prefix)
	}
	d.rdb = redis.NewClient(&redis.Options{Addr: where})
	defer d.rdb.Close()
	if err := d.rdb.Ping(context.Background()).Err(); err != nil {
		fmt.Fprintf(stderr, "redislock demo: cannot reach Redis at %s: %v\n", where, err)
		return 1
	}

	// What the library logs in the background, where no caller can get an
	// error, goes to the logger of WithLogger; show all of it indented.
	d.log = slog.New(slog.NewTextHandler(&indented{w: out, prefix: "            log | "}, &slog.HandlerOptions{Level: slog.LevelDebug,
		ReplaceAttr: func(groups []string, a slog.Attr) slog.Attr {
			if len(groups) == 0 && a.Key == slog.TimeKey {
				return slog.Attr{} // the narration says when
			}
			return a
		}}))

	for _, scene := range []func() error{d.contention, d.reentry, d.watchdog, d.loss, d.maxHold, d.shutdown} {
		if err := scene(); err != nil {
			fmt.Fprintf(stderr, "redislock demo: %v\n", err)
			return 1
		}
	}
	d.say("That's the tour. Read the README for the API and the rules behind each scene.")
	return 0
}

type tour struct {
	out    io.Writer
	start  time.Time
	scale  time.Duration
	prefix string
	rdb    *redis.Client
	log    *slog.Logger // the library's lines, shown indented
}

func (d *tour) say(format string, args ...any) {
	fmt.Fprintf(d.out, "%6.2fs  %s\n", time.Since(d.start).Seconds(), fmt.Sprintf(format, args...))
}

func (d *tour) title(s string) {
	fmt.Fprintf(d.out, "\n== %s\n", s)
}

// wait sleeps for t, shortened by -fast.
func (d *tour) wait(t time.Duration) { time.Sleep(t / d.scale) }

func (d *tour) lock(key string, opts ...redislock.Option) *redislock.RedisLock {
	return redislock.NewRedisLock(redislock.FromGoRedis(d.rdb), d.prefix+key, append([]redislock.Option{redislock.WithLogger(d.log)}, opts...)...)
}

// contention: three workers, each with its own RedisLock, want to bill the
// same invoice; one at a time gets it.
func (d *tour) contention() error {
	d.title("1. Three workers, one invoice: only the holder may bill it")
	d.say("Each worker has its own RedisLock on %q and tries every 100ms.", d.prefix+"invoice:42")
	var wg sync.WaitGroup
	errs := make(chan error, 3)
	for w := 1; w <= 3; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			l := d.lock("invoice:42", redislock.WithExpiry(2*time.Second))
			tries := 0
			for {
				tries++
				ok, err := l.Acquire()
				if err != nil {
					errs <- err
					return
				}
				if ok {
					break
				}
				d.wait(100 * time.Millisecond)
			}
			d.say("worker-%d acquired the lock after %d tries; billing for 1.5s...", w, tries)
			d.wait(1500 * time.Millisecond)
			d.say("worker-%d releases it.", w) // said first: the next can only take it after
			if _, err := l.Release(); err != nil {
				errs <- err
			}
		}()
		d.wait(20 * time.Millisecond) // let them arrive in order
	}
	wg.Wait()
	close(errs)
	return <-errs
}

// reentry: a function holding the lock calls another that takes it again.
func (d *tour) reentry() error {
	d.title("2. Nested calls re-enter the lock they already hold")
	l := d.lock("account:7")
	other := d.lock("account:7")
	if _, err := l.Acquire(); err != nil {
		return err
	}
	d.say("chargeCustomer() acquired %q: Holds() = %d", l.Key(), l.Holds())
	if ok, err := l.Acquire(); err != nil || !ok {
		return fmt.Errorf("re-entry: %v, %v", ok, err)
	}
	d.say("  writeLedger() acquired it again through the same RedisLock: Holds() = %d", l.Holds())
	if _, err := l.Release(); err != nil {
		return err
	}
	ok, _ := other.Acquire()
	d.say("  writeLedger() released once: Holds() = %d, key still there: %v, a different RedisLock gets it: %v",
		l.Holds(), d.exists(l.Key()), ok)
	if _, err := l.Release(); err != nil {
		return err
	}
	d.say("chargeCustomer() released the outer hold: Holds() = %d, key still there: %v", l.Holds(), d.exists(l.Key()))
	return nil
}

// watchdog: a job three times longer than its lease keeps the lock.
func (d *tour) watchdog() error {
	d.title("3. A job longer than its lease: the watchdog renews it every lease/3")
	l := d.lock("migration", redislock.WithExpiry(1500*time.Millisecond))
	if _, err := l.Acquire(); err != nil {
		return err
	}
	d.say("The migration took the lock with a 1.5s lease and works for 6.5s.")
	for i := 1; i <= 6; i++ {
		d.wait(time.Second)
		ttl, err := l.TTL(context.Background())
		if err != nil {
			return err
		}
		d.say("  %ds into the job: the key's TTL is %v, still ours", i, ttl.Round(10*time.Millisecond))
	}
	d.wait(500 * time.Millisecond)
	ok, err := l.Release()
	d.say("Job done after 6.5s, over four leases long: Release() = %v, %v", ok, err)
	return err
}

// loss: someone deletes the key; the holder learns at once through Done.
func (d *tour) loss() error {
	d.title("4. A lost lease is reported to its holder at once")
	l := d.lock("report:nightly", redislock.WithExpiry(1500*time.Millisecond))
	if _, err := l.Acquire(); err != nil {
		return err
	}
	d.say("The nightly report holds %q and works while <-Done() stays open.", l.Key())
	go func() {
		d.wait(time.Second)
		d.say("An operator runs DEL %s (a failover or a long pause would do the same).", l.Key())
		d.rdb.Del(context.Background(), l.Key())
	}()
	select {
	case <-l.Done():
	case <-time.After(10 * time.Second):
		return errors.New("the loss was not reported")
	}
	d.say("The worker sees Done() close and stops writing. Err() = %v", l.Err())
	ok, err := l.Release()
	d.say("Its deferred Release() = %v, %v; errors.Is(err, redislock.ErrLockLost) = %v",
		ok, err, errors.Is(err, redislock.ErrLockLost))
	return nil
}

// maxHold: a stuck holder loses the lock at its maximum hold time.
func (d *tour) maxHold() error {
	d.title("5. A stuck holder cannot keep the lock forever: WithMaxHold")
	stuck := d.lock("cron:cleanup", redislock.WithExpiry(time.Second), redislock.WithMaxHold(2500*time.Millisecond))
	next := d.lock("cron:cleanup")
	if _, err := stuck.Acquire(); err != nil {
		return err
	}
	d.say("A cleanup job took the lock with WithMaxHold(2.5s) and then hung.")
	for {
		select {
		case <-stuck.Done():
			d.say("After 2.5s the hold ended and the watchdog released the key. Err() = %v", stuck.Err())
			_, _ = stuck.Release() // returns the same reason, once the key is released
			ok, err := next.Acquire()
			d.say("The next run acquires it: %v, %v", ok, err)
			_, err = next.Release()
			return err
		case <-time.After(500 * time.Millisecond / d.scale):
			ok, _ := next.Acquire()
			d.say("  the next run tries: acquired = %v", ok)
			if ok { // only just freed: give it back, it is taken below
				_, _ = next.Release()
			}
		}
	}
}

// shutdown: Do runs work under the lock, and a shutdown that cancels its
// context stops the work and releases the lock at once; a plain
// AcquireCtx's context bounds the renewal only, as go-zero's would.
func (d *tour) shutdown() error {
	d.title("6. Do(ctx, fn): a shutdown stops the work and releases at once")
	ctx, cancel := context.WithCancelCause(context.Background())
	defer cancel(nil)
	l := d.lock("consumer:orders")
	go func() {
		d.wait(time.Second)
		d.say("SIGTERM: the service cancels ctx.")
		cancel(errors.New("service shutting down"))
	}()
	err := l.Do(ctx, func(ctx context.Context) error {
		d.say("A consumer runs under Do(ctx, fn) on %q and processes orders until ctx ends.", l.Key())
		<-ctx.Done()
		d.say("fn sees its context end (%v) and returns; Do releases the lock.", context.Cause(ctx))
		return nil
	})
	d.say("Do() = %v; key still there: %v", err, d.exists(l.Key()))

	d.say("With AcquireCtx(ctx), ctx bounds the renewal, not the lock, as in go-zero:")
	req, finish := context.WithCancelCause(context.Background())
	defer finish(nil)
	short := d.lock("report:weekly", redislock.WithExpiry(1500*time.Millisecond/d.scale))
	if _, err := short.AcquireCtx(req); err != nil {
		return err
	}
	finish(errors.New("request finished"))
	d.say("  the request that took %q ended: renewal stops, Done() still open: %v, key still there: %v",
		short.Key(), !closed(short.Done()), d.exists(short.Key()))
	select {
	case <-short.Done():
	case <-time.After(10 * time.Second):
		return errors.New("the hold did not last out its lease")
	}
	d.say("  the lock lasted out its lease; then Done() closed, Err() = %v", short.Err())
	ok, err := short.Release()
	d.say("  the late Release() = %v, %v", ok, err)
	return nil
}

// closed reports whether ch is closed, without waiting.
func closed(ch <-chan struct{}) bool {
	select {
	case <-ch:
		return true
	default:
		return false
	}
}

func (d *tour) exists(key string) bool {
	return d.rdb.Exists(context.Background(), key).Val() == 1
}

// syncWriter serializes writes, each of which is whole lines.
type syncWriter struct {
	mu sync.Mutex
	w  io.Writer
}

func (s *syncWriter) Write(b []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.w.Write(b)
}

// indented writes the library's lines with a prefix before each line, in one write.
type indented struct {
	w      io.Writer
	prefix string
}

func (p *indented) Write(b []byte) (int, error) {
	var out strings.Builder
	for _, line := range strings.SplitAfter(string(b), "\n") {
		if line != "" {
			out.WriteString(p.prefix + line)
		}
	}
	if _, err := io.WriteString(p.w, out.String()); err != nil {
		return 0, err
	}
	return len(b), nil
}
