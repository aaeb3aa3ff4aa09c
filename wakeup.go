package redislock

import (
	"cmp"
	"context"
	"errors"
	"github.com/redislock/redislock/internal/clock"
	"github.com/redislock/redislock/internal/store"
	"reflect"
	"slices"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/zeromicro/go-zero/core/logx"
)

// Subscriber is what wake-ups need from a go-redis client: Client,
// ClusterClient, Ring and every UniversalClient have it.
type Subscriber interface {
	Subscribe(ctx context.Context, channels ...string) *redis.PubSub
}

// WithPubSub sets the client whose pub/sub wakes AcquireWait when the lock is
// released. A RedisLock made with FromGoRedis uses that client by default;
// give one for go-zero's store, which exposes no pub/sub. WithPubSub(nil)
// turns wake-ups off: AcquireWait then paces its attempts by its
// RetryStrategy alone.
func WithPubSub(s Subscriber) Option {
	return func(o *options) {
		o.pubsub, o.pubsubSet = s, true
		if store.IsNil(s) {
			o.pubsub = nil
		}
	}
}

// How long a waiter waits for its subscription to be confirmed before its
// first attempt; past that it goes on and paces itself by its RetryStrategy.
const subscribeWait = time.Second

// linger is how long a hub keeps a channel subscribed, and itself open,
// after the last waiter on it left: a holder that waits again soon after
// its release, as on a busy key, finds its subscription made.
const linger = 100 * time.Millisecond

// A hub is a Locker's one subscription through one client, shared by every
// lock of the Locker that waits, multiplexing their channels (the locks
// without pub/sub share one without a subscription, for their lines). It
// opens with the first waiter; a channel nobody has waited on for linger is
// unsubscribed, and the hub closes once it has neither waiters nor
// channels (the hub without a subscription, when its last waiter leaves).
type hub struct {
	locker *Locker
	key    any           // in locker.hubs
	ps     *redis.PubSub // nil without pub/sub: the hub keeps lines and wakes nobody
	ctx    context.Context
	cancel context.CancelFunc
	done   chan struct{} // closed when the reader goroutine has returned (at once without one)
	users  int           // waiters joined; guarded by locker.mu

	sweeper *time.Timer // runs sweep, linger after a channel's last waiter left; guarded by mu

	mu      sync.Mutex
	chans   map[string]*keyWaiters
	pending map[string]int // SUBSCRIBEs sent and not yet confirmed
}

// keyWaiters are the waiters of one key in a hub, in arrival order, with
// the state of its release channel's subscription.
type keyWaiters struct {
	queue     []*waiter
	fair      map[string]*waiter // waiters of fair locks, by id: each queues in Redis
	ready     chan struct{}      // closed when confirmed, or when that is not to be
	confirmed bool               // the server has confirmed our SUBSCRIBE
	dropped   bool               // the subscription dropped since it was confirmed
	idle      time.Time          // when its last waiter left, while it lingers; zero while waited on
}

// unblock lets the waiters that wait for the subscription go on.
func (c *keyWaiters) unblock() {
	select {
	case <-c.ready:
	default:
		close(c.ready)
	}
}

// A waiter is one AcquireWait in the queue of its channel. Only the head of
// a queue makes attempts; the others wait behind it.
type waiter struct {
	hub    *hub
	name   string
	id     string        // a fair lock's waiter: its id in the queue in Redis
	notify chan struct{} // cap 1: there is news
	left   bool          // out of the queue; owned by the waiting goroutine

	// Guarded by hub.mu.
	news      news
	attemptAt time.Time // a fair waiter's: when its timer makes its next attempt; zero if none
}

// news is what a waiter was told since it last looked.
type news struct {
	attempt bool           // attempt now: a release was published, or the head left
	holder  time.Duration  // another waiter took the lock with this lease: a waiter of ours, or of a fair lock's queue
	handoff *store.Handoff // a fair waiter's: a release handed it the lock
}

// hubKey returns the key of rl's hub in its Locker: the Subscriber itself
// when it can be compared (a client pointer, as a rule), else rl, which
// then has a hub of its own; nil for the hub of the locks without pub/sub.
func (rl *RedisLock) hubKey() any {
	switch {
	case rl.pubsub == nil:
		return nil
	case reflect.ValueOf(rl.pubsub).Comparable():
		return rl.pubsub
	}
	return rl
}

// waitersHere reports whether plain AcquireWaits of rl's Locker queue for
// rl's key on rl's pub/sub client (or without one), and whether their
// subscription to its channel is confirmed.
func (rl *RedisLock) waitersHere() (queued, confirmed bool) {
	l := rl.locker
	l.mu.Lock()
	defer l.mu.Unlock()
	if h := l.hubs[rl.hubKey()]; h != nil {
		h.mu.Lock()
		defer h.mu.Unlock()
		if c := h.chans[rl.channel]; c != nil {
			return len(c.queue) > 0, c.confirmed
		}
	}
	return false, false
}

// join puts an AcquireWait of rl in the queue of rl's channel (for a fair
// lock, its waiter id: it waits for handoffs to id, and for releases that
// hand nothing on), opening the client's hub if needed and waiting (within
// ctx and subscribeWait) for the channel's subscription to be confirmed. A
// hub without pub/sub keeps the line and wakes nobody. It returns nil once
// the Locker is closed.
func (rl *RedisLock) join(ctx context.Context, id string) *waiter {
	h := rl.useHub()
	if h == nil {
		return nil
	}
	w := &waiter{hub: h, name: rl.channel, id: id, notify: make(chan struct{}, 1)}
	h.mu.Lock()
	c := h.chans[w.name]
	if c == nil {
		c = &keyWaiters{fair: map[string]*waiter{}, ready: make(chan struct{})}
		h.chans[w.name] = c
		if h.ps == nil {
			c.unblock() // nothing to confirm
		} else {
			h.pending[w.name]++
			if err := h.ps.Subscribe(h.ctx, w.name); err != nil {
				logx.Errorf("redislock: subscribing to wake-ups of %q failed, pacing by retries: %v", rl.key, err)
				c.unblock() // no confirmation is coming: go on unsubscribed
			}
		}
	}
	c.idle = time.Time{}
	if id != "" {
		c.fair[id] = w
	} else {
		c.queue = append(c.queue, w)
	}
	w.news.attempt = id != "" || len(c.queue) == 1 // a fair waiter, and the first in line, attempt at once
	ready := c.ready
	h.mu.Unlock()

	t := time.NewTimer(subscribeWait)
	defer t.Stop()
	select {
	case <-ready:
	case <-ctx.Done():
	case <-rl.lockerDone():
	case <-t.C:
	}
	return w
}

// useHub returns rl's hub, opened if need be, counting one more user; nil
// when the Locker is closed. Without pub/sub (none, or a Subscriber that
// gives no PubSub) the hub has no subscription and no reader.
func (rl *RedisLock) useHub() *hub {
	key, l := rl.hubKey(), rl.locker
	l.mu.Lock()
	defer l.mu.Unlock()
	h := l.hubs[key]
	if h == nil {
		if l.joined { // closed: no more goroutines
			return nil
		}
		ctx, cancel := context.WithCancel(context.Background())
		h = &hub{locker: l, key: key, ctx: ctx, cancel: cancel, done: closedChan,
			chans: map[string]*keyWaiters{}, pending: map[string]int{}}
		if rl.pubsub != nil {
			if h.ps = rl.pubsub.Subscribe(ctx); h.ps == nil {
				logx.Errorf("redislock: %T.Subscribe gave no PubSub: pacing by retries", rl.pubsub)
			}
		}
		l.hubs[key] = h
		if key == nil {
			l.quiet.Store(h)
		}
		if h.ps != nil {
			h.done = make(chan struct{})
			l.wg.Add(1) // under l.mu: Close has not waited yet
			go func() {
				defer l.wg.Done()
				h.read()
			}()
		}
	}
	h.users++
	return h
}

// read receives the hub's pub/sub traffic until the hub closes: it confirms
// subscriptions and gives a published release to the head of its queue.
func (h *hub) read() {
	defer close(h.done)
	failures := 0
	for {
		msg, err := h.ps.ReceiveTimeout(h.ctx, 30*time.Second)
		if h.ctx.Err() != nil {
			return
		}
		if err != nil {
			if isTimeout(err) {
				_ = h.ps.Ping(h.ctx) // a dead connection fails the next receive
				continue
			}
			var refusal redis.Error
			if errors.As(err, &refusal) {
				h.refused(err)
				continue
			}
			failures++
			h.dropped(err, failures)
			if failures == 1 {
				continue // go-redis reconnects and resubscribes on the next receive, at once
			}
			select { // the server is down, say: back off
			case <-h.ctx.Done():
				return
			case <-time.After(clock.Backoff(800*time.Millisecond, failures-1)):
			}
			continue
		}
		failures = 0
		switch m := msg.(type) {
		case *redis.Subscription:
			if m.Kind == "subscribe" {
				h.confirm(m.Channel)
			}
		case *redis.Message:
			h.released(m.Channel, m.Payload)
		}
	}
}

// sweep, in its timer's goroutine, unsubscribes the channels nobody has
// waited on for linger (the timer is armed linger after the latest went
// idle), and closes the hub when nothing is left of it.
func (h *hub) sweep() {
	if !h.locker.enter() {
		return // closed: Close closes the hub
	}
	defer h.locker.wg.Done()
	h.mu.Lock()
	for name, c := range h.chans {
		if !c.idle.IsZero() && time.Since(c.idle) >= linger {
			delete(h.chans, name)
			if err := h.ps.Unsubscribe(h.ctx, name); err != nil && h.ctx.Err() == nil {
				logx.Errorf("redislock: unsubscribing from %q failed: %v", name, err)
			}
		}
	}
	h.mu.Unlock()
	h.closeUnused()
}

// closeUnused closes h, and takes it out of its Locker, when it has neither
// waiters nor channels (lingering ones count not once the Locker closes).
func (h *hub) closeUnused() {
	l := h.locker
	l.mu.Lock()
	h.mu.Lock()
	unused := h.users == 0 && (len(h.chans) == 0 || l.isClosed()) && l.hubs[h.key] == h
	if unused {
		delete(l.hubs, h.key)
		if h.key == nil {
			l.quiet.Store(nil)
		}
		if h.sweeper != nil {
			h.sweeper.Stop()
		}
	}
	h.mu.Unlock()
	l.mu.Unlock()
	if unused {
		h.close()
	}
}

// close ends the hub's subscription and its reader, and returns once the
// reader has. The hub is out of its Locker already.
func (h *hub) close() {
	h.cancel()
	if h.ps != nil {
		_ = h.ps.Close()
	}
	<-h.done
}

func (h *hub) confirm(name string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if p := h.pending[name]; p > 1 {
		h.pending[name] = p - 1
		return // a later SUBSCRIBE of the same channel is still on its way
	}
	delete(h.pending, name)
	if c := h.chans[name]; c != nil {
		c.confirmed = true
		c.unblock()
		if c.dropped { // a release may have gone unheard
			c.wakeHeads()
		}
		c.dropped = false
	}
}

// refused runs when Redis refused a SUBSCRIBE (an ACL without the
// channel): no confirmation is coming, so the waiters that wait for one
// go on at once, and pace themselves by their RetryStrategy. Which of the
// pending channels was refused is not said: those of the others confirm
// later.
func (h *hub) refused(err error) {
	if _, logged := h.locker.unheard.LoadOrStore(struct{}{}, true); !logged { // once per Locker
		logx.Errorf("redislock: Redis refused a subscription to wake-ups, pacing by retries: %v", err)
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	for name := range h.pending {
		if c := h.chans[name]; c != nil {
			c.unblock()
		}
	}
	clear(h.pending)
}

// released passes on a message of the channel: a handoff to a fair waiter
// of ours goes to it, and its lease to the other fair waiters (they attempt
// no later than when the new holder's key would expire unreleased); a
// release that handed nothing on lets the head of the queue, and every
// fair waiter, attempt.
func (h *hub) released(name, payload string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	c := h.chans[name]
	if c == nil {
		return
	}
	id, m, ok := store.ParseHandoff(payload)
	if !ok {
		c.wakeHeads()
		return
	}
	for _, w := range c.fair {
		switch {
		case w.id == id:
			w.give(news{handoff: &m})
		case w.attemptAt.IsZero() || h.locker.clock.Now().Add(m.Lease).Before(w.attemptAt):
			// Woken only if the new holder's key, unreleased, would
			// expire before the waiter's next attempt.
			w.give(news{holder: m.Lease})
		}
	}
}

// wakeHeads lets the head of the queue, and every fair waiter, attempt.
// The caller holds the hub's mu.
func (c *keyWaiters) wakeHeads() {
	if len(c.queue) > 0 {
		c.queue[0].give(news{attempt: true})
	}
	for _, w := range c.fair {
		w.give(news{attempt: true})
	}
}

// dropped runs when the subscription failed: releases may have been missed,
// so every head may attempt, and until the server confirms the
// resubscription, waiters pace themselves by their RetryStrategy.
func (h *hub) dropped(err error, failures int) {
	if failures == 1 {
		logx.Errorf("redislock: wake-up subscription dropped, pacing by retries until it is back: %v", err)
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	clear(h.pending)
	for _, c := range h.chans {
		c.confirmed, c.dropped = false, true // joiners meanwhile do not wait for it
		c.wakeHeads()
	}
}

// releasedHere tells the Locker's waiters without pub/sub on channel's key
// what a release by a lock of the Locker would have published: a fair
// release's handoff message, or "" for a key deleted. No message tells them.
func (l *Locker) releasedHere(channel, payload string) {
	if h := l.quiet.Load(); h != nil {
		h.released(channel, payload)
	}
}

// give adds n to w's news and wakes it. The caller holds w.hub.mu.
func (w *waiter) give(n news) {
	o := &w.news
	o.attempt = o.attempt || n.attempt
	o.holder = cmp.Or(n.holder, o.holder)
	o.handoff = cmp.Or(n.handoff, o.handoff)
	select {
	case w.notify <- struct{}{}:
	default:
	}
}

// wake returns the channel that wakes w; nil (never ready) for no waiter.
func (w *waiter) wake() <-chan struct{} {
	if w == nil {
		return nil
	}
	return w.notify
}

// read returns, and forgets, w's news, and whether w is the head of its
// queue (a fair waiter always is: it queues in Redis). Without a waiter,
// it is the head and attempts.
func (w *waiter) read() (head bool, n news) {
	if w == nil {
		return true, news{attempt: true}
	}
	h := w.hub
	h.mu.Lock()
	defer h.mu.Unlock()
	q := h.chans[w.name].queue
	n, w.news = w.news, news{}
	return w.id != "" || len(q) > 0 && q[0] == w, n
}

// subscribed reports whether w's wake-ups can be counted on.
func (w *waiter) subscribed() bool {
	if w == nil {
		return false
	}
	w.hub.mu.Lock()
	defer w.hub.mu.Unlock()
	return w.hub.chans[w.name].confirmed
}

// attemptsAt records when w's timer makes its next attempt.
func (w *waiter) attemptsAt(at time.Time) {
	if w == nil {
		return
	}
	w.hub.mu.Lock()
	w.attemptAt = at
	w.hub.mu.Unlock()
}

// leave takes w out of its queue, after it acquired the lock with a lease
// of lease (0: it did not). If w was the head, the new head is told: it may
// attempt, or, when w holds the lock, waits for its release (waiters that
// share w's RedisLock re-enter it, wherever they wait: see heldChange). A
// channel nobody waits on lingers (see linger), and the hub with it; once
// the Locker is closing, and without a subscription, the hub closes when
// its last waiter leaves.
func (w *waiter) leave(lease time.Duration) {
	if w == nil || w.left {
		return
	}
	w.left = true
	h := w.hub
	now := h.ps == nil || h.locker.isClosed() // close now, not after linger
	h.mu.Lock()
	c := h.chans[w.name]
	delete(c.fair, w.id)
	if i := slices.Index(c.queue, w); i >= 0 {
		c.queue = slices.Delete(c.queue, i, i+1)
		if next := c.queue; i == 0 && len(next) > 0 {
			next[0].give(news{attempt: lease == 0, holder: lease})
		}
	}
	if len(c.queue) == 0 && len(c.fair) == 0 {
		if now {
			delete(h.chans, w.name) // the last waiter out closes the hub
		} else {
			c.idle = time.Now()
			if h.sweeper == nil {
				h.sweeper = time.AfterFunc(linger, h.sweep)
			} else {
				h.sweeper.Reset(linger)
			}
		}
	}
	h.mu.Unlock()
	h.locker.mu.Lock()
	h.users--
	h.locker.mu.Unlock()
	h.closeUnused()
}

func isTimeout(err error) bool {
	var t interface{ Timeout() bool }
	return errors.As(err, &t) && t.Timeout()
}
