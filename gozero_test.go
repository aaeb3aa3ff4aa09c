package redislock

import (
	"context"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
)

// The cases of go-zero's own RedisLock tests (core/stores/redis,
// redislock_test.go, v1.10.3), with the import switched: the same calls on
// go-zero's store, and the same assertions.

func TestGoZeroSuiteRedisLock(t *testing.T) {
	for name, ctx := range map[string]context.Context{"normal": nil, "withContext": context.Background()} {
		t.Run(name, func(t *testing.T) {
			mr := miniredis.RunT(t)
			store := goZeroStore(t, mr.Addr())
			key := "gozero:" + newID()
			acquire := func(rl *RedisLock) (bool, error) { return rl.Acquire() }
			release := func(rl *RedisLock) (bool, error) { return rl.Release() }
			if ctx != nil { // go-zero's test names this case; here it uses the context
				acquire = func(rl *RedisLock) (bool, error) { return rl.AcquireCtx(ctx) }
				release = func(rl *RedisLock) (bool, error) { return rl.ReleaseCtx(ctx) }
			}
			first := NewRedisLock(store, key)
			first.SetExpire(5)
			ok, err := acquire(first)
			if err != nil || !ok {
				t.Fatalf("first Acquire = %v, %v; want true, nil", ok, err)
			}
			second := NewRedisLock(store, key)
			second.SetExpire(5)
			if ok, err := acquire(second); err != nil || ok {
				t.Fatalf("second Acquire = %v, %v; want false, nil", ok, err)
			}
			if ok, err := release(first); err != nil || !ok {
				t.Fatalf("Release = %v, %v; want true, nil", ok, err)
			}
			if ok, err := acquire(second); err != nil || !ok {
				t.Fatalf("second Acquire after release = %v, %v; want true, nil", ok, err)
			}
			if ok, err := release(second); err != nil || !ok {
				t.Fatalf("second Release = %v, %v; want true, nil", ok, err)
			}
		})
	}
}

func TestGoZeroSuiteRedisLockExpired(t *testing.T) {
	mr := miniredis.RunT(t)
	store := goZeroStore(t, mr.Addr())
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := NewRedisLock(store, "gozero:"+newID()).AcquireCtx(ctx); err == nil {
		t.Fatal("AcquireCtx with a cancelled context: nil error")
	}
	if _, err := NewRedisLock(store, "gozero:"+newID()).ReleaseCtx(ctx); err == nil {
		t.Fatal("ReleaseCtx with a cancelled context: nil error")
	}
}

// For every way a go-zero service uses its lock, ours holds at least as
// long as go-zero's would: a request context that ends after AcquireCtx
// leaves the key in place for the rest of its lease (go-zero's lock never
// looks at that context again), and Done stays open until then.
func TestGoZeroRequestContextHoldsAtLeastAsLong(t *testing.T) {
	mr := miniredis.RunT(t)
	store := goZeroStore(t, mr.Addr())
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	rl := NewRedisLock(store, "invoice:1")
	rl.SetExpire(1) // 1.5 s
	if ok, err := rl.AcquireCtx(ctx); !ok || err != nil {
		t.Fatal(ok, err)
	}
	<-ctx.Done()
	time.Sleep(50 * time.Millisecond) // the request is over; its handler goes on
	if !mr.Exists("invoice:1") || isClosed(rl.Done()) {
		t.Fatalf("after the request context ended: key exists %v, Done closed %v", mr.Exists("invoice:1"), isClosed(rl.Done()))
	}
	other := NewRedisLock(store, "invoice:1")
	if ok, _ := other.Acquire(); ok {
		t.Fatal("another owner took the lock within the lease")
	}
	if ok, err := rl.Release(); !ok || err != nil { // before the lease ran out: as usual
		t.Fatalf("Release = %v, %v", ok, err)
	}
}
