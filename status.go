package redislock

import (
	"context"
	_ "embed"
	"errors"
	"fmt"
	"strconv"
	"time"

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
	// lock is free, -1 when someone removed the key's expiry.
	TTL time.Duration
	// Fence is the lock's fencing counter: the latest token issued on the
	// key (see WithFencing), 0 when none was.
	Fence int64
	// Waiters counts the live waiters queued for the lock when it is fair
	// (see WithFairness).
	Waiters int
}

var (
	//go:embed inspect.lua
	inspectSource string
	//go:embed break.lua
	breakSource string

	inspectScript = redis.NewScript(inspectSource)
	breakScript   = redis.NewScript(breakSource)
)

func init() {
	sources[inspectScript] = inspectSource
	sources[breakScript] = breakSource
}

// rememberBreak is how long a break is remembered, so that a client's retry
// of it, after its reply was lost, reports it as done.
const rememberBreak = time.Minute

// Inspect reads the lock's state in Redis in one round trip, and changes
// nothing: it needs no hold, and does not wait for this RedisLock's other
// calls. It counts the waiters of a fair lock whether or not rl itself was
// made with WithFairness. A key of another type than a string, written by
// someone else, is reported as an error matching ErrWrongType, a fencing
// counter that is not a number as ErrCorruptFencingCounter.
func (rl *RedisLock) Inspect(ctx context.Context) (Status, error) {
	if err := rl.check(ctx); err != nil {
		return Status{}, err
	}
	keys := []string{rl.key, relatedName(rl.key, "fence"), relatedName(rl.key, "queue")}
	reply, err := rl.run(ctx, inspectScript, keys, relatedName(rl.key, "waiter:"))
	if err != nil {
		return Status{}, opErr("inspect", rl.key, err)
	}
	st, err := rl.parseInspect(reply)
	if err != nil {
		return Status{}, opErr("inspect", rl.key, err)
	}
	return st, nil
}

// parseInspect reads the reply of inspect.lua.
func (rl *RedisLock) parseInspect(reply any) (Status, error) {
	v, ok := reply.([]any)
	if !ok || len(v) != 5 {
		return Status{}, fmt.Errorf("%w: %T %.64v", ErrUnexpectedReply, reply, reply)
	}
	kind, ok1 := v[0].(string)
	owner, ok2 := v[1].(string)
	pttl, ok3 := v[2].(int64)
	counter, ok4 := v[3].(string)
	waiters, ok5 := v[4].(int64)
	if !ok1 || !ok2 || !ok3 || !ok4 || !ok5 || pttl < -2 || waiters < 0 {
		return Status{}, fmt.Errorf("%w: %.64v", ErrUnexpectedReply, v)
	}
	st := Status{Key: rl.key, Waiters: int(waiters)}
	switch kind {
	case "none":
	case "string":
		st.Held, st.Owner, st.TTL = true, owner, leaseLeft(pttl)
	default:
		return Status{}, fmt.Errorf("%w: a %s", ErrWrongType, kind)
	}
	if counter != "" {
		n, err := strconv.ParseInt(counter, 10, 64)
		if err != nil || n < 0 {
			return Status{}, fmt.Errorf("%w: %s holds %.32q", ErrCorruptFencingCounter, relatedName(rl.key, "fence"), counter)
		}
		st.Fence = n
	}
	return st, nil
}

// leaseLeft converts a PTTL reply of a key that exists.
func leaseLeft(pttl int64) time.Duration {
	if pttl < 0 {
		return -1 // no expiry; -2 (gone just now) cannot follow a GET
	}
	return time.Duration(pttl) * time.Millisecond
}

// Break deletes the lock's key on an operator's word, whoever holds it, or
// with owner != "" only while owner holds it, and publishes its release so
// that waiters wake (a fair lock's first live waiter takes it). It needs no
// hold. The holder is not told: it learns of the loss at its next renewal
// (within a third of its lease), when its hold ends with ErrLockLost.
//
// Break returns the lock's status just before: Status.Owner is the owner it
// took the lock from. It breaks nothing and returns a Status with Held
// false when the lock is free, and an error matching ErrHeldByOther, with
// the holder's status, when owner is given and another owner holds it. A
// key of another type than a string is never deleted (ErrWrongType). Break
// never deletes a lock it did not see: without owner, it reads the holder
// first and deletes the key only while it still holds that owner's id, so a
// client's retry of the call cannot break the next holder's lock.
func (rl *RedisLock) Break(ctx context.Context, owner string) (Status, error) {
	if err := rl.check(ctx); err != nil {
		return Status{}, err
	}
	want := owner
	for attempt := 0; ; attempt++ {
		st, err := rl.Inspect(ctx)
		if err != nil || !st.Held {
			return st, err
		}
		if owner == "" {
			want = st.Owner
		}
		keys := []string{rl.key, relatedName(rl.key, "broken")}
		reply, err := rl.run(ctx, breakScript, keys, want, rl.channel, rememberBreak.Milliseconds())
		if err != nil {
			return st, opErr("break", rl.key, err)
		}
		v, ok := reply.([]any)
		if !ok || len(v) != 3 {
			return st, opErr("break", rl.key, fmt.Errorf("%w: %T %.64v", ErrUnexpectedReply, reply, reply))
		}
		broken, ok1 := v[0].(int64)
		now, ok2 := v[1].(string)
		pttl, ok3 := v[2].(int64)
		if !ok1 || !ok2 || !ok3 || broken < 0 || broken > 2 || pttl < -2 {
			return st, opErr("break", rl.key, fmt.Errorf("%w: %.64v", ErrUnexpectedReply, v))
		}
		if broken != 0 {
			st.Owner = want
			if broken == 1 {
				st.TTL = leaseLeft(pttl)
			}
			return st, nil
		}
		// Not broken: the key changed since Inspect read it.
		st = Status{Key: rl.key, Held: pttl != -2, Owner: now, Fence: st.Fence, Waiters: st.Waiters}
		if st.Held {
			st.TTL = leaseLeft(pttl)
		}
		switch {
		case !st.Held:
			return st, nil
		case owner != "":
			return st, fmt.Errorf("%w: %s holds %s, not %s", ErrHeldByOther, now, rl.key, owner)
		case attempt == 2:
			return st, fmt.Errorf("%w: %s changed hands during the break; %s holds it now", ErrHeldByOther, rl.key, now)
		}
	}
}

// Watch calls fn with the lock's status, then again each time it changes,
// until ctx ends: a new holder or none, a lease extended (or its expiry
// removed), a new fencing counter, a different number of waiters. It reads
// the status (with Inspect) when it hears a release on the lock's channel,
// when the lock has a Subscriber (see WithPubSub), and every poll, which
// sees renewals and holders that come and go without a release; poll <= 0
// means one second. Changes that come and go between two reads are not
// seen. fn runs on Watch's goroutine. Watch returns ctx's error when ctx
// ends, or the first error of a read.
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
	if rl.pubsub != nil {
		ps := rl.pubsub.Subscribe(ctx, rl.channel)
		defer ps.Close()
		// Subscribed before the first read: no release falls between.
		if _, err := ps.Receive(ctx); err != nil {
			return errors.Join(opErr("watch", rl.key, err), ctx.Err())
		}
		released = ps.Channel()
	}
	tick := time.NewTicker(poll)
	defer tick.Stop()
	var last Status
	for first := true; ; first = false {
		st, err := rl.Inspect(ctx)
		if err != nil {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			return err
		}
		if first || changed(last, st) {
			fn(st)
		}
		last = st
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
	case was.Held != now.Held, was.Owner != now.Owner, was.Fence != now.Fence, was.Waiters != now.Waiters:
		return true
	case (was.TTL < 0) != (now.TTL < 0):
		return true
	}
	return now.TTL > was.TTL // a lease only grows when it is extended
}
