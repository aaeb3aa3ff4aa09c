// Command nested shows a reentrant lock in a service layer whose methods
// call each other, and why independent workers need a lock each: two
// workers close one account, first sharing a Ledger (wrong), then with a
// Ledger each (right).
//
//	go run ./examples/nested [-addr host:port]
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"log"
	"os"
	"os/signal"
	"sync"
	"syscall"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"

	"github.com/redislock/redislock"
)

// opening is each account's balance before the workers close it.
const opening = 100

// meetTimeout bounds how long a worker inside Withdraw waits to see the
// other one inside too: the right version waits all of it.
const meetTimeout = 2 * time.Second

func main() {
	addr := flag.String("addr", "", "Redis host:port (default: an embedded miniredis)")
	flag.Parse()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if _, err := demo(ctx, *addr, os.Stdout); err != nil {
		log.Fatal(err)
	}
}

// demo runs the demo on the Redis at addr, or on an embedded miniredis if
// addr is empty.
func demo(ctx context.Context, addr string, out io.Writer) (result, error) {
	if addr == "" {
		mr := miniredis.NewMiniRedis()
		mr.ClockTTL(true) // TTLs follow the clock, as on a real server
		if err := mr.Start(); err != nil {
			return result{}, err
		}
		defer mr.Close()
		addr = mr.Addr()
	}
	rdb := redis.NewClient(&redis.Options{Addr: addr})
	defer rdb.Close()
	return run(ctx, rdb, out)
}

// result is what the two versions of the demo saw.
type result struct {
	Wrong, Right outcome
}

// outcome is what one version saw.
type outcome struct {
	Overlap bool     // both workers were inside Withdraw at once
	Holds   []int    // the lock's Holds() inside Withdraw, in the order the workers got there
	Paid    [2]int64 // what Close paid out to each worker
	Errs    [2]error // each worker's error
	Balance int64    // the account's balance at the end
}

// run runs both versions, writing what happens to out.
func run(ctx context.Context, rdb *redis.Client, out io.Writer) (result, error) {
	locker := redislock.NewLocker(redislock.FromGoRedis(rdb), redislock.WithPrefix(keyPrefix))
	defer locker.Close()
	p := &printer{w: out}
	var res result
	var err error

	p.printf("wrong (one lock shared by two workers): one Ledger, so one RedisLock per account\n")
	shared := NewLedger(rdb, locker)
	if res.Wrong, err = contend(ctx, p, "alice", shared, shared); err != nil {
		return res, err
	}
	p.printf("  => %s; alice: paid out %d of %d, balance %d\n",
		inside(res.Wrong.Overlap), res.Wrong.Paid[0]+res.Wrong.Paid[1], opening, res.Wrong.Balance)

	p.printf("right (a lock per worker): a Ledger each, so a RedisLock each, from one Locker\n")
	if res.Right, err = contend(ctx, p, "bob", NewLedger(rdb, locker), NewLedger(rdb, locker)); err != nil {
		return res, err
	}
	p.printf("  => %s; bob: paid out %d of %d, balance %d\n",
		inside(res.Right.Overlap), res.Right.Paid[0]+res.Right.Paid[1], opening, res.Right.Balance)
	return res, nil
}

func inside(overlap bool) string {
	if overlap {
		return "both inside at once"
	}
	return "never both inside"
}

// contend opens acct with the opening balance, then has two workers close
// it at once, the first with l1, the second with l2, and reports what
// happened. The second starts once the first is inside Withdraw.
func contend(ctx context.Context, p *printer, acct string, l1, l2 *Ledger) (outcome, error) {
	var o outcome
	if err := l1.rdb.Del(ctx, balanceKey(acct), closedKey(acct)).Err(); err != nil {
		return o, err
	}
	if err := l1.Deposit(ctx, acct, opening); err != nil {
		return o, err
	}

	m := &meeting{p: p, wait: meetTimeout, first: make(chan struct{}), both: make(chan struct{})}
	l1.inside, l2.inside = m.enter, m.enter
	var done [2]chan struct{}
	for i, l := range []*Ledger{l1, l2} {
		if i == 1 {
			select { // the first worker is inside, or gave up before
			case <-m.first:
			case <-done[0]:
			}
		}
		done[i] = make(chan struct{})
		go func() {
			defer close(done[i])
			name := fmt.Sprintf("worker %d", i+1)
			o.Paid[i], o.Errs[i] = l.Close(context.WithValue(ctx, workerKey{}, name), acct)
			if o.Errs[i] != nil {
				p.printf("  %s: %v\n", name, o.Errs[i])
			} else {
				p.printf("  %s: closed %s, paid out %d\n", name, acct, o.Paid[i])
			}
		}()
	}
	<-done[0]
	<-done[1]
	if err := ctx.Err(); err != nil {
		return o, err
	}

	m.mu.Lock()
	o.Overlap, o.Holds = m.overlap, m.holds
	m.mu.Unlock()
	var err error
	o.Balance, err = l1.Balance(ctx, acct)
	return o, err
}

// workerKey is the context key of the worker's name.
type workerKey struct{}

// meeting watches Withdraw's critical section, to see whether two workers
// are ever in it at once.
type meeting struct {
	p    *printer
	wait time.Duration

	mu      sync.Mutex
	in      int   // workers inside now
	holds   []int // Holds() of each arrival
	overlap bool
	first   chan struct{} // closed when a worker first gets in
	both    chan struct{} // closed when two are in at once
}

// enter is Ledger.inside: it records the worker's arrival, then waits, up
// to m.wait, to see the other worker inside too.
func (m *meeting) enter(ctx context.Context, holds int) (leave func()) {
	m.mu.Lock()
	m.in++
	m.holds = append(m.holds, holds)
	m.p.printf("  %s: in Withdraw, nested in Close: holds %d\n", ctx.Value(workerKey{}), holds)
	if len(m.holds) == 1 {
		close(m.first)
	}
	if m.in == 2 && !m.overlap {
		m.overlap = true
		close(m.both)
	}
	m.mu.Unlock()

	t := time.NewTimer(m.wait)
	defer t.Stop()
	select {
	case <-m.both:
	case <-t.C:
	case <-ctx.Done():
	}
	return func() {
		m.mu.Lock()
		m.in--
		m.mu.Unlock()
	}
}

// printer writes the lines of concurrent workers whole.
type printer struct {
	mu sync.Mutex
	w  io.Writer
}

func (p *printer) printf(format string, args ...any) {
	p.mu.Lock()
	defer p.mu.Unlock()
	fmt.Fprintf(p.w, format, args...)
}
