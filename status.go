package redislock

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"time"

	"github.com/redislock/redislock/internal/store"

	"github.com/redis/go-redis/v9"
)

// Status is the state of a lock in Redis, as an operator sees it: read by
// Inspect, Break and Watch without owning the lock.
type Status struct {
	// Key is the lock's Redis key, its prefix (WithPrefix) included.
	Key string
	// Held reports that the key exists. Owner is the id it holds: the
	// holder's, as its RedisLock's Owner method returns it.
	Held  bool
	Owner string
	// TTL is the holder's remaining lease as Redis counts it: 0 when the
	// lock is free, -1 (one nanosecond below zero) when someone removed the
	// key's expiry. Expires is
	// when the key expires by the Redis server's clock (zero when free or
	// without expiry): a renewal moves it later, and nothing else does.
	TTL     time.Duration
	Expires time.Time
	// Fence is the lock's fencing counter: the latest token issued on the
	// key (see WithFencing), 0 when none was.
	Fence int64
	// Waiters counts the live waiters queued for the lock when it is fair
	// (see WithFairness).
	Waiters int
	// Permits is the number of permits of a semaphore (see WithPermits),
	// Shared is true for a shared lock (WithShared). Holders then counts
	// their live holders (Holders lists them), Held reports that there is
	// one, Owner is "" (from Break, the holder it removed), and TTL and
	// Expires are the key's, which lives as long as the longest lease.
	Permits int
	Shared  bool
	Holders int
}

// A Holder is one holder of a semaphore or of a shared lock.
type Holder struct {
	Owner string        // its id, as its RedisLock's Owner method returns it
	TTL   time.Duration // its remaining lease, by the server's clock
	Token int64         // its fencing token (see WithFencing); 0 when not fenced
}

// rememberBreak is how long a break is remembered, so that a client's retry
// of it, after its reply was lost, reports it as done.
const rememberBreak = time.Minute

// Inspect reads the lock's state in Redis in one round trip, and changes
// nothing: it needs no hold, and does not wait for this RedisLock's other
// calls. It counts the waiters of a fair lock whether or not rl itself was
// made with WithFairness. A semaphore's or a shared lock's key is read
// whatever rl's kind; a key of another type, written by someone else, is
// reported as an error matching ErrWrongType, a fencing
// counter that is not a number as ErrCorruptFencingCounter (a used-up one,
// at 2^53-1, is a number: Fence reports it, and acquisitions refuse it).
func (rl *RedisLock) Inspect(ctx context.Context) (Status, error) {
	if err := rl.check(ctx); err != nil {
		return Status{}, err
	}
	st, err := rl.inspect(ctx)
	if err != nil {
		return Status{}, opErr("inspect", rl.key, err)
	}
	return st, nil
}

// inspect runs inspect.lua.
func (rl *RedisLock) inspect(ctx context.Context) (Status, error) {
	st, _, err := rl.inspectAll(ctx)
	return st, err
}

// inspectAll runs inspect.lua, and returns the holders of a semaphore or a
// shared lock too, by owner id.
func (rl *RedisLock) inspectAll(ctx context.Context) (Status, []Holder, error) {
	keys := []string{rl.key, relatedName(rl.key, "fence"), relatedName(rl.key, "queue"), relatedName(rl.key, "waiters"), rl.names.holders}
	reply, err := rl.locker.store.Run(ctx, store.Inspect, keys)
	if err != nil {
		return Status{}, nil, err
	}
	in, err := store.ParseInspect(reply)
	if err != nil {
		return Status{}, nil, err
	}
	kind, owner, pttl, counter, waiters, expires := in.Kind, in.Owner, in.PTTL, in.Counter, in.Waiters, in.Expires
	st := Status{Key: rl.key, Waiters: int(waiters)}
	switch kind {
	case "none":
	case "string":
		st.TTL = store.LeaseLeft(pttl)
		if expires >= 0 {
			st.Expires = time.UnixMilli(expires)
		}
		if owner == store.PermitsMark || owner == store.SharedMark { // its holders are in a related key
			holdersOf(&st, in.Holders)
			st.Shared = owner == store.SharedMark
		} else {
			st.Held, st.Owner = true, owner
		}
	default:
		return Status{}, nil, fmt.Errorf("%w: a %s", ErrWrongType, kind)
	}
	var holders []Holder
	for id, left := range in.Holders {
		if !strings.HasPrefix(id, "#") && id != store.PermitsMark && id != store.SharedMark {
			holders = append(holders, Holder{Owner: id, TTL: store.LeaseLeft(left), Token: in.Holders["#"+id]})
		}
	}
	slices.SortFunc(holders, func(a, b Holder) int { return strings.Compare(a.Owner, b.Owner) })
	if counter != "" {
		value, isString := strings.CutPrefix(counter, "=")
		n, ok := store.ParseCounter(value)
		if !ok || !isString {
			// The rest stands: Break and Holders need it.
			return st, holders, fmt.Errorf("%w: %s holds %.32q", ErrCorruptFencingCounter, relatedName(rl.key, "fence"), value)
		}
		st.Fence = n
	}
	return st, holders, nil
}

// holdersOf fills st with what inspect.lua read of the holders of a
// semaphore's or a shared lock's key.
func holdersOf(st *Status, holders map[string]int64) {
	st.Permits, st.Holders = int(-holders[store.PermitsMark]), 0
	for id := range holders {
		if !strings.HasPrefix(id, "#") && id != store.PermitsMark && id != store.SharedMark {
			st.Holders++
		}
	}
	st.Held = st.Holders > 0
}

// Holders lists the live holders of a semaphore or a shared lock, in one
// round trip, by owner id; none for a lock. It needs no hold, and changes
// nothing.
func (rl *RedisLock) Holders(ctx context.Context) ([]Holder, error) {
	if err := rl.check(ctx); err != nil {
		return nil, err
	}
	_, holders, err := rl.inspectAll(ctx)
	if err != nil && !errors.Is(err, ErrCorruptFencingCounter) { // the holders do not need the counter
		return nil, opErr("inspect", rl.key, err)
	}
	return holders, nil
}

// Break deletes the lock's key on an operator's word, whoever holds it, or
// with owner != "" only while owner holds it, and publishes its release so
// that waiters wake (a fair lock's first live waiter takes it). It needs no
// hold. The holder is not told: it learns of the loss at its next renewal
// (within a third of its lease), when its hold ends with ErrLockLost.
//
// Break returns the lock's status as it broke it: Status.Owner is the owner
// it took the lock from. It breaks nothing and returns a Status with Held
// false when the lock is free, and an error matching ErrHeldByOther, with
// the holder's status, when owner is given and another owner holds the
// lock. Of a semaphore or a shared lock, it removes the holder owner, or
// all of them, and Status.Owner is owner. A key of another type, written
// by someone else, is never deleted (ErrWrongType), nor one whose break
// Redis refuses (ErrRefused). A
// client's retry of the call, after its reply was lost, reports the break
// it made and breaks nothing more.
func (rl *RedisLock) Break(ctx context.Context, owner string) (Status, error) {
	if err := rl.check(ctx); err != nil {
		return Status{}, err
	}
	st, err := rl.inspect(ctx) // the counter and the waiters, which the break leaves
	if errors.Is(err, ErrCorruptFencingCounter) {
		err = nil // the lock can be broken all the same; its Fence reads 0
	}
	if err != nil {
		return Status{}, opErr("break", rl.key, err)
	}
	if !st.Held {
		return st, nil // nothing to break
	}
	keys := []string{rl.key, relatedName(rl.key, "broken"), rl.names.holders}
	reply, err := rl.locker.store.Run(ctx, store.Break, keys, owner, rl.names.channel, rememberBreak.Milliseconds(), newID())
	if err != nil {
		return Status{}, opErr("break", rl.key, err)
	}
	broken, was, pttl, err := store.ParseBreak(reply)
	if err != nil {
		return Status{}, opErr("break", rl.key, err)
	}
	if st.Owner != was && st.Holders == 0 || !st.Held { // the lock changed hands since inspect read it
		st.Expires = time.Time{}
	}
	st.Held, st.Owner, st.TTL = pttl != -2, was, 0
	if st.Held {
		st.TTL = store.LeaseLeft(pttl)
	}
	switch {
	case broken == 3: // broken, and nobody woken
		rl.locker.wakeupRefused(rl, rl.key)
	case broken == -1:
		return Status{}, opErr("break", rl.key, fmt.Errorf("%w: not a string", ErrWrongType))
	case broken == 0 && st.Held && was == "": // a semaphore or a shared lock
		return st, fmt.Errorf("%w: %s does not hold %s", ErrHeldByOther, owner, rl.key)
	case broken == 0 && st.Held:
		return st, fmt.Errorf("%w: %s holds %s, not %s", ErrHeldByOther, was, rl.key, owner)
	}
	return st, nil
}

// Watch calls fn with the lock's status, then again each time it changes,
// until ctx ends: a new holder or none, its lease extended or shortened
// (its expiry, by the server's clock, moved, set or removed), a new fencing
// counter, a different number of waiters. It reads
// the status (with Inspect) when it hears a release on the lock's channel,
// when the lock has a Subscriber (see WithPubSub), and every poll, which
// sees renewals and holders that come and go without a release; poll <= 0
// means one second. Changes that come and go between two reads are not
// seen; without a Subscriber, or when subscribing fails, Watch only polls.
// fn runs on Watch's goroutine. Watch returns ctx's error when ctx
// ends, or the first error of a read (a read includes the client's own
// retries, and lasts as long as they do).
func (rl *RedisLock) Watch(ctx context.Context, poll time.Duration, fn func(Status)) error {
	if err := rl.check(ctx); err != nil {
		return err
	}
	if fn == nil {
		return ErrNilFunc
	}
	if poll <= 0 {
		poll = time.Second
	}
	var released <-chan *redis.Message
	if !store.IsNil(rl.opts.pubsub) {
		if ps := rl.opts.pubsub.Subscribe(ctx, rl.names.channel); ps != nil {
			defer ps.Close()
			// Subscribed before the first read: no release falls between.
			if _, err := ps.Receive(ctx); err == nil {
				released = ps.Channel()
			} else if ctx.Err() != nil {
				return ctx.Err()
			} else {
				rl.logHold(slog.LevelError, "redislock: watching without the release channel; polling", nil, causeAttr(err))
			}
		}
	}
	tick := time.NewTicker(poll)
	defer tick.Stop()
	var last Status
	var lastHolders []Holder
	for first := true; ; first = false {
		st, holders, err := rl.inspectAll(ctx)
		if err != nil {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			return opErr("watch", rl.key, err)
		}
		if first || changed(last, st) || !slices.EqualFunc(lastHolders, holders, sameOwner) {
			fn(st)
		}
		last, lastHolders = st, holders
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-tick.C:
		case <-released:
		}
	}
}

// changed reports whether now differs from was in what Watch reports.
func changed(was, now Status) bool {
	switch {
	case was.Held != now.Held, was.Owner != now.Owner, was.Fence != now.Fence, was.Waiters != now.Waiters,
		was.Holders != now.Holders:
		return true
	}
	return leaseMoved(was.Expires, now.Expires)
}

func sameOwner(a, b Holder) bool { return a.Owner == b.Owner }

// leaseMoved reports whether a key's expiry moved between two readings:
// extended, shortened, set or removed. Before Redis 7.0 an expiry is read
// as TIME + PTTL, which can be 1 ms off, so 2 ms is no move.
func leaseMoved(was, now time.Time) bool {
	if was.IsZero() || now.IsZero() {
		return was.IsZero() != now.IsZero()
	}
	d := now.Sub(was)
	return d > 2*time.Millisecond || d < -2*time.Millisecond
}
