package redislock

import (
	"context"
	"errors"
	"testing"
	"time"
)

func TestDoRunsUnderTheLockAndReleasesAtOnce(t *testing.T) {
	mr, c := newMini(t)
	rl := NewRedisLock(FromGoRedis(c), "k")
	errWork := errors.New("work failed")
	err := rl.Do(context.Background(), func(ctx context.Context) error {
		if v, _ := mr.Get("k"); v != holderID(rl) || rl.Holds() != 1 {
			t.Errorf("inside Do: key %q, Holds %d", v, rl.Holds())
		}
		// Nested Do re-enters.
		return rl.Do(ctx, func(context.Context) error {
			if rl.Holds() != 2 {
				t.Errorf("nested Do: Holds %d, want 2", rl.Holds())
			}
			return errWork
		})
	})
	if !errors.Is(err, errWork) {
		t.Fatalf("Do = %v, want fn's error", err)
	}
	if mr.Exists("k") || rl.Holds() != 0 || rl.Err() != nil {
		t.Fatalf("after Do: key exists %v, Holds %d, Err %v", mr.Exists("k"), rl.Holds(), rl.Err())
	}
}

func TestDoGivesUpWithoutCallingFn(t *testing.T) {
	_, c := newMini(t)
	holder := NewRedisLock(FromGoRedis(c), "k")
	mustAcquire(t, holder)
	rl := NewRedisLock(FromGoRedis(c), "k")
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	called := false
	err := rl.Do(ctx, func(context.Context) error { called = true; return nil })
	if called || !errors.Is(err, ErrNotAcquired) || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Do on a busy lock: called %v, err %v", called, err)
	}
	mustRelease(t, holder)
	if err := rl.Do(context.Background(), nil); !errors.Is(err, ErrNilFunc) {
		t.Fatalf("Do(nil fn) = %v", err)
	}
	if err := rl.Do(nilCtx(), func(context.Context) error { return nil }); !errors.Is(err, ErrNilContext) {
		t.Fatalf("Do(nil ctx) = %v", err)
	}
	requireNoHubs(t)
}

// fn's context ends as soon as the hold is lost, with the loss as cause,
// and Do returns fn's error joined with it.
func TestDoCancelsFnWhenTheLockIsLost(t *testing.T) {
	mr, c := newMini(t)
	clk := newFakeClock()
	rl := NewRedisLock(FromGoRedis(c), "k", WithExpiry(3*time.Second), withClock(clk))
	inside := make(chan struct{})
	done := make(chan error, 1)
	go func() {
		done <- rl.Do(context.Background(), func(ctx context.Context) error {
			close(inside)
			<-ctx.Done()
			if !errors.Is(context.Cause(ctx), ErrLockLost) {
				t.Errorf("fn's cause = %v, want ErrLockLost", context.Cause(ctx))
			}
			return ctx.Err()
		})
	}()
	<-inside
	mr.Del("k")
	clk.Advance(time.Second) // the renewal finds the key gone
	var err error
	select {
	case err = <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("Do did not return after the loss")
	}
	if !errors.Is(err, ErrLockLost) || !errors.Is(err, context.Canceled) {
		t.Fatalf("Do = %v; want fn's error joined with ErrLockLost", err)
	}
	if rl.Holds() != 0 {
		t.Fatal("Do left acquisitions unreleased")
	}
	mustAcquire(t, rl) // released: usable again
	mustRelease(t, rl)
}

func TestDoCancelsFnAtTheMaximumHold(t *testing.T) {
	_, c := newMini(t)
	clk := newFakeClock()
	rl := NewRedisLock(FromGoRedis(c), "k", WithExpiry(3*time.Second), WithMaxHold(2*time.Second), withClock(clk))
	inside := make(chan struct{})
	done := make(chan error, 1)
	go func() {
		done <- rl.Do(context.Background(), func(ctx context.Context) error {
			close(inside)
			<-ctx.Done()
			return context.Cause(ctx)
		})
	}()
	<-inside
	clk.Advance(2 * time.Second)
	if err := <-done; !errors.Is(err, ErrMaxHoldExceeded) {
		t.Fatalf("Do = %v, want ErrMaxHoldExceeded", err)
	}
}

// When Do's ctx ends while fn runs, fn's context is cancelled, and the
// release follows fn's return at once: the key does not wait out its lease.
func TestDoReleasesAtOnceWhenItsContextEnds(t *testing.T) {
	mr, c := newMini(t)
	rl := NewRedisLock(FromGoRedis(c), "k")
	ctx, cancel := context.WithCancel(context.Background())
	inside := make(chan struct{})
	done := make(chan error, 1)
	go func() {
		done <- rl.Do(ctx, func(ctx context.Context) error {
			close(inside)
			<-ctx.Done()
			return nil
		})
	}()
	<-inside
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("Do = %v, want fn's nil", err)
	}
	if mr.Exists("k") {
		t.Fatal("the key waits out its lease after Do returned")
	}
}

// A panic in fn releases the lock, then goes on.
func TestDoReleasesOnPanic(t *testing.T) {
	mr, c := newMini(t)
	rl := NewRedisLock(FromGoRedis(c), "k")
	func() {
		defer func() {
			if r := recover(); r != "boom" {
				t.Fatalf("recovered %v, want the panic of fn", r)
			}
		}()
		_ = rl.Do(context.Background(), func(context.Context) error { panic("boom") })
	}()
	if mr.Exists("k") || rl.Holds() != 0 {
		t.Fatalf("after a panic: key exists %v, Holds %d", mr.Exists("k"), rl.Holds())
	}
	mustAcquire(t, rl)
	mustRelease(t, rl)
}

// Found by the fourteenth black-box review: when another goroutine released
// the hold Do had taken and then took the lock again on the same RedisLock,
// Do's release, when fn returned, gave back that new hold's acquisition and
// deleted its key. Do now gives back only an acquisition of its own hold.
func TestDoReleasesOnlyItsOwnHold(t *testing.T) {
	mr, c := newMini(t)
	rl := NewRedisLock(FromGoRedis(c), "do:own")
	err := rl.Do(context.Background(), func(ctx context.Context) error {
		mustRelease(t, rl) // the hold Do took, released behind its back
		<-ctx.Done()
		mustAcquire(t, rl) // a new hold of the same RedisLock
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if n, owner := rl.Holds(), rl.Owner(); n != 1 || mustGet(mr, "do:own") != owner {
		t.Fatalf("after Do: Holds = %d, the key holds %q, the new hold's id is %q", n, mustGet(mr, "do:own"), owner)
	}
	mustRelease(t, rl)
}
