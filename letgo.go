package redislock

import (
	"context"
	"log/slog"
	"slices"
	"strings"
	"time"

	"github.com/redislock/redislock/internal/clock"
	"github.com/redislock/redislock/internal/store"
)

// release deletes the key if id owns it, and reports true when it did, or
// when a release of id had already done so (this call is a client's retry
// of one whose reply was lost). It reports false, nil when the key is gone
// or taken and no release of id ran: a loss. The release is remembered for
// 10 s, the clients' retry window. With abandon > 0, id is an attempt given up: it is remembered
// for that long, and a late run of it will not take the lock.
func (rl *RedisLock) release(ctx context.Context, id string, abandon time.Duration) (bool, error) {
	c := rl.releaseCall(ctx, id, abandon)
	c.Reply, c.Err = rl.locker.store.Run(ctx, c.Script, c.Keys, c.Args...)
	code, err := rl.locker.releaseResult(c)
	if code != 0 { // no message tells the waiters without pub/sub, nor any when Redis refused it
		handoffs, _ := c.Reply.(string) // a line each
		for _, m := range strings.Split(strings.TrimPrefix(handoffs, "!"), "\n") {
			rl.locker.wake.Publish(rl.names.channel, m, code == 3)
		}
	}
	return code != 0, err
}

// releaseCall returns release's script call, tagged with rl.
func (rl *RedisLock) releaseCall(ctx context.Context, id string, abandon time.Duration) *store.Call {
	c := &store.Call{Ctx: ctx, Script: rl.mode.release, Keys: rl.names.release, Args: []any{id, rl.names.channel}, Tag: rl}
	if abandon > 0 {
		c.Keys = append(slices.Clip(c.Keys), rl.names.acquire[1]) // a copy: the lock's names stay as they are
		c.Args = append(c.Args, abandon.Milliseconds())
	}
	return c
}

// releaseResult reads the reply of a release call, of a lock of l (see
// store.ReleaseCode). A release whose wake-up Redis refused is logged,
// once per key.
func (l *Locker) releaseResult(c *store.Call) (int64, error) {
	code, err := store.ReleaseCode(c)
	if code == 3 {
		rl, _ := c.Tag.(*RedisLock)
		l.wakeupRefused(rl, c.Keys[0])
	}
	return code, err
}

// wakeupRefused logs, once per key, to rl's logger (the Locker's when rl
// is nil), that Redis refused to publish a release of key: the Locker's
// own waiters are told, others wait until their next attempt.
func (l *Locker) wakeupRefused(rl *RedisLock, key string) {
	if l.wake.Unheard(key) {
		log := l.logger()
		if rl != nil {
			log = rl.logger()
		}
		log.LogAttrs(context.Background(), slog.LevelError, "redislock: Redis refused to publish a release; waiters in other processes are not woken",
			slog.String("key", key))
	}
}

// abandonedFor is how long an attempt given up is remembered, so that a late
// run of it cannot take the lock: a lease, and at least this long.
const abandonedFor = time.Minute

// letGo deletes the key if id owns it: the id of a hold that is over, or
// with abandon > 0 of an attempt given up, which is then remembered for
// that long so that a late run of it takes nothing. The first try is made
// at once when now is set, else in the background; a try that gets no
// answer (the server stalled, the network failed) is made again in the
// background, with backoff, until one is answered or id's lease would be
// over; once the Locker is closing, the tries left get two seconds in all,
// and Close reports a failure. Each try is bounded by selfReleaseTimeout,
// whatever ctx does.
func (rl *RedisLock) letGo(ctx context.Context, id string, lease, abandon time.Duration, now bool) {
	ctx = context.WithoutCancel(ctx)
	end, closing := time.Now().Add(lease), rl.locker.life.closing.Done()
	closed := func() { // Close's two seconds, for the tries left
		closing = nil
		if budget := time.Now().Add(selfReleaseTimeout); budget.Before(end) {
			end = budget
		}
	}
	if rl.lockerClosed() {
		closed()
	}
	var err error
	if now {
		if err = rl.tryLetGo(ctx, id, abandon); err == nil {
			return
		}
	}
	rl.locker.spawn(func() {
		for n := 1; ; n++ {
			if wait := clock.Backoff(lease/3, n); err != nil {
				if time.Now().Add(wait).After(end) {
					break
				}
				select {
				case <-time.After(wait):
				case <-closing:
					closed()
				}
			}
			if err = rl.tryLetGo(ctx, id, abandon); err == nil {
				return
			}
		}
		err = opErr("release", rl.key, err)
		rl.logHold(rl.locker.closedLevel(err, slog.LevelWarn), "redislock: release failed; the key expires with its lease", nil,
			slog.String("owner", id), causeAttr(err))
		if closing == nil {
			rl.locker.failed(err)
		}
	})
}

// tryLetGo makes one try of letGo, and returns its error if it went
// unanswered.
func (rl *RedisLock) tryLetGo(ctx context.Context, id string, abandon time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, selfReleaseTimeout)
	defer cancel()
	_, err := rl.release(ctx, id, abandon)
	if err != nil && !store.Ambiguous(err) {
		rl.logHold(rl.locker.closedLevel(err, slog.LevelWarn), "redislock: release failed; the key expires with its lease", nil,
			slog.String("owner", id), causeAttr(err))
		return nil
	}
	return err
}

// failed records a release that failed after Close began, for Close to
// return.
func (l *Locker) failed(err error) {
	l.life.mu.Lock()
	defer l.life.mu.Unlock()
	l.life.late = append(l.life.late, err)
}

// spawn runs f in a goroutine that Close waits for; once Close has
// waited, it runs f in the caller's.
func (l *Locker) spawn(f func()) {
	if !l.enter() {
		f()
		return
	}
	go func() {
		defer l.life.wg.Done()
		f()
	}()
}
