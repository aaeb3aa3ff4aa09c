package redislock

import (
	"container/heap"
	"context"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
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
	queue   holdQueue // live holds, earliest deadline first
	wake    timer     // runs the scheduler; nil until first armed
	armedAt time.Time // when wake fires; zero when it is not armed
	runs    int       // runs under way, with their batches
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
// deadline, its maximum hold, and its next renewal unless one is in the
// network or it does not renew. The caller holds h.rl.mu.
func (h *hold) nextDeadline() time.Time {
	if h.state == queued { // only its refresh
		if h.renewal != nil {
			return h.nextRenew.Add(h.lease) // its reply reschedules it
		}
		return h.nextRenew
	}
	at := h.until
	if m := h.rl.maxHold; m > 0 && h.started.Add(m).Before(at) {
		at = h.started.Add(m)
	}
	if h.state == renewing && h.renewal == nil && h.rl.watchdog && h.nextRenew.Before(at) {
		at = h.nextRenew
	}
	return at
}

// schedule (re)queues h by its next deadline. The caller holds h.rl.mu.
func (s *renewals) schedule(h *hold) {
	due := h.nextDeadline()
	s.mu.Lock()
	defer s.mu.Unlock()
	h.due = due
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

func (s *renewals) idleLocked() bool { return len(s.queue) == 0 && s.runs == 0 }

// idledLocked stops the timer of a scheduler with nothing left to do. The
// caller holds s.mu and has just removed a hold or ended a run.
func (s *renewals) idledLocked() {
	if !s.idleLocked() {
		return
	}
	if s.wake != nil {
		s.wake.Stop()
	}
	s.armedAt = time.Time{}
}

// stop stops the timer for good: Close ended every hold.
func (s *renewals) stop() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.wake != nil {
		s.wake.Stop()
	}
	s.armedAt = time.Time{}
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
		renewByServer(batch[:n], now)
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
	case h.state == queued:
		if h.renewal == nil && !h.nextRenew.After(now.Add(h.lease/30)) {
			h.renewal = inFlight
			renew = true
		}
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

// renewByServer renews batch, sent at sent: where the store spreads keys
// over servers (a cluster or a ring), one pipeline per server, all at once,
// so that a slow or paused server holds up the replies of its own holds
// only, and the others' renewals count at once.
func renewByServer(batch []*hold, sent time.Time) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	send := func(g []*hold) { renewBatch(g, sent) }
	if !eachServer(ctx, batch[0].rl.store, batch, func(h *hold) string { return h.rl.key }, send) {
		send(batch)
	}
}

// eachServer splits items by the server of their key (key(item)), and calls
// send with each server's items, all at once, returning when every call
// has. It reports false, calling nothing, when the store has one server (or
// hides its servers) or all the items are on one.
func eachServer[T any](ctx context.Context, store Scripter, items []T, key func(T) string, send func([]T)) bool {
	server := serverOf(store)
	if server == nil || len(items) < 2 {
		return false
	}
	groups := map[string][]T{}
	for _, item := range items {
		addr := server(ctx, key(item))
		groups[addr] = append(groups[addr], item)
	}
	if len(groups) < 2 {
		return false
	}
	var wg sync.WaitGroup
	for _, g := range groups {
		wg.Add(1)
		go func() {
			defer wg.Done()
			send(g)
		}()
	}
	wg.Wait()
	return true
}

// serverOf returns the address of the server that holds a key of store,
// as the client sees it now ("" when it does not know); nil when the store
// has one server, or hides its servers.
func serverOf(store Scripter) func(ctx context.Context, key string) string {
	g, ok := store.(goRedis)
	if !ok {
		return nil
	}
	addr := func(c *redis.Client, err error) string {
		if err != nil {
			return ""
		}
		return c.Options().Addr
	}
	switch c := g.c.(type) {
	case *redis.ClusterClient:
		return func(ctx context.Context, key string) string { return addr(c.MasterForKey(ctx, key)) }
	case *redis.Ring:
		return func(_ context.Context, key string) string { return addr(c.GetShardClientForKey(key)) }
	}
	return nil
}

// renewBatch renews holds, all of one store, sent at sent, and records each
// reply: renewed; gone or taken (that hold ends with ErrLockLost); or an
// error (retried with backoff). A failure of the whole batch is transient
// for all of them and changes no deadline.
func renewBatch(batch []*hold, sent time.Time) {
	codes, errs, refresh := extendAll(batch, sent)
	var renewed, lost, failed float64
	var undo []*hold
	for i, h := range batch {
		if refresh[i] { // a fair lock's waiter, kept live in its queue
			h.rl.refreshed(h, sent, codes[i], errs[i])
			continue
		}
		switch {
		case errs[i] != nil:
			failed++
		case codes[i] == 1:
			renewed++
		default:
			lost++
		}
		if h.rl.renewed(h, sent, codes[i] == 1, errs[i]) {
			undo = append(undo, h)
		}
	}
	if len(undo) > 0 {
		// Round trips of their own, never on the scheduler's path: the
		// other holds' renewals must not wait for them.
		for _, h := range undo {
			h.rl.letGo(h.parent, h.id, h.lease, 0, false)
		}
	}
	for result, n := range map[string]float64{"ok": renewed, "lost": lost, "failed": failed} {
		if n > 0 {
			metricRenewals.Add(n, result)
		}
	}
}

// extendAll sends the renewals of holds, and the refreshes of those that
// are fair waiters (refresh), with each reply's code: one pipeline where
// the store has them, else one call each.
func extendAll(holds []*hold, sent time.Time) (codes []int64, errs []error, refresh []bool) {
	codes, errs, refresh = make([]int64, len(holds)), make([]error, len(holds)), make([]bool, len(holds))
	seqs := make([]int64, len(holds))
	// The batch's deadline is the latest validity deadline among its holds:
	// the scheduler ends each hold on time, whatever the batch does.
	var until time.Time
	for i, h := range holds {
		h.rl.mu.Lock()
		if h.until.After(until) {
			until = h.until
		}
		refresh[i], seqs[i] = h.state == queued, h.seq
		h.rl.mu.Unlock()
	}
	rl := holds[0].rl
	pipelined := pipelineOf(rl.store)
	if pipelined == nil {
		for i, h := range holds {
			ctx, cancel := h.rl.renewalContext(h, sent)
			if refresh[i] {
				codes[i], errs[i] = h.rl.refresh(ctx, h, seqs[i])
			} else {
				var ok bool
				ok, errs[i] = h.rl.extend(ctx, h.id, h.lease)
				codes[i] = b2i(ok)
			}
			cancel()
		}
		return codes, errs, refresh
	}
	ctx, cancel := context.WithTimeout(context.Background(), max(until.Sub(sent), time.Millisecond))
	defer cancel()
	useEval := rl.evaler != nil // go-zero: never a NOSCRIPT for its breaker
	// On a single primary every key is local: one script renews up to
	// perScript of them, which costs the server and the client less than a
	// call each. Elsewhere (a cluster or a ring) each key has its own call,
	// and the client sends each to its node. A waiter's refresh is a call
	// of its own.
	group := 1
	if singlePrimary(rl.store) {
		group = perScript
	}
	type call struct {
		first, n int
		cmd      *redis.Cmd
	}
	var calls []call
	for i := 0; i < len(holds); {
		n := 1
		for !refresh[i] && i+n < len(holds) && n < group && !refresh[i+n] {
			n++
		}
		calls = append(calls, call{first: i, n: n})
		i += n
	}
	send := func(which []int, eval bool) {
		err := pipelined(ctx, func(p redis.Pipeliner) error {
			for _, c := range which {
				first := calls[c].first
				if refresh[first] {
					calls[c].cmd = queueRefresh(ctx, p, holds[first], seqs[first], eval)
				} else {
					calls[c].cmd = queueRenewals(ctx, p, holds[first:first+calls[c].n], eval)
				}
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
			most := int64(1)
			if refresh[call.first] {
				most = 2
			}
			readRenewals(call.cmd, most, codes[call.first:call.first+call.n], errs[call.first:call.first+call.n])
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
	return codes, errs, refresh
}

func b2i(b bool) int64 {
	if b {
		return 1
	}
	return 0
}

// queueRefresh queues the refresh of h, a fair lock's waiter at place seq
// in its queue, in p.
func queueRefresh(ctx context.Context, p redis.Pipeliner, h *hold, seq int64, eval bool) *redis.Cmd {
	keys := []string{h.rl.key, h.rl.queue, h.rl.waiters}
	lease, wants := h.lease.Milliseconds(), h.rl.wants(h.lease)
	if eval {
		return p.Eval(ctx, fairRefreshSource, keys, h.id, lease, seq, wants)
	}
	return p.EvalSha(ctx, fairRefreshScript.Hash(), keys, h.id, lease, seq, wants)
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

// readRenewals reads the reply of queueRenewals (or queueRefresh) into codes
// and errs, one per hold: each code from 0 to most.
func readRenewals(cmd *redis.Cmd, most int64, codes []int64, errs []error) {
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
	for i := range codes {
		var n int64 = -1
		if i < len(values) && len(values) == len(codes) {
			n, _ = values[i].(int64)
		}
		if n >= 0 && n <= most {
			codes[i], errs[i] = n, nil
		} else {
			errs[i] = fmt.Errorf("%w: %T %.64v where 0 to %d was due", ErrUnexpectedReply, reply, reply, most)
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

// retryBackoff is the wait before renewal attempt n+1 after n failures in a
// row: interval/8, doubling, at most interval/2, and at least 1ms.
func retryBackoff(interval time.Duration, failures int) time.Duration {
	d := interval / 8
	for i := 1; i < failures && d < interval/2; i++ {
		d *= 2
	}
	return max(min(d, interval/2), time.Millisecond)
}
