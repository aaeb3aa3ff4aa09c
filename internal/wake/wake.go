// Package wake delivers the releases of locks to their waiters: one
// subscription per client (a hub), multiplexing the release channels of
// every key waited on, a queue of waiters per channel of which only the
// head attempts, and fair waiters woken by their handoffs. It knows
// nothing of locks: a waiter is a channel, and for a fair one an id.
package wake

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"reflect"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/redislock/redislock/internal/clock"
	"github.com/redislock/redislock/internal/store"
)

// A Set is the hubs of one Locker: one per client, and one without
// pub/sub for the locks that have none. Make it with NewSet.
type Set struct {
	clock   clock.Clock
	log     *slog.Logger        // its Locker's; nil: slog.Default() at each line
	wg      sync.WaitGroup      // readers and sweeps
	quiet   atomic.Pointer[hub] // the hub without pub/sub, while open
	refused atomic.Bool         // a refused subscription was logged
	unheard sync.Map            // keys whose refused wake-up was logged

	mu     sync.Mutex
	hubs   map[any]*hub // by Subscriber
	closed bool         // no hub opens any more
}

// NewSet returns an empty Set on c that logs to log (nil: slog.Default()
// as it is at each line).
func NewSet(c clock.Clock, log *slog.Logger) *Set {
	return &Set{clock: c, log: log, hubs: map[any]*hub{}}
}

// logf logs msg at level, with attrs, as said by its caller; at Debug
// when err follows the client's Close.
func (s *Set) logf(level slog.Level, msg string, err error, attrs ...slog.Attr) {
	if store.Closed(err) {
		level = slog.LevelDebug
	}
	log, ctx := s.log, context.Background()
	if log == nil {
		log = slog.Default()
	}
	if !log.Enabled(ctx, level) {
		return
	}
	var pc [1]uintptr
	runtime.Callers(2, pc[:]) // the caller's line, not this one's
	r := slog.NewRecord(time.Now(), level, msg, pc[0])
	r.AddAttrs(attrs...)
	if err != nil {
		r.AddAttrs(slog.String("cause", err.Error()))
	}
	_ = log.Handler().Handle(ctx, r)
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
	set    *Set
	key    any           // in set.hubs
	ps     *redis.PubSub // nil without pub/sub: the hub keeps lines and wakes nobody
	ctx    context.Context
	cancel context.CancelFunc
	done   chan struct{} // closed when the reader goroutine has returned (at once without one)
	users  int           // waiters joined; guarded by set.mu

	sweeper *time.Timer // runs sweep, linger after a channel's last waiter left; guarded by mu

	mu      sync.Mutex
	chans   map[string]*keyWaiters
	pending map[string]int // SUBSCRIBEs sent and not yet confirmed
}

// keyWaiters are the waiters of one key in a hub, in arrival order, with
// the state of its release channel's subscription.
type keyWaiters struct {
	queue     []*Waiter
	fair      map[string]*Waiter // fair waiters, by id: each queues in Redis
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

// A Waiter is one wait in the queue of its channel. Only the head of a
// queue makes attempts; the others wait behind it. A fair waiter always
// may: it queues in Redis. A nil *Waiter is one without a queue: the head,
// told to attempt.
type Waiter struct {
	hub    *hub
	name   string
	id     string        // a fair waiter's id in the queue in Redis
	notify chan struct{} // cap 1: there is news
	left   bool          // out of the queue; owned by the waiting goroutine

	// Guarded by hub.mu.
	news      News
	attemptAt time.Time // a fair waiter's: when its timer makes its next attempt; zero if none
}

// News is what a waiter was told since it last looked.
type News struct {
	Attempt bool           // attempt now: a release was published, or the head left
	Holder  time.Duration  // another waiter took the lock with this lease: one of this queue, or of a fair queue
	Handoff *store.Handoff // a fair waiter's: a release handed it the lock
}

// hubKey returns the key of the hub of sub in a Set: sub itself when it
// can be compared (a client pointer, as a rule), else owner, which then
// has a hub of its own; nil for the hub without pub/sub.
func hubKey(owner any, sub store.Subscriber) any {
	switch {
	case sub == nil:
		return nil
	case reflect.ValueOf(sub).Comparable():
		return sub
	}
	return owner
}

// Waiting reports whether plain waiters queue on channel in the hub of
// sub (see Join), and whether its subscription is confirmed.
func (s *Set) Waiting(owner any, sub store.Subscriber, channel string) (queued, confirmed bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if h := s.hubs[hubKey(owner, sub)]; h != nil {
		h.mu.Lock()
		defer h.mu.Unlock()
		if c := h.chans[channel]; c != nil {
			return len(c.queue) > 0, c.confirmed
		}
	}
	return false, false
}

// Join puts a wait in the queue of channel in the hub of sub (nil: no
// pub/sub), as a fair waiter with id, or in line with "", opening the hub
// if need be and waiting (within ctx and subscribeWait) for the channel's
// subscription to be confirmed. owner keys a hub of its own when sub
// cannot be compared. A hub without pub/sub keeps the line and wakes
// nobody. It returns nil once the Set is closed.
func (s *Set) Join(ctx context.Context, owner any, sub store.Subscriber, channel, id string) *Waiter {
	h := s.use(owner, sub)
	if h == nil {
		return nil
	}
	w := &Waiter{hub: h, name: channel, id: id, notify: make(chan struct{}, 1)}
	h.mu.Lock()
	c := h.chans[w.name]
	if c == nil {
		c = &keyWaiters{fair: map[string]*Waiter{}, ready: make(chan struct{})}
		h.chans[w.name] = c
		if h.ps == nil {
			c.unblock() // nothing to confirm
		} else {
			h.pending[w.name]++
			if err := h.ps.Subscribe(h.ctx, w.name); err != nil {
				s.logf(slog.LevelWarn, "redislock: subscribing to wake-ups failed; pacing by retries", err, slog.String("channel", channel))
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
	w.news.Attempt = id != "" || len(c.queue) == 1 // a fair waiter, and the first in line, attempt at once
	ready := c.ready
	h.mu.Unlock()

	t := time.NewTimer(subscribeWait)
	defer t.Stop()
	select {
	case <-ready:
	case <-ctx.Done():
	case <-t.C:
	}
	return w
}

// use returns the hub of sub, opened if need be, counting one more user;
// nil once the Set is closed. Without pub/sub (none, or a Subscriber that
// gives no PubSub) the hub has no subscription and no reader.
func (s *Set) use(owner any, sub store.Subscriber) *hub {
	key := hubKey(owner, sub)
	s.mu.Lock()
	defer s.mu.Unlock()
	h := s.hubs[key]
	if h == nil {
		if s.closed {
			return nil
		}
		ctx, cancel := context.WithCancel(context.Background())
		h = &hub{set: s, key: key, ctx: ctx, cancel: cancel, done: closed,
			chans: map[string]*keyWaiters{}, pending: map[string]int{}}
		if sub != nil {
			if h.ps = sub.Subscribe(ctx); h.ps == nil {
				s.logf(slog.LevelError, "redislock: Subscribe gave no PubSub; pacing by retries", nil, slog.String("subscriber", fmt.Sprintf("%T", sub)))
			}
		}
		s.hubs[key] = h
		if key == nil {
			s.quiet.Store(h)
		}
		if h.ps != nil {
			h.done = make(chan struct{})
			s.wg.Add(1) // under s.mu, not closed
			go func() {
				defer s.wg.Done()
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
	if !h.set.enter() {
		return // closed: Close closes the hub
	}
	defer h.set.wg.Done()
	h.mu.Lock()
	for name, c := range h.chans {
		if !c.idle.IsZero() && time.Since(c.idle) >= linger {
			delete(h.chans, name)
			if err := h.ps.Unsubscribe(h.ctx, name); err != nil && h.ctx.Err() == nil {
				h.set.logf(slog.LevelWarn, "redislock: unsubscribing from wake-ups failed", err, slog.String("channel", name))
			}
		}
	}
	h.mu.Unlock()
	h.closeUnused()
}

// closeUnused closes h, and takes it out of its Locker, when it has neither
// waiters nor channels (lingering ones count not once the Locker closes).
func (h *hub) closeUnused() {
	s := h.set
	s.mu.Lock()
	h.mu.Lock()
	unused := h.users == 0 && (len(h.chans) == 0 || s.closed) && s.hubs[h.key] == h
	if unused {
		delete(s.hubs, h.key)
		if h.key == nil {
			s.quiet.Store(nil)
		}
		if h.sweeper != nil {
			h.sweeper.Stop()
		}
	}
	h.mu.Unlock()
	s.mu.Unlock()
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
	if h.set.refused.CompareAndSwap(false, true) { // once per Set
		h.set.logf(slog.LevelError, "redislock: Redis refused a subscription to wake-ups; pacing by retries", err)
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
			w.give(News{Handoff: &m})
		case w.attemptAt.IsZero() || h.set.clock.Now().Add(m.Lease).Before(w.attemptAt):
			// Woken only if the new holder's key, unreleased, would
			// expire before the waiter's next attempt.
			w.give(News{Holder: m.Lease})
		}
	}
}

// wakeHeads lets the head of the queue, and every fair waiter, attempt.
// The caller holds the hub's mu.
func (c *keyWaiters) wakeHeads() {
	if len(c.queue) > 0 {
		c.queue[0].give(News{Attempt: true})
	}
	for _, w := range c.fair {
		w.give(News{Attempt: true})
	}
}

// dropped runs when the subscription failed: releases may have been missed,
// so every head may attempt, and until the server confirms the
// resubscription, waiters pace themselves by their RetryStrategy.
func (h *hub) dropped(err error, failures int) {
	if failures == 1 {
		h.set.logf(slog.LevelWarn, "redislock: wake-up subscription dropped; pacing by retries until it is back", err)
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	clear(h.pending)
	for _, c := range h.chans {
		c.confirmed, c.dropped = false, true // joiners meanwhile do not wait for it
		c.wakeHeads()
	}
}

// Publish tells the waiters on channel what a release by a lock of the
// same Locker published, or would have: a fair release's handoff message,
// or "" for a key deleted. Those without pub/sub hear of it only so, and
// with refused, when Redis refused the PUBLISH, every waiter does.
func (s *Set) Publish(channel, payload string, refused bool) {
	if !refused {
		if h := s.quiet.Load(); h != nil {
			h.released(channel, payload)
		}
		return
	}
	s.mu.Lock()
	hubs := make([]*hub, 0, len(s.hubs))
	for _, h := range s.hubs {
		hubs = append(hubs, h)
	}
	s.mu.Unlock()
	for _, h := range hubs {
		h.released(channel, payload)
	}
}

// give adds n to w's news and wakes it. The caller holds w.hub.mu.
func (w *Waiter) give(n News) {
	o := &w.news
	o.Attempt = o.Attempt || n.Attempt
	o.Holder = cmp.Or(n.Holder, o.Holder)
	o.Handoff = cmp.Or(n.Handoff, o.Handoff)
	select {
	case w.notify <- struct{}{}:
	default:
	}
}

// C returns the channel that wakes w; nil (never ready) for no waiter.
func (w *Waiter) C() <-chan struct{} {
	if w == nil {
		return nil
	}
	return w.notify
}

// Read returns, and forgets, w's news, and whether w is the head of its
// queue (a fair waiter always is). Without a waiter, it is the head and
// attempts.
func (w *Waiter) Read() (head bool, n News) {
	if w == nil {
		return true, News{Attempt: true}
	}
	h := w.hub
	h.mu.Lock()
	defer h.mu.Unlock()
	q := h.chans[w.name].queue
	n, w.news = w.news, News{}
	return w.id != "" || len(q) > 0 && q[0] == w, n
}

// Subscribed reports whether w's wake-ups can be counted on.
func (w *Waiter) Subscribed() bool {
	if w == nil {
		return false
	}
	w.hub.mu.Lock()
	defer w.hub.mu.Unlock()
	return w.hub.chans[w.name].confirmed
}

// AttemptsAt records when w, a fair waiter, attempts next.
func (w *Waiter) AttemptsAt(at time.Time) {
	if w == nil {
		return
	}
	w.hub.mu.Lock()
	w.attemptAt = at
	w.hub.mu.Unlock()
}

// Leave takes w out of its queue, after it acquired the lock with a lease
// of lease (0: it did not). If w was the head, the new head is told: it may
// attempt, or, when w holds the lock, waits for its release. A channel
// nobody waits on lingers (see linger), and the hub with it; once the Set
// is closed, and without a subscription, the hub closes when its last
// waiter leaves.
func (w *Waiter) Leave(lease time.Duration) {
	if w == nil || w.left {
		return
	}
	w.left = true
	h := w.hub
	h.set.mu.Lock()
	now := h.ps == nil || h.set.closed // close now, not after linger
	h.set.mu.Unlock()
	h.mu.Lock()
	c := h.chans[w.name]
	delete(c.fair, w.id)
	if i := slices.Index(c.queue, w); i >= 0 {
		c.queue = slices.Delete(c.queue, i, i+1)
		if next := c.queue; i == 0 && len(next) > 0 {
			next[0].give(News{Attempt: lease == 0, Holder: lease})
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
	h.set.mu.Lock()
	h.users--
	h.set.mu.Unlock()
	h.closeUnused()
}

func isTimeout(err error) bool {
	var t interface{ Timeout() bool }
	return errors.As(err, &t) && t.Timeout()
}

// Unheard reports whether this is the first time key's wake-up was
// refused: a log line for each would flood.
func (s *Set) Unheard(key string) bool {
	_, logged := s.unheard.LoadOrStore(key, true)
	return !logged
}

// enter counts one more goroutine that Wait waits for, and reports false,
// counting nothing, once the Set is closed.
func (s *Set) enter() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return false
	}
	s.wg.Add(1)
	return true
}

// Close closes the Set: no hub opens any more, lingering channels close
// now, and a hub with waiters closes as its last waiter leaves.
func (s *Set) Close() {
	s.mu.Lock()
	s.closed = true
	hubs := make([]*hub, 0, len(s.hubs))
	for _, h := range s.hubs {
		hubs = append(hubs, h)
	}
	s.mu.Unlock()
	for _, h := range hubs {
		h.closeUnused()
	}
}

// Wait returns once no reader or sweep of the Set runs: after Close, and
// after every waiter left.
func (s *Set) Wait() { s.wg.Wait() }

// Hubs returns how many hubs are open.
func (s *Set) Hubs() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.hubs)
}

// Waiters returns how many waiters the hubs have.
func (s *Set) Waiters() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := 0
	for _, h := range s.hubs {
		h.mu.Lock()
		for _, c := range h.chans {
			n += len(c.queue) + len(c.fair)
		}
		h.mu.Unlock()
	}
	return n
}

// Queued returns how many plain waiters wait in line on channel.
func (s *Set) Queued(channel string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, h := range s.hubs {
		h.mu.Lock()
		n := 0
		if c := h.chans[channel]; c != nil {
			n = len(c.queue)
		}
		h.mu.Unlock()
		if n > 0 {
			return n
		}
	}
	return 0
}

var closed = func() chan struct{} {
	c := make(chan struct{})
	close(c)
	return c
}()
