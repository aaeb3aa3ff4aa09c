package redislock

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/redislock/redislock/internal/store"
)

// An Election elects one leader at a time among the Elections of a key,
// in any processes: each term is a hold of a fair, fenced lock on the key,
// handed to the candidate that has waited longest, and the leader
// publishes a value that everyone can read (Leader) and follow (Observe).
// Make it with NewElection or Locker.NewElection. An Election is safe for
// concurrent use. See docs/election.md.
type Election struct {
	rl     *RedisLock
	leader string // the key of the leader's value, and the channel it is published on

	mu       sync.Mutex
	campaign *campaign // under way; nil when none

	said store.Proclaimed // the term and number of its latest proclaim; guarded by rl.op
}

// A campaign is a Campaign under way: Resign ends it (stop, with
// errResigned), then waits for it (done).
type campaign struct {
	stop context.CancelCauseFunc
	done chan struct{}
}

// NewElection returns an Election on key, stored through store. The lock
// options apply (WithExpiry, WithMaxHold, WithPrefix, WithWaitTimeout,
// WithReplicas, ...); its candidates are served in arrival order and its
// terms are fenced, whatever the options say. Invalid arguments are
// reported by the first call that needs them.
func NewElection(store Scripter, key string, opts ...Option) *Election {
	return newElection(store, key, nil, opts)
}

// NewElection returns an Election on key, within the Locker's prefix, as
// NewLock makes a lock.
func (l *Locker) NewElection(key string, opts ...Option) *Election {
	if l == nil || l.life.closing == nil {
		return NewElection(nil, key)
	}
	return newElection(l.store.Scripter, key, l, append(append([]Option{}, l.opts...), opts...))
}

func newElection(s Scripter, key string, l *Locker, opts []Option) *Election {
	rl := newRedisLock(s, key, l, append(opts, WithFairness(), WithFencing()))
	if rl.err == nil && (rl.opts.permits > 0 || rl.opts.shared) {
		rl.err = fmt.Errorf("%w: an election's leader leads alone", ErrInvalidPermits)
	}
	return &Election{rl: rl, leader: relatedName(rl.key, "leader")}
}

// Campaign waits until this Election leads, then publishes value as the
// leader's value, and returns nil. ctx bounds the wait only: once elected,
// the leadership lasts until Resign, its loss, the maximum hold, or the
// Locker's Close (Done closes then, Err says why). Giving up returns an
// error matching ErrNotAcquired and ctx's error, and leaves nothing of
// this candidate in Redis. A Campaign of an Election that campaigns or
// leads returns ErrCampaigning; one after a leadership ended forgets it.
func (e *Election) Campaign(ctx context.Context, value string) error {
	if err := e.lock().check(ctx); err != nil {
		return err
	}
	if value == "" {
		return ErrEmptyValue
	}
	ctx, stop := context.WithCancelCause(ctx)
	c := &campaign{stop: stop, done: make(chan struct{})}
	e.mu.Lock()
	if e.campaign != nil || e.IsLeader() {
		e.mu.Unlock()
		stop(nil)
		return opErr("campaign", e.rl.key, ErrCampaigning)
	}
	e.campaign = c
	e.mu.Unlock()
	if e.rl.endedHoldErr() != nil {
		e.rl.giveBackNow(nil) // its end was reported by Done and Err
	}
	defer func() {
		e.mu.Lock()
		e.campaign = nil
		e.mu.Unlock()
		stop(nil)
		close(c.done)
	}()
	resigned := func(err error) error { // a Resign's end is not the caller's context's
		if errors.Is(context.Cause(ctx), errResigned) && !e.rl.lockerClosed() {
			return opErr("campaign", e.rl.key, errResigned)
		}
		return err
	}
	for {
		err := e.rl.acquireWait(ctx, context.WithoutCancel(ctx))
		if errors.Is(err, ErrLockLost) && ctx.Err() == nil && !e.IsLeader() {
			continue // handed over after its lease ran out (a server paused): wait on
		}
		if err != nil {
			return resigned(err)
		}
		break
	}
	if err := e.proclaim(ctx, value); err != nil {
		_ = e.rl.releaseDetached(ctx, nil)
		if ctx.Err() != nil { // Resign, or the caller gave up, as it was elected
			return resigned(e.rl.gaveUp(ctx, nil))
		}
		return err
	}
	return nil
}

// errResigned is the error of a Campaign that a Resign ended.
var errResigned = fmt.Errorf("%w: Resign ended the campaign", ErrNotAcquired)

// Resign ends this Election's leadership at once (the next candidate is
// elected by its release), or its Campaign under way, which returns
// ErrNotAcquired. It reports ErrNotLeader when there is neither, and, as a
// lock's Release, why a leadership that ended by itself ended.
func (e *Election) Resign(ctx context.Context) error {
	if err := e.lock().check(ctx); err != nil {
		return err
	}
	e.mu.Lock()
	c := e.campaign
	e.mu.Unlock()
	if c != nil {
		c.stop(errResigned)
		select {
		case <-c.done:
		case <-ctx.Done():
			return opErr("resign", e.rl.key, ctx.Err())
		}
	}
	ok, err := e.rl.ReleaseCtx(ctx)
	switch {
	case err != nil:
		return err
	case !ok && c == nil:
		return opErr("resign", e.rl.key, ErrNotLeader)
	}
	return nil
}

// Proclaim changes the leader's value to value. It reports an error
// matching ErrNotLeader when this Election does not lead (and ErrLockLost
// too when it finds its term ended), and ErrWrongKind when the key of the
// leader's value holds another type.
func (e *Election) Proclaim(ctx context.Context, value string) error {
	if err := e.lock().check(ctx); err != nil {
		return err
	}
	if value == "" {
		return ErrEmptyValue
	}
	return e.proclaim(ctx, value)
}

// proclaim publishes value as the value of the leader this Election is.
func (e *Election) proclaim(ctx context.Context, value string) error {
	rl := e.rl
	if err := rl.lockOp(ctx); err != nil {
		return opErr("proclaim", rl.key, err)
	}
	defer rl.unlockOp()
	rl.mu.Lock()
	h := rl.liveHold()
	rl.mu.Unlock()
	if h == nil {
		return opErr("proclaim", rl.key, ErrNotLeader)
	}
	n := int64(1) // the term's first proclaim, or the next
	if e.said.Term == h.token {
		n = e.said.N + 1
	}
	e.said = store.Proclaimed{Term: h.token, N: n}
	reply, err := rl.locker.store.Run(ctx, store.Proclaim, []string{rl.key, e.leader}, h.id, value, e.leader, h.token, n)
	code, _ := reply.(int64)
	switch {
	case err != nil:
		return opErr("proclaim", rl.key, err)
	case code == 2:
		rl.locker.wakeupRefused(rl, e.leader)
	case code != 1:
		rl.mu.Lock()
		err := rl.endLocked(h, rl.lostErr("proclaim found the key gone or taken"))
		rl.mu.Unlock()
		return fmt.Errorf("%w: %w", ErrNotLeader, err)
	}
	return nil
}

// Leader returns the current leader's value: an error matching ErrNoLeader
// when nobody leads, or the leader has not proclaimed its value yet.
func (e *Election) Leader(ctx context.Context) (string, error) {
	if err := e.lock().check(ctx); err != nil {
		return "", err
	}
	p, _, err := e.read(ctx)
	switch {
	case err != nil:
		return "", err
	case p.Value == "":
		return "", opErr("leader", e.rl.key, ErrNoLeader)
	}
	return p.Value, nil
}

// read returns the leader's latest proclaim (its Value "" for none), and
// how long its term lasts without renewal (0: no term; negative: no
// expiry).
func (e *Election) read(ctx context.Context) (store.Proclaimed, time.Duration, error) {
	reply, err := e.rl.locker.store.Run(ctx, store.Leader, []string{e.rl.key, e.leader})
	if err == nil {
		p, left, err := store.ParseLeader(reply)
		if err == nil {
			return p, left, nil
		}
	}
	return store.Proclaimed{}, 0, opErr("leader", e.rl.key, err)
}

// Observe returns a channel of the leader's value: the current one, then
// each change (a new leader, or a Proclaim), in order; "" while nobody
// leads or the leader has not proclaimed yet. It follows releases and
// proclaims through pub/sub (see WithPubSub), reads again when its
// subscription comes back, and at the end of the leader's lease (a leader
// that died); without pub/sub it reads every lease/3. The channel is
// closed when ctx ends, or the Locker closes (Close waits for it).
func (e *Election) Observe(ctx context.Context) <-chan string {
	out := make(chan string)
	if e.lock().check(ctx) != nil || !e.rl.locker.life.shared && !e.rl.locker.enter() { // Close waits for it
		close(out)
		return out
	}
	l := e.rl.locker
	go func() {
		if !l.life.shared {
			defer l.life.wg.Done()
		}
		e.observe(ctx, out)
	}()
	return out
}

func (e *Election) observe(ctx context.Context, out chan<- string) {
	defer close(out)
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	defer context.AfterFunc(e.rl.locker.life.closing, cancel)()
	var heard <-chan any // releases, handoffs, proclaims, and each (re)subscription
	if sub := e.rl.opts.pubsub; sub != nil {
		if ps := sub.Subscribe(ctx, e.rl.names.channel, e.leader); ps != nil {
			defer ps.Close()
			heard = ps.ChannelWithSubscriptions()
			if !subscribed(ctx, heard, 2) {
				return
			}
		}
	}
	pace := time.Duration(e.rl.expiry.Load()) / 3
	timer := time.NewTimer(pace)
	defer timer.Stop()
	sent, shown := false, ""  // the value sent last
	var last store.Proclaimed // the latest proclaim sent
	emit := func(value string) bool {
		if sent && value == shown {
			return true
		}
		select {
		case out <- value:
			sent, shown = true, value
			return true
		case <-ctx.Done():
			return false
		}
	}
	// A read sends the latest proclaim; but while subscribed, one that
	// finds proclaims still to be heard since the last one sent (a read
	// after a handoff overtakes them) leaves them to be sent in order,
	// unless it may skip them: the first read, one after the subscription
	// came back (they were missed), one by the clock.
	for read, skip := true, true; ; {
		wait := pace
		if read {
			p, left, err := e.read(ctx)
			pending := err == nil && !skip && heard != nil && p.After(last) && !p.Next(last)
			switch {
			case err != nil || pending:
			case p.Value == "": // nobody leads, or the leader has not proclaimed yet
				if !emit("") {
					return
				}
			case p.After(last) || p == last:
				last = p
				if !emit(p.Value) {
					return
				}
			}
			if heard != nil && err == nil && !pending {
				wait = time.Hour // pub/sub tells
				if left > 0 {
					wait = left + time.Millisecond // a leader that died: its term ends with its lease
				}
			}
		}
		timer.Reset(wait)
		select {
		case <-ctx.Done():
			return
		case m := <-heard:
			msg, ok := m.(*redis.Message)
			if ok && msg.Channel == e.leader {
				p, parsed := store.ParseProclaimed(msg.Payload)
				if read, skip = !parsed, !parsed; parsed && p.After(last) {
					last = p
					if !emit(p.Value) {
						return
					}
				}
				continue
			}
			read, skip = true, !ok // a release or a handoff; a subscription back
		case <-timer.C:
			read, skip = true, true
		}
	}
}

// subscribed waits for the confirmations of n subscriptions on heard:
// reads made after them miss no message.
func subscribed(ctx context.Context, heard <-chan any, n int) bool {
	for n > 0 {
		select {
		case m := <-heard:
			if _, ok := m.(*redis.Subscription); ok {
				n--
			}
		case <-ctx.Done():
			return false
		}
	}
	return true
}

// IsLeader reports whether this Election leads.
func (e *Election) IsLeader() bool { return e.lock().Holds() > 0 }

// Term returns this leadership's fencing token: strictly greater than
// every earlier term's of the key; 0 when this Election does not lead.
func (e *Election) Term() int64 { return e.lock().Token() }

// Done returns a channel that is closed when this leadership ends (Resign,
// its loss, the maximum hold, Close); already closed when it does not
// lead.
func (e *Election) Done() <-chan struct{} { return e.lock().Done() }

// Err returns nil while this Election leads, and after Resign; else why its
// latest leadership ended (ErrLockLost, ErrMaxHoldExceeded, ...).
func (e *Election) Err() error { return e.lock().Err() }

// Key returns the election's Redis key.
func (e *Election) Key() string { return e.lock().Key() }

// lock returns the lock of e's terms; nil for a nil Election, whose calls
// then report ErrNilStore, or hold nothing.
func (e *Election) lock() *RedisLock {
	if e == nil {
		return nil
	}
	return e.rl
}
