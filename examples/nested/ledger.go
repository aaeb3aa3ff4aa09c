package main

import (
	"context"
	"errors"
	"sync"

	"github.com/redis/go-redis/v9"

	"github.com/redislock/redislock"
)

// keyPrefix namespaces the example's keys, locks included.
const keyPrefix = "nested-example:"

var (
	// ErrClosed reports an operation on a closed account.
	ErrClosed = errors.New("account closed")
	// ErrInsufficientFunds reports a withdrawal larger than the balance.
	ErrInsufficientFunds = errors.New("insufficient funds")
)

// A Ledger keeps account balances in Redis. Each method takes the account's
// lock, and methods that call each other re-enter it. The lock belongs to
// the Ledger value, so a Ledger serves one worker: independent workers need
// a Ledger each, or they share its holds.
type Ledger struct {
	rdb    redis.Cmdable
	locker *redislock.Locker

	mu    sync.Mutex
	locks map[string]*redislock.RedisLock // by account, made on first use

	// inside, when set, is called by Withdraw inside its critical section,
	// between reading the balance and writing it, with the lock's Holds();
	// Withdraw calls the func it returns on leaving. The demo uses it to see
	// whether two workers are ever in there at once.
	inside func(ctx context.Context, holds int) (leave func())
}

// NewLedger returns a Ledger of the balances in rdb, whose locks locker makes.
func NewLedger(rdb redis.Cmdable, locker *redislock.Locker) *Ledger {
	return &Ledger{rdb: rdb, locker: locker, locks: map[string]*redislock.RedisLock{}}
}

// lock returns the Ledger's lock on acct.
func (l *Ledger) lock(acct string) *redislock.RedisLock {
	l.mu.Lock()
	defer l.mu.Unlock()
	lock, ok := l.locks[acct]
	if !ok {
		lock = l.locker.NewLock("account:" + acct)
		l.locks[acct] = lock
	}
	return lock
}

// Deposit adds n to acct's balance.
func (l *Ledger) Deposit(ctx context.Context, acct string, n int64) (err error) {
	lock := l.lock(acct)
	if err := lock.AcquireWait(ctx); err != nil {
		return err
	}
	defer release(lock, &err)
	if err := l.checkOpen(ctx, acct); err != nil {
		return err
	}
	return l.rdb.IncrBy(ctx, balanceKey(acct), n).Err()
}

// Withdraw takes n from acct's balance, if it has n.
func (l *Ledger) Withdraw(ctx context.Context, acct string, n int64) (err error) {
	lock := l.lock(acct)
	if err := lock.AcquireWait(ctx); err != nil {
		return err
	}
	defer release(lock, &err)
	if err := l.checkOpen(ctx, acct); err != nil {
		return err
	}
	balance, err := l.Balance(ctx, acct)
	if err != nil {
		return err
	}
	if l.inside != nil {
		leave := l.inside(ctx, lock.Holds())
		defer leave()
	}
	if balance < n {
		return ErrInsufficientFunds
	}
	return l.rdb.DecrBy(ctx, balanceKey(acct), n).Err()
}

// Close withdraws acct's whole balance, which it returns, and closes the
// account. Its Withdraw re-enters the lock that Close holds.
func (l *Ledger) Close(ctx context.Context, acct string) (paid int64, err error) {
	lock := l.lock(acct)
	if err := lock.AcquireWait(ctx); err != nil {
		return 0, err
	}
	defer release(lock, &err)
	if err := l.checkOpen(ctx, acct); err != nil {
		return 0, err
	}
	balance, err := l.Balance(ctx, acct)
	if err != nil {
		return 0, err
	}
	if err := l.Withdraw(ctx, acct, balance); err != nil {
		return 0, err
	}
	if err := l.rdb.Set(ctx, closedKey(acct), "1", 0).Err(); err != nil {
		return 0, err
	}
	return balance, nil
}

// Balance returns acct's balance, without the lock.
func (l *Ledger) Balance(ctx context.Context, acct string) (int64, error) {
	n, err := l.rdb.Get(ctx, balanceKey(acct)).Int64()
	if errors.Is(err, redis.Nil) {
		return 0, nil
	}
	return n, err
}

// checkOpen returns ErrClosed if acct is closed.
func (l *Ledger) checkOpen(ctx context.Context, acct string) error {
	closed, err := l.rdb.Exists(ctx, closedKey(acct)).Result()
	if err != nil {
		return err
	}
	if closed > 0 {
		return ErrClosed
	}
	return nil
}

// release gives back one acquisition of lock; if the hold had ended
// otherwise (the lock lost), it says so in *err.
func release(lock *redislock.RedisLock, err *error) {
	if _, rerr := lock.Release(); rerr != nil && *err == nil {
		*err = rerr
	}
}

func balanceKey(acct string) string { return keyPrefix + "balance:" + acct }
func closedKey(acct string) string  { return keyPrefix + "closed:" + acct }
