// Package renew keeps leases alive: one Scheduler per Locker holds every
// lease of its locks in a heap by its next deadline, renews those that are
// due in batches (a pipeline per server, up to 100 leases a script on a
// single primary), and reports each lease's end (its deadline passed, its
// maximum hold came, its key found gone) through a callback. It knows
// nothing of locks: a lease is an owner, its keys, an id, a renewal script
// and deadlines.
//
// It runs on one timer, not in a goroutine of its own, armed for the
// earliest deadline: when it fires, the timer's goroutine takes what is
// due, re-queues it by its next deadline, re-arms the timer, and only then
// sends the renewals. A batch stuck in the network holds up no deadline.
package renew

import (
	"container/heap"
	"context"
	"sync"
	"time"

	"github.com/redislock/redislock/internal/clock"
	"github.com/redislock/redislock/internal/store"
)

// End is why a lease ended, as Scheduler reports it.
type End int

const (
	// RanOut: its deadline passed before a renewal got through; the error
	// reported is the latest renewal's failure, if any.
	RanOut End = iota
	// MaxHold: its maximum hold came.
	MaxHold
	// Gone: a renewal found its key gone or taken.
	Gone
	// Late: a renewal sent before the lease ended got through after: the
	// key was extended for nobody, and is the owner's to give back.
	Late
)

// Margin is what every lease loses in our accounting: 1% for clock drift
// and 2ms for timer and scheduling delays.
func Margin(lease time.Duration) time.Duration {
	return lease/100 + 2*time.Millisecond
}

// maxBatch caps the renewals of one pipeline; perScript the leases one
// script renews (over 100 keys keeps the server busy for a tenth of a
// millisecond).
const (
	maxBatch  = 1000
	perScript = 100
)

// A Lease is the renewal state of one key.
type Lease[T any] struct {
	owner   T
	ctx     context.Context // bounds its renewals when they go alone
	script  *store.Script   // renews it: its keys, then the next lease's; ARGV[2i-1] its id, ARGV[2i] its lease in ms
	keys    []string
	args    [2]any // id, lease in ms
	lease   time.Duration
	started time.Time // maxAt is its maximum hold; zero without one
	maxAt   time.Time

	// Guarded by its Scheduler's mu.
	state     state
	until     time.Time // its deadline by our accounting
	nextRenew time.Time
	inFlight  bool
	failures  int // renewals failed in a row
	lastErr   error
	due       time.Time // when the scheduler looks at it next
	index     int       // in the heap; -1 when out
}

// state is where a lease is.
type state int

const (
	renewing state = iota // the scheduler renews it
	stopped               // its deadlines only: nothing renews it
	ending                // taken for an end being reported
	removed               // out for good
)

// Scheduler renews leases. Make it with New.
type Scheduler[T any] struct {
	clock  clock.Clock
	store  *store.Store
	report func(T, End, error) // never called with mu held
	count  func(ok, lost, failed int)
	retry  func(T, Retry) // never called with mu held
	wg     sync.WaitGroup // runs under way

	mu      sync.Mutex
	queue   queue[T]
	wake    clock.Timer // runs the scheduler; nil until first armed
	armedAt time.Time   // zero when not armed
	lastRun time.Time
	runs    int
	closed  bool
}

// New returns a Scheduler on c and st that reports ends to report, counts
// each batch's renewals with count, and reports each failed renewal of a
// lease still renewed to retry.
func New[T any](c clock.Clock, st *store.Store, report func(T, End, error), count func(ok, lost, failed int),
	retry func(T, Retry)) *Scheduler[T] {
	return &Scheduler[T]{clock: c, store: st, report: report, count: count, retry: retry}
}

// A Retry is a failed renewal, to be made again: the how-manieth failure
// in a row, when the next is due, and why it failed.
type Retry struct {
	Attempt int
	In      time.Duration
	Err     error
}

// Add schedules the lease of keys, held by owner as id with a lease of
// lease, valid until until by our accounting, for a maximum hold of
// maxHold (0: none); renews says whether it is renewed, or only kept to
// its deadlines. ctx bounds its renewals when they go alone. It returns
// nil once the Scheduler is closed.
func (s *Scheduler[T]) Add(owner T, ctx context.Context, script *store.Script, keys []string, id string,
	lease time.Duration, until time.Time, maxHold time.Duration, renews bool) *Lease[T] {
	l := &Lease[T]{owner: owner, ctx: ctx, script: script, keys: keys, args: [2]any{id, lease.Milliseconds()},
		lease: lease, until: until, index: -1}
	l.started = until.Add(-(lease - Margin(lease))) // the acquisition was sent then, or later
	l.nextRenew = l.started.Add(lease / 3)
	if maxHold > 0 {
		l.maxAt = l.started.Add(maxHold)
	}
	if !renews {
		l.state = stopped
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil
	}
	s.scheduleLocked(l)
	return l
}

// Started returns when the acquisition of l was sent, or later.
func (l *Lease[T]) Started() time.Time { return l.started }

// Extended records a re-entry of l sent at sent that got through, and
// reports false when l is ending or removed.
func (s *Scheduler[T]) Extended(l *Lease[T], sent time.Time) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if l.state >= ending {
		return false
	}
	l.until, l.lastErr = clock.Later(l.until, sent.Add(l.lease-Margin(l.lease))), nil
	return true
}

// Stop stops renewing l: it keeps its deadlines.
func (s *Scheduler[T]) Stop(l *Lease[T]) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if l.state == renewing {
		l.state = stopped
		if l.index >= 0 {
			s.scheduleLocked(l)
		}
	}
}

// Remove takes l out for good: its owner ended it.
func (s *Scheduler[T]) Remove(l *Lease[T]) {
	s.mu.Lock()
	defer s.mu.Unlock()
	l.state = removed
	if l.index >= 0 {
		heap.Remove(&s.queue, l.index)
	}
	s.idleLocked()
}

// Until returns l's deadline by our accounting.
func (s *Scheduler[T]) Until(l *Lease[T]) time.Time {
	s.mu.Lock()
	defer s.mu.Unlock()
	return l.until
}

// InFlight reports whether a renewal of l is in the network.
func (s *Scheduler[T]) InFlight(l *Lease[T]) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return l.inFlight
}

// Close stops the Scheduler: no run starts any more, and Add returns nil.
// It returns the owners of the leases still scheduled.
func (s *Scheduler[T]) Close() []T {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.closed = true
	if s.wake != nil {
		s.wake.Stop()
	}
	owners := make([]T, len(s.queue))
	for i, l := range s.queue {
		owners[i] = l.owner
	}
	return owners
}

// Wait returns once no run is under way.
func (s *Scheduler[T]) Wait() { s.wg.Wait() }

// Len returns how many leases are scheduled, and Idle whether nothing is
// scheduled, run or armed.
func (s *Scheduler[T]) Len() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.queue)
}

func (s *Scheduler[T]) Idle() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.queue) == 0 && s.runs == 0 && s.armedAt.IsZero()
}

// scheduleLocked (re)queues l by its next deadline: its lease's end, its
// maximum hold, and its next renewal unless one is in the network or it
// is not renewed. A renewal comes due no sooner than a thirtieth of its
// lease after the last run, so that leases taken one after another share
// a batch.
func (s *Scheduler[T]) scheduleLocked(l *Lease[T]) {
	at := l.until
	if !l.maxAt.IsZero() && l.maxAt.Before(at) {
		at = l.maxAt
	}
	if renew := clock.Later(l.nextRenew, s.lastRun.Add(l.lease/30)); l.state == renewing && !l.inFlight && renew.Before(at) {
		at = renew
	}
	l.due = at
	if l.index >= 0 {
		heap.Fix(&s.queue, l.index)
	} else {
		heap.Push(&s.queue, l)
	}
	if first := s.queue[0].due; s.armedAt.IsZero() || first.Before(s.armedAt) {
		s.armLocked(first)
	}
}

func (s *Scheduler[T]) armLocked(at time.Time) {
	if s.closed {
		return
	}
	s.armedAt = at
	d := at.Sub(s.clock.Now())
	if s.wake == nil {
		s.wake = s.clock.WatchFunc(d, s.run)
	} else {
		s.wake.Reset(d)
	}
}

// idleLocked stops the timer of a Scheduler with nothing left to do.
func (s *Scheduler[T]) idleLocked() {
	if len(s.queue) == 0 && s.runs == 0 {
		if s.wake != nil {
			s.wake.Stop()
		}
		s.armedAt = time.Time{}
	}
}

// An end is one that a run reports.
type end[T any] struct {
	owner T
	end   End
	err   error
}

// retry is a Retry of owner's lease, to report once mu is released.
type retry[T any] struct {
	owner T
	Retry
}

// run is one run of the Scheduler, in its timer's goroutine: it ends the
// leases whose maximum hold came or whose deadline passed, and renews
// those whose renewal is due (or due within a thirtieth of their lease).
func (s *Scheduler[T]) run() {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return
	}
	s.wg.Add(1)
	defer s.wg.Done()
	s.armedAt = time.Time{}
	now := s.clock.Now()
	s.lastRun = now
	s.runs++
	var due, batch []*Lease[T]
	var ends []end[T]
	for len(s.queue) > 0 && !s.queue[0].due.After(now.Add(s.queue[0].lease/30)) {
		due = append(due, heap.Pop(&s.queue).(*Lease[T]))
	}
	for _, l := range due {
		switch {
		case !l.maxAt.IsZero() && !now.Before(l.maxAt):
			l.state = ending
			ends = append(ends, end[T]{l.owner, MaxHold, nil})
			continue
		case !now.Before(l.until):
			l.state = ending
			ends = append(ends, end[T]{l.owner, RanOut, l.lastErr})
			continue
		case l.state == renewing && !l.inFlight && !l.nextRenew.After(now.Add(l.lease/30)):
			l.inFlight = true
			batch = append(batch, l)
		}
		s.scheduleLocked(l)
	}
	if s.armedAt.IsZero() && len(s.queue) > 0 {
		s.armLocked(s.queue[0].due) // before the batch: its deadlines hold
	}
	s.mu.Unlock()

	for _, e := range ends {
		s.report(e.owner, e.end, e.err)
	}
	for len(batch) > 0 {
		n := min(len(batch), maxBatch)
		s.renew(batch[:n], now, false)
		batch = batch[n:]
	}
	s.mu.Lock()
	s.runs--
	s.idleLocked()
	s.mu.Unlock()
}

// renew renews leases sent at sent, and records each reply: renewed; gone
// (reported); or an error (retried with backoff). On a single primary one
// script renews up to perScript leases of one script, unless alone;
// elsewhere each has its own call, sent to its server. The batch is
// bounded by the latest deadline among its leases: the runs end each lease
// on time, whatever the batch does.
func (s *Scheduler[T]) renew(leases []*Lease[T], sent time.Time, alone bool) {
	group := 1
	if s.store.Single && !alone {
		group = perScript
	}
	var calls []*store.Call
	var tags [][]*Lease[T] // each call's leases; its Tag once complete (no boxing each append)
	var longest time.Duration
	s.mu.Lock()
	for i, l := range leases {
		left := max(l.until.Sub(sent), time.Millisecond)
		longest = max(longest, left)
		if last := len(calls) - 1; last >= 0 && len(tags[last]) < group && calls[last].Script == l.script {
			c := calls[last]
			c.Keys, c.Args = append(c.Keys, l.keys...), append(c.Args, l.args[:]...)
			tags[last] = append(tags[last], l)
			continue
		}
		ctx := l.ctx // a call of its own (no pipelines) is bounded by its deadline too
		if !s.store.Pipelined() {
			var cancel context.CancelFunc
			ctx, cancel = context.WithTimeout(ctx, left)
			defer cancel()
		}
		n := min(group, len(leases)-i) // sized once: no growing over 100 keys
		calls = append(calls, &store.Call{Ctx: ctx, Script: l.script, Keys: append(make([]string, 0, n*len(l.keys)), l.keys...),
			Args: append(make([]any, 0, 2*n), l.args[:]...)})
		tags = append(tags, append(make([]*Lease[T], 0, n), l))
	}
	s.mu.Unlock()
	for i, c := range calls {
		c.Tag = tags[i]
	}
	ctx, cancel := context.WithTimeout(context.Background(), longest)
	defer cancel()
	s.store.RunAll(ctx, calls, func(done []*store.Call) {
		if refused := s.renewed(done, sent); len(refused) > 0 {
			s.renew(refused, sent, true)
		}
	})
}

// renewed records the replies of calls, sent at sent, and returns the
// leases of the batches Redis refused whole (an ACL without one of their
// keys, say): each is to be renewed on its own, for an answer of its own.
func (s *Scheduler[T]) renewed(calls []*store.Call, sent time.Time) (refused []*Lease[T]) {
	var ok, lost, failed int
	var ends []end[T]
	var retries []retry[T]
	s.mu.Lock()
	for _, c := range calls {
		leases := c.Tag.([]*Lease[T])
		codes, err := store.RenewalCodes(c, len(leases))
		if err != nil && len(leases) > 1 && !store.Ambiguous(err) {
			refused = append(refused, leases...) // still in flight
			continue
		}
		for i, l := range leases {
			l.inFlight = false
			switch {
			case err != nil:
				failed++
			case codes[i] == 1:
				ok++
			default:
				lost++
			}
			switch {
			case l.state >= ending:
				if err == nil && codes[i] == 1 {
					ends = append(ends, end[T]{l.owner, Late, nil})
				}
			case err != nil:
				l.lastErr = err
				l.failures++
				backoff := clock.Backoff(l.lease/3, l.failures)
				l.nextRenew = s.clock.Now().Add(backoff)
				if l.state == renewing {
					retries = append(retries, retry[T]{l.owner, Retry{l.failures, backoff, err}})
				}
				s.scheduleLocked(l)
			case codes[i] == 0:
				l.state = ending
				if l.index >= 0 {
					heap.Remove(&s.queue, l.index)
				}
				ends = append(ends, end[T]{l.owner, Gone, nil})
			default:
				l.until, l.lastErr = clock.Later(l.until, sent.Add(l.lease-Margin(l.lease))), nil
				l.failures = 0
				l.nextRenew = sent.Add(l.lease / 3)
				s.scheduleLocked(l)
			}
		}
	}
	s.mu.Unlock()
	s.count(ok, lost, failed)
	for _, r := range retries {
		s.retry(r.owner, r.Retry)
	}
	for _, e := range ends {
		s.report(e.owner, e.end, e.err)
	}
	return refused
}

// queue is a min-heap of leases by due.
type queue[T any] []*Lease[T]

func (q queue[T]) Len() int           { return len(q) }
func (q queue[T]) Less(i, j int) bool { return q[i].due.Before(q[j].due) }
func (q queue[T]) Swap(i, j int) {
	q[i], q[j] = q[j], q[i]
	q[i].index, q[j].index = i, j
}
func (q *queue[T]) Push(x any) {
	l := x.(*Lease[T])
	l.index = len(*q)
	*q = append(*q, l)
}
func (q *queue[T]) Pop() any {
	old := *q
	l := old[len(old)-1]
	old[len(old)-1] = nil
	l.index = -1
	*q = old[:len(old)-1]
	return l
}
