package redislock

import (
	"container/heap"
	"context"
	"fmt"
	"github.com/redislock/redislock/internal/clock"
	"github.com/redislock/redislock/internal/store"
	"sync"
	"time"

	"github.com/zeromicro/go-zero/core/logx"
)

// The watchdog: one scheduler per Locker and clock (the locks of
// NewRedisLock share their store's Locker) keeps every live hold's
// deadlines: it renews the holds whose renewal is due with as few round
// trips as it can (a pipeline of owner-checked renewals, up to maxBatch a
// round trip, where the store has pipelines; else one call per hold), ends
// a hold whose lease ran out by our own accounting, and ends a hold at its
// maximum hold.
//
// It runs on one timer, not in a goroutine of its own, armed for the
// earliest deadline of all its holds: when it fires, the timer's goroutine
// takes the holds that are due, re-queues them by their next deadline,
// re-arms the timer, and only then sends the renewals and records the
// replies. A batch stuck in the network thus holds up no deadline: the next
// run ends its holds when their leases run out. A held lock has no timer
// and no goroutine of its own.

// maxBatch caps the renewals of one pipeline.
const maxBatch = 1000

// renewals is a renewal scheduler: every live hold of its Locker on its
// clock, by its next deadline.
type renewals struct {
	locker *Locker

	mu      sync.Mutex
	queue   holdQueue   // live holds, earliest deadline first
	wake    clock.Timer // runs the scheduler; nil until first armed
	armedAt time.Time   // when wake fires; zero when it is not armed
	lastRun time.Time   // when the latest run began
	runs    int         // runs under way, with their batches
}

// holdQueue is a min-heap of holds by due.
type holdQueue []*hold

func (q holdQueue) Len() int           { return len(q) }
func (q holdQueue) Less(i, j int) bool { return q[i].due.Before(q[j].due) }
func (q holdQueue) Swap(i, j int) {
	q[i], q[j] = q[j], q[i]
	q[i].index, q[j].index = i, j
}
func (q *holdQueue) Push(x any) {
	h := x.(*hold)
	h.index = len(*q)
	*q = append(*q, h)
}
func (q *holdQueue) Pop() any {
	old := *q
	h := old[len(old)-1]
	old[len(old)-1] = nil
	h.index = -1
	*q = old[:len(old)-1]
	return h
}

// nextDeadline returns when the scheduler must next look at h: its lease
// deadline, its maximum hold, and its next renewal (not before notBefore)
// unless one is in the network or it does not renew. The caller holds
// h.rl.mu.
func (h *hold) nextDeadline(notBefore time.Time) time.Time {
	at := h.until
	if m := h.rl.maxHold; m > 0 && h.started.Add(m).Before(at) {
		at = h.started.Add(m)
	}
	if renew := clock.Later(h.nextRenew, notBefore); h.state == renewing && h.renewal == nil && h.rl.watchdog && renew.Before(at) {
		at = renew
	}
	return at
}

// schedule (re)queues h by its next deadline. A renewal comes due no sooner
// than a thirtieth of its lease after the last run, so that holds taken one
// after another (whose acquisitions waited for a connection, say) share a
// batch instead of each sending its own. The caller holds h.rl.mu.
func (s *renewals) schedule(h *hold) {
	s.mu.Lock()
	defer s.mu.Unlock()
	h.due = h.nextDeadline(s.lastRun.Add(h.lease / 30))
	if h.index >= 0 && h.index < len(s.queue) && s.queue[h.index] == h {
		heap.Fix(&s.queue, h.index)
	} else {
		heap.Push(&s.queue, h)
	}
	if first := s.queue[0].due; s.armedAt.IsZero() || first.Before(s.armedAt) {
		s.armLocked(first)
	}
}

// remove takes h out of the queue: it ended. The caller holds h.rl.mu.
func (s *renewals) remove(h *hold) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if h.index >= 0 && h.index < len(s.queue) && s.queue[h.index] == h {
		heap.Remove(&s.queue, h.index)
		s.idledLocked()
	}
}

// idledLocked stops the timer of a scheduler with nothing left to do. The
// caller holds s.mu and has just removed a hold or ended a run.
func (s *renewals) idledLocked() {
	if len(s.queue) == 0 && s.runs == 0 {
		if s.wake != nil {
			s.wake.Stop()
		}
		s.armedAt = time.Time{}
	}
}

func (s *renewals) armLocked(at time.Time) {
	s.armedAt = at
	d := at.Sub(s.locker.clock.Now())
	if s.wake == nil {
		s.wake = s.locker.clock.WatchFunc(d, s.run)
	} else {
		s.wake.Reset(d)
	}
}

// run is one run of the scheduler, in its timer's goroutine: it deals with
// the holds that are due, renewing those whose renewal is due (or due
// within a thirtieth of their lease, so that holds taken at different
// times share batches).
func (s *renewals) run() {
	if !s.locker.enter() {
		return // closed
	}
	defer s.locker.wg.Done()
	s.mu.Lock()
	s.armedAt = time.Time{}
	now := s.locker.clock.Now()
	s.lastRun = now
	var due []*hold
	for len(s.queue) > 0 && !s.queue[0].due.After(now.Add(s.queue[0].lease/30)) {
		due = append(due, heap.Pop(&s.queue).(*hold))
	}
	s.runs++
	s.mu.Unlock()

	inFlight := make(chan struct{})
	var batch []*hold
	for _, h := range due {
		if h.rl.dueLocked(h, now, inFlight) {
			batch = append(batch, h)
		}
	}
	s.mu.Lock()
	if s.armedAt.IsZero() && len(s.queue) > 0 {
		s.armLocked(s.queue[0].due) // before the batch: its deadlines hold
	}
	s.mu.Unlock()

	for len(batch) > 0 {
		n := min(len(batch), maxBatch)
		renewBatch(batch[:n], now)
		batch = batch[n:]
	}
	close(inFlight)

	s.mu.Lock()
	s.runs--
	s.idledLocked()
	s.mu.Unlock()
}

// dueLocked deals with h, taken from its scheduler's queue at now: it ends
// h at its maximum hold or when its lease ran out, marks it in flight
// (true) when its renewal is due, and requeues it if it is still live.
func (rl *RedisLock) dueLocked(h *hold, now time.Time, inFlight chan struct{}) (renew bool) {
	rl.mu.Lock()
	defer rl.mu.Unlock()
	switch {
	case !h.live():
		return false
	case rl.maxHold > 0 && !now.Before(h.started.Add(rl.maxHold)):
		rl.maxHoldReachedLocked(h)
		return false
	case !now.Before(h.until):
		rl.leaseRanOutLocked(h)
		return false
	case h.state == renewing && h.renewal == nil && rl.watchdog && !h.nextRenew.After(now.Add(h.lease/30)):
		h.renewal = inFlight
		renew = true
	}
	h.renewals.schedule(h)
	return renew
}

// renewBatch renews holds, all of one Locker, sent at sent, and records
// each reply:
// renewed; gone or taken (that hold ends with ErrLockLost); or an error
// (retried with backoff). On a single primary one script renews up to
// perScript holds, which costs the server and the client less than a call
// each; elsewhere (a cluster, a ring) each hold has its own call, sent to
// its server. The batch is bounded by the latest lease deadline among its
// holds: the scheduler ends each hold on time, whatever the batch does.
func renewBatch(holds []*hold, sent time.Time) {
	st := holds[0].rl.store
	group := 1
	if st.Single {
		group = perScript
	}
	var calls []*store.Call
	var tags [][]*hold // each call's holds
	var longest time.Duration
	for i, h := range holds {
		h.rl.mu.Lock()
		left := max(h.until.Sub(sent), time.Millisecond)
		h.rl.mu.Unlock()
		longest = max(longest, left)
		if h.renewArgs[0] == nil {
			h.renewArgs = [2]any{h.id, h.lease.Milliseconds()}
		}
		ctx := h.parent // a call of its own (no pipelines) is bounded by its lease deadline too
		if !st.Pipelined() {
			var cancel context.CancelFunc
			ctx, cancel = context.WithTimeout(ctx, left)
			defer cancel()
		}
		if last := len(calls) - 1; last >= 0 && len(calls[last].Keys) < group {
			c := calls[last]
			c.Keys = append(c.Keys, h.rl.key)
			c.Args = append(c.Args, h.renewArgs[:]...)
			tags[last] = append(tags[last], h)
			continue
		}
		n := min(group, len(holds)-i) // sized once: no growing over 100 keys
		calls = append(calls, &store.Call{Ctx: ctx, Script: store.Extend, Keys: append(make([]string, 0, n), h.rl.key),
			Args: append(make([]any, 0, 2*n), h.renewArgs[:]...)})
		tags = append(tags, append(make([]*hold, 0, n), h))
	}
	for i, c := range calls {
		c.Tag = tags[i]
	}
	ctx, cancel := context.WithTimeout(context.Background(), longest)
	defer cancel()
	st.RunAll(ctx, calls, func(done []*store.Call) { recordRenewals(done, sent) })
}

// recordRenewals records the replies of calls, the renewals of the holds
// each is tagged with, sent at sent.
func recordRenewals(calls []*store.Call, sent time.Time) {
	var renewed, lost, failed float64
	for _, c := range calls {
		holds := c.Tag.([]*hold)
		codes, err := store.RenewalCodes(c, len(holds))
		for j, h := range holds {
			switch {
			case err != nil:
				failed++
			case codes[j] == 1:
				renewed++
			default:
				lost++
			}
			if h.rl.renewed(h, sent, codes[j] == 1, err) {
				// Round trips of their own, never on the scheduler's
				// path: the other holds' renewals must not wait for them.
				h.rl.letGo(h.parent, h.id, h.lease, 0, false)
			}
		}
	}
	for result, n := range map[string]float64{"ok": renewed, "lost": lost, "failed": failed} {
		if n > 0 {
			metricRenewals.Add(n, result)
		}
	}
}

// perScript caps the keys one extend.lua call renews: a call over 100 keys
// keeps the server busy for about a tenth of a millisecond.
const perScript = 100

// renewed records the reply to a renewal of h sent at sent (its batch
// counts the metrics). It reports true when the renewal must be undone:
// the hold ended while it was in the network (its lease ran out, its
// maximum hold, a loss, or a release that left the key to expire), yet it
// got through, so the key carries our id for a new lease and nobody will
// use it. (After a release that deleted the key, there is nothing to undo:
// the renewal either came first, or found nothing.)
func (rl *RedisLock) renewed(h *hold, sent time.Time, ok bool, err error) (undo bool) {
	interval := h.lease / 3
	rl.mu.Lock()
	defer rl.mu.Unlock()
	h.renewal = nil
	switch {
	case !h.live() && ok:
		return h.err != nil || h.keyLeft
	case !h.live():
	case err != nil:
		h.lastErr = err
		h.failures++
		backoff := clock.Backoff(interval, h.failures)
		h.nextRenew = rl.clock.Now().Add(backoff)
		if h.state == renewing {
			logx.Errorf("redislock: renewing %q (owner %s) failed, attempt %d, retrying in %v: %s",
				rl.key, h.id, h.failures, backoff, bare(err))
		}
		h.renewals.schedule(h)
	case !ok:
		rl.endLocked(h, rl.lostErr("renewal found the key gone or taken"))
	default:
		rl.extendedLocked(h, sent)
		h.failures = 0
		h.nextRenew = sent.Add(interval)
		h.renewals.schedule(h)
	}
	return false
}

// maxHoldReachedLocked ends h at its maximum hold and then releases the
// lock, in that order: Done closes and Until turns zero before the key can
// be taken by anyone else, so the holder never believes it holds a lock
// that another may hold. A Release of that hold returns once this release
// is over (within its context). The caller holds rl.mu.
func (rl *RedisLock) maxHoldReachedLocked(h *hold) {
	releasing := make(chan struct{})
	h.selfRelease = releasing
	rl.endLocked(h, fmt.Errorf("%w: %q held for %v", ErrMaxHoldExceeded, rl.key, rl.maxHold))
	rl.locker.spawn(func() { // a round trip of its own, never on the scheduler's path
		defer close(releasing)
		rl.letGo(h.parent, h.id, h.lease, 0, true)
	})
}
