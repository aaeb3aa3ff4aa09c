package redislock

import (
	"container/heap"
	"context"
	"fmt"
	"reflect"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/zeromicro/go-zero/core/logx"
)

// The watchdog: one renewal scheduler per Locker (and one per store and
// clock for the locks of NewRedisLock, shared through a registry) renews
// every hold that is due with as few round trips as it can: a pipeline of
// owner-checked renewals, up to maxBatch a round trip, where the store has
// pipelines (go-redis clients, go-zero's store), else one call per hold.
//
// It runs on one timer, not in a goroutine of its own: when renewals are
// due, the timer's goroutine sends them, records the replies, and arms the
// timer for the next. Runs never overlap. A hold costs no timer of its own
// for renewal; its lease deadline has one (h.timer), which a successful
// renewal pushes back, so that it fires only when the lease really runs
// out, even while a batch is stuck in the network.

// maxBatch caps the renewals of one pipeline.
const maxBatch = 1000

// renewals is a renewal scheduler: the holds it renews, by next renewal.
type renewals struct {
	clock clock
	key   any // in the registry; nil for a Locker's

	mu      sync.Mutex
	queue   holdQueue // renewing holds not in a batch, earliest first
	wake    timer     // runs the scheduler; nil until first armed
	running bool      // a run is under way; it arms wake when it ends
}

// holdQueue is a min-heap of holds by nextRenew.
type holdQueue []*hold

func (q holdQueue) Len() int           { return len(q) }
func (q holdQueue) Less(i, j int) bool { return q[i].nextRenew.Before(q[j].nextRenew) }
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

// registry holds the schedulers of the locks of NewRedisLock, one per store
// and clock, while they renew anything: a store that holds nothing is
// forgotten.
var registry = struct {
	sync.Mutex
	m map[any]*renewals
}{m: map[any]*renewals{}}

type registryKey struct {
	store any
	clock clock
}

// scheduler returns the scheduler that renews rl's holds.
func (rl *RedisLock) scheduler() *renewals {
	if rl.locker != nil {
		return rl.locker.renewalsFor(rl.clock)
	}
	var key any = rl // a store that cannot be compared: a scheduler per lock
	if reflect.ValueOf(rl.store).Comparable() && reflect.ValueOf(rl.clock).Comparable() {
		key = registryKey{rl.store, rl.clock}
	}
	registry.Lock()
	defer registry.Unlock()
	s := registry.m[key]
	if s == nil {
		s = &renewals{clock: rl.clock, key: key}
		registry.m[key] = s
	}
	return s
}

// add puts h in the scheduler's queue for a renewal at h.nextRenew.
// The caller holds h.rl.mu.
func (s *renewals) add(h *hold) {
	if s.key != nil {
		registry.Lock()
		defer registry.Unlock()
		if registry.m[s.key] == nil { // forgotten while idle: known again
			registry.m[s.key] = s
		}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	heap.Push(&s.queue, h)
	if !s.running && s.queue[0] == h {
		s.armLocked(h.nextRenew)
	}
}

// remove takes h out of the queue (its hold ended, or stopped renewing).
// The caller holds h.rl.mu.
func (s *renewals) remove(h *hold) {
	if s.key != nil {
		registry.Lock()
		defer registry.Unlock()
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if h.index >= 0 && h.index < len(s.queue) && s.queue[h.index] == h {
		heap.Remove(&s.queue, h.index)
	}
	s.forgetIfIdleLocked()
}

// forgetIfIdleLocked drops an idle scheduler from the registry. The caller
// holds s.mu, and registry's lock when s is in the registry.
func (s *renewals) forgetIfIdleLocked() {
	if len(s.queue) == 0 && !s.running {
		if s.wake != nil {
			s.wake.Stop()
		}
		if s.key != nil && registry.m[s.key] == s {
			delete(registry.m, s.key)
		}
	}
}

func (s *renewals) armLocked(at time.Time) {
	d := at.Sub(s.clock.Now())
	if s.wake == nil {
		s.wake = s.clock.WatchFunc(d, s.run)
	} else {
		s.wake.Reset(d)
	}
}

// run is one run of the scheduler, in its timer's goroutine: it renews the
// holds that are due (and those due within a tenth of their renewal
// interval, so that holds taken at different times share batches), then
// arms the timer for the next.
func (s *renewals) run() {
	s.mu.Lock()
	if s.running {
		s.mu.Unlock()
		return
	}
	s.running = true
	now := s.clock.Now()
	var due []*hold
	for len(s.queue) > 0 {
		h := s.queue[0]
		if h.nextRenew.After(now.Add(h.lease / 30)) {
			break
		}
		due = append(due, heap.Pop(&s.queue).(*hold))
	}
	s.mu.Unlock()

	for len(due) > 0 {
		n := min(len(due), maxBatch)
		renewBatch(due[:n], now)
		due = due[n:]
	}

	if s.key != nil {
		registry.Lock()
		defer registry.Unlock()
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.running = false
	if len(s.queue) > 0 {
		s.armLocked(s.queue[0].nextRenew)
	}
	s.forgetIfIdleLocked()
}

// renewBatch renews holds, all of one store, sent at sent, and records each
// reply: renewed; gone or taken (that hold ends with ErrLockLost); or an
// error (retried with backoff). A failure of the whole batch is transient
// for all of them and changes no deadline.
func renewBatch(holds []*hold, sent time.Time) {
	inFlight := make(chan struct{})
	var batch []*hold
	for _, h := range holds {
		rl := h.rl
		rl.mu.Lock()
		pastMaxHold := rl.maxHold > 0 && !sent.Before(h.started.Add(rl.maxHold))
		if h.state == renewing && !pastMaxHold { // the maximum hold ends it
			h.renewal = inFlight
			batch = append(batch, h)
		}
		rl.mu.Unlock()
	}
	defer close(inFlight)
	if len(batch) == 0 {
		return
	}
	ok, errs := extendAll(batch, sent)
	var renewed, lost, failed float64
	var undo []*hold
	for i, h := range batch {
		switch {
		case errs[i] != nil:
			failed++
		case ok[i]:
			renewed++
		default:
			lost++
		}
		if h.rl.renewed(h, sent, ok[i], errs[i]) {
			undo = append(undo, h)
		}
	}
	if len(undo) > 0 {
		// Round trips of their own, never on the scheduler's path: the
		// other holds' renewals must not wait for them.
		go func() {
			for _, h := range undo {
				h.rl.releaseQuietly(h.parent, h.id, h.lease)
			}
		}()
	}
	for result, n := range map[string]float64{"ok": renewed, "lost": lost, "failed": failed} {
		if n > 0 {
			metricRenewals.Add(n, result)
		}
	}
}

// extendAll sends the renewals of holds: one pipeline where the store has
// them, else one call each.
func extendAll(holds []*hold, sent time.Time) ([]bool, []error) {
	ok, errs := make([]bool, len(holds)), make([]error, len(holds))
	rl := holds[0].rl
	pipelined := pipelineOf(rl.store)
	if pipelined == nil {
		for i, h := range holds {
			ctx, cancel := h.rl.renewalContext(h, sent)
			ok[i], errs[i] = h.rl.extend(ctx, h.id, h.lease)
			cancel()
		}
		return ok, errs
	}
	// The batch's deadline is the latest validity deadline among its holds:
	// each hold's own lease timer ends it on time.
	var until time.Time
	for _, h := range holds {
		h.rl.mu.Lock()
		if h.until.After(until) {
			until = h.until
		}
		h.rl.mu.Unlock()
	}
	ctx, cancel := context.WithTimeout(context.Background(), max(until.Sub(sent), time.Millisecond))
	defer cancel()
	useEval := rl.evaler != nil // go-zero: never a NOSCRIPT for its breaker
	// On a single primary every key is local: one script renews up to
	// perScript of them, which costs the server and the client less than a
	// call each. Elsewhere (a cluster or a ring) each key has its own call,
	// and the client sends each to its node.
	group := 1
	if singlePrimary(rl.store) {
		group = perScript
	}
	type call struct {
		first, n int
		cmd      *redis.Cmd
	}
	calls := make([]call, 0, (len(holds)+group-1)/group)
	for i := 0; i < len(holds); i += group {
		calls = append(calls, call{first: i, n: min(group, len(holds)-i)})
	}
	send := func(which []int, eval bool) {
		err := pipelined(ctx, func(p redis.Pipeliner) error {
			for _, c := range which {
				calls[c].cmd = queueRenewals(ctx, p, holds[calls[c].first:calls[c].first+calls[c].n], eval)
			}
			return nil
		})
		for _, c := range which {
			call := calls[c]
			if call.cmd == nil { // the pipeline failed before queueing it
				for i := call.first; i < call.first+call.n; i++ {
					errs[i] = cmpOr(err, fmt.Errorf("%w: renewal not sent", ErrUnexpectedReply))
				}
				continue
			}
			readRenewals(call.cmd, ok[call.first:call.first+call.n], errs[call.first:call.first+call.n])
		}
	}
	all := make([]int, len(calls))
	for i := range all {
		all[i] = i
	}
	send(all, useEval)
	if !useEval { // after a restart, failover or SCRIPT FLUSH: EVAL loads it again
		var noScript []int
		for c, call := range calls {
			if err := errs[call.first]; err != nil && strings.HasPrefix(err.Error(), "NOSCRIPT") {
				noScript = append(noScript, c)
			}
		}
		if len(noScript) > 0 {
			send(noScript, true)
		}
	}
	return ok, errs
}

// perScript caps the keys one extend_many.lua call renews: a call over
// 100 keys keeps the server busy for about a tenth of a millisecond.
const perScript = 100

// queueRenewals queues the renewal of holds in p: extend.lua for one hold,
// extend_many.lua for more.
func queueRenewals(ctx context.Context, p redis.Pipeliner, holds []*hold, eval bool) *redis.Cmd {
	if len(holds) == 1 {
		h := holds[0]
		if eval {
			return p.Eval(ctx, extendSource, h.rl.acquireKeys[:1], h.id, h.lease.Milliseconds())
		}
		return p.EvalSha(ctx, extendScript.Hash(), h.rl.acquireKeys[:1], h.id, h.lease.Milliseconds())
	}
	keys := make([]string, len(holds))
	args := make([]any, 0, 2*len(holds))
	for i, h := range holds {
		keys[i] = h.rl.key
		args = append(args, h.id, h.lease.Milliseconds())
	}
	if eval {
		return p.Eval(ctx, extendManySource, keys, args...)
	}
	return p.EvalSha(ctx, extendMany.Hash(), keys, args...)
}

// readRenewals reads the reply of queueRenewals into ok and errs, one per
// hold.
func readRenewals(cmd *redis.Cmd, ok []bool, errs []error) {
	reply, err := cmd.Result()
	if err != nil {
		for i := range errs {
			errs[i] = err
		}
		return
	}
	values, isArray := reply.([]any)
	if !isArray {
		values = []any{reply}
	}
	for i := range ok {
		var n int64 = -1
		if i < len(values) && len(values) == len(ok) {
			n, _ = values[i].(int64)
		}
		switch n {
		case 0, 1:
			ok[i], errs[i] = n == 1, nil
		default:
			errs[i] = fmt.Errorf("%w: %T %.64v where 0 or 1 was due", ErrUnexpectedReply, reply, reply)
		}
	}
}

// singlePrimary reports whether every key of store lives on one server: a
// go-redis Client (a failover client is one too).
func singlePrimary(store Scripter) bool {
	g, ok := store.(goRedis)
	if !ok {
		return false
	}
	_, ok = g.c.(*redis.Client)
	return ok
}

// pipelineOf returns how to send a pipeline through store; nil when it has
// none.
func pipelineOf(store Scripter) func(context.Context, func(redis.Pipeliner) error) error {
	type goRedisPipelines interface {
		Pipelined(context.Context, func(redis.Pipeliner) error) ([]redis.Cmder, error)
	}
	type goZeroPipelines interface {
		PipelinedCtx(context.Context, func(redis.Pipeliner) error) error
	}
	switch s := store.(type) {
	case goRedis:
		if p, ok := s.c.(goRedisPipelines); ok {
			return func(ctx context.Context, fn func(redis.Pipeliner) error) error {
				_, err := p.Pipelined(ctx, fn)
				return err
			}
		}
	case goZeroPipelines:
		return s.PipelinedCtx
	}
	return nil
}

// renewalContext bounds one renewal of h sent at sent, when renewals go one
// call each: by its lease deadline, and by the end of its holding context.
func (rl *RedisLock) renewalContext(h *hold, sent time.Time) (context.Context, context.CancelFunc) {
	rl.mu.Lock()
	timeout := h.until.Sub(sent)
	rl.mu.Unlock()
	return context.WithTimeout(h.parent, max(timeout, time.Millisecond))
}

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
		backoff := retryBackoff(interval, h.failures)
		h.nextRenew = rl.clock.Now().Add(backoff)
		if h.state == renewing {
			logx.Errorf("redislock: renewing %q (owner %s) failed, attempt %d, retrying in %v: %s",
				rl.key, h.id, h.failures, backoff, bare(err))
			h.renewals.add(h)
		}
	case !ok:
		rl.endLocked(h, rl.lostErr("renewal found the key gone or taken"))
	default:
		rl.extendedLocked(h, sent)
		h.timer.Reset(h.until.Sub(rl.clock.Now())) // fires only if the lease runs out
		h.failures = 0
		h.nextRenew = sent.Add(interval)
		if h.state == renewing {
			h.renewals.add(h)
		}
	}
	return false
}

// maxHoldReached ends h at its maximum hold and releases the lock, in that
// order: Done closes and Until turns zero before the key can be taken by
// anyone else, so the holder never believes it holds a lock that another
// may hold. A Release of that hold returns once this release is over
// (within its context).
func (rl *RedisLock) maxHoldReached(h *hold) {
	rl.mu.Lock()
	if !h.live() {
		rl.mu.Unlock()
		return
	}
	releasing := make(chan struct{})
	h.selfRelease = releasing
	rl.endLocked(h, fmt.Errorf("%w: %q held for %v", ErrMaxHoldExceeded, rl.key, rl.maxHold))
	rl.mu.Unlock()
	defer close(releasing)
	rl.releaseQuietly(h.parent, h.id, h.lease)
}

// retryBackoff is the wait before renewal attempt n+1 after n failures in a
// row: interval/8, doubling, at most interval/2, and at least 1ms.
func retryBackoff(interval time.Duration, failures int) time.Duration {
	d := interval / 8
	for i := 1; i < failures && d < interval/2; i++ {
		d *= 2
	}
	return max(min(d, interval/2), time.Millisecond)
}
