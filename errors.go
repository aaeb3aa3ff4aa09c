package redislock

import (
	"errors"
	"fmt"
	"strings"

	"github.com/redislock/redislock/internal/store"
)

// Errors returned by this package; match them with errors.Is.
var (
	// ErrLockLost reports that a hold ended because the key no longer holds
	// our id (deleted, expired, taken by another owner), or because renewals
	// failed until the lease ran out by our own accounting.
	ErrLockLost = errors.New("redislock: lock lost")
	// ErrNotHeld reports that an operation needs a hold this RedisLock does not have.
	ErrNotHeld = errors.New("redislock: lock not held")
	// ErrMaxHoldExceeded reports that a hold ended because it reached the
	// maximum hold time set with WithMaxHold.
	ErrMaxHoldExceeded = errors.New("redislock: maximum hold time exceeded")
	// ErrEmptyKey reports an empty lock key, with or without a WithPrefix
	// prefix: the key names the lock within its namespace.
	ErrEmptyKey = errors.New("redislock: empty key")
	// ErrKeyTooLong reports a key longer than MaxKeyLen bytes.
	ErrKeyTooLong = errors.New("redislock: key too long")
	// ErrReservedKey reports a key named as a related key of another lock
	// (its fencing counter, say: see "Keys a lock uses" in
	// docs/semantics.md), which that lock would write over.
	ErrReservedKey = errors.New("redislock: key reserved for another lock's use")
	// ErrNilStore reports a nil Scripter, or a RedisLock not made by NewRedisLock.
	ErrNilStore = errors.New("redislock: nil store")
	// ErrNilContext reports a nil context.Context.
	ErrNilContext = errors.New("redislock: nil context")
	// ErrInvalidExpiry reports a duration out of range: a lease (WithExpiry,
	// SetExpire) outside [MinExpiry, MaxExpiry], or a zero or negative
	// duration given to an option.
	ErrInvalidExpiry = errors.New("redislock: invalid expiry")
	// ErrCorruptFencingCounter reports that a fenced acquisition found its
	// fencing counter holding something other than a decimal integer in
	// [0, 2^53-1) (someone else wrote it, or it is used up): nothing was
	// changed, and the lock was not taken.
	ErrCorruptFencingCounter = store.ErrCorruptFencingCounter
	// ErrNilFunc reports a nil function given to Do or Watch.
	ErrNilFunc = errors.New("redislock: nil function")
	// ErrUnexpectedReply reports a reply from Redis that none of our scripts
	// gives: a nil, a wrong type, or an out-of-range number.
	ErrUnexpectedReply = store.ErrUnexpectedReply
	// ErrWrongType reports that a lock's key holds a value of another type,
	// which someone else wrote: it is no lock, semaphore or shared lock of
	// ours, and Inspect cannot read it nor Break delete it.
	ErrWrongType = errors.New("redislock: key holds a value that is not a lock")
	// ErrHeldByOther reports that Break was asked to break one owner's lock
	// and found it held by another owner.
	ErrHeldByOther = errors.New("redislock: held by another owner")
	// ErrRefused reports that Redis refused a command a call needed: memory
	// full under noeviction (OOM), a read-only replica (READONLY), a failed
	// save (MISCONF), an ACL denial, a server still loading (LOADING), and
	// the like. The error names the command and its key, and wraps the
	// server's error (errors.As finds a redis.Error). The call took no lock
	// and changed nothing of anyone else's; see "When Redis refuses" in
	// docs/reliability.md.
	ErrRefused = store.ErrRefused
	// ErrNotReplicated reports that a write of a hold made WithReplicas(n)
	// was not acknowledged by n replicas in time (it was given back, or
	// for a renewal, counts as failed), or that fewer than n replicas were
	// online (nothing was written), or that the store cannot send WAIT.
	ErrNotReplicated = store.ErrNotReplicated
	// ErrInvalidReplicas reports a negative number given to WithReplicas.
	ErrInvalidReplicas = errors.New("redislock: invalid replicas")
	// ErrNotAcquired reports that AcquireWait or Do gave up: its context ended,
	// or its wait timeout passed (the error then matches ctx.Err() or
	// context.DeadlineExceeded too), or its RetryStrategy ran out.
	ErrNotAcquired = errors.New("redislock: not acquired")
	// ErrLockerClosed reports a call on a lock of a Locker that was closed, and
	// is why the holds it ended ended.
	ErrLockerClosed = errors.New("redislock: locker closed")
	// ErrNotLeader reports a call that needs this Election to lead.
	ErrNotLeader = errors.New("redislock: not the leader")
	// ErrNoLeader reports that nobody leads, or that the leader has not
	// proclaimed its value yet.
	ErrNoLeader = errors.New("redislock: no leader")
	// ErrCampaigning reports a Campaign of an Election that campaigns or
	// leads already.
	ErrCampaigning = errors.New("redislock: campaigning already")
	// ErrEmptyValue reports an empty leader's value.
	ErrEmptyValue = errors.New("redislock: empty value")
)

// opErr is err from operation op on key: "redislock: op "key": err",
// with the "redislock: " of a sentinel error said once.
func opErr(op, key string, err error) error {
	return &opError{op: op, key: key, err: err}
}

type opError struct {
	op, key string
	err     error
}

func (e *opError) Error() string {
	return fmt.Sprintf("redislock: %s %q: %s", e.op, e.key, bare(e.err))
}

func (e *opError) Unwrap() error { return e.err }

// bare is err's message without the "redislock: " it may start with, for
// a message that says it already.
func bare(err error) string {
	return strings.TrimPrefix(err.Error(), "redislock: ")
}
