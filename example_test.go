package redislock_test

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"
	zredis "github.com/zeromicro/go-zero/core/stores/redis"

	"github.com/redislock/redislock"
)

// startRedis stands in for your Redis in the examples.
func startRedis() *miniredis.Miniredis {
	mr := miniredis.NewMiniRedis()
	mr.ClockTTL(true) // TTLs follow the clock, as on a real server
	if err := mr.Start(); err != nil {
		panic(err)
	}
	return mr
}

// Do is the safe way to work under a lock: it waits for the lock, runs fn
// with a context that ends if the lock is lost, and releases the lock when
// fn returns, even by a panic.
func ExampleRedisLock_Do() {
	mr := startRedis()
	defer mr.Close()
	rdb := redis.NewClient(&redis.Options{Addr: mr.Addr()})
	defer rdb.Close()

	lock := redislock.NewRedisLock(redislock.FromGoRedis(rdb), "invoice:42")
	err := lock.Do(context.Background(), func(ctx context.Context) error {
		fmt.Println("billing, lock held:", mr.Exists("invoice:42"))
		return nil // ctx ends if the lock is lost: stop then
	})
	fmt.Println("done:", err, "lock held:", mr.Exists("invoice:42"))
	// Output:
	// billing, lock held: true
	// done: <nil> lock held: false
}

// A go-zero service switches by changing one import.
func ExampleNewRedisLock_goZero() {
	mr := startRedis()
	defer mr.Close()

	// NonBlock, as go-zero's config defaults it: no ping at start, whose
	// 1 s timeout a busy machine can miss, and MustNewRedis then exits.
	// DisableIdentity for servers that refuse CLIENT SETINFO (miniredis,
	// Redis before 7.2), which go-zero's breaker counts as failures.
	store := zredis.MustNewRedis(zredis.RedisConf{Host: mr.Addr(), Type: zredis.NodeType, NonBlock: true, DisableIdentity: true})
	lock := redislock.NewRedisLock(store, "invoice:42")
	lock.SetExpire(10) // a 10.5s lease, renewed while held

	ok, err := lock.Acquire()
	fmt.Println("acquired:", ok, err)
	// ... bill the customer ...
	ok, err = lock.Release()
	fmt.Println("released:", ok, err)
	// Output:
	// acquired: true <nil>
	// released: true <nil>
}

// With go-redis v9, adapt the client; Client, ClusterClient, Ring and the
// failover client all work.
func ExampleFromGoRedis() {
	mr := startRedis()
	defer mr.Close()
	rdb := redis.NewClient(&redis.Options{Addr: mr.Addr()})
	defer rdb.Close()

	lock := redislock.NewRedisLock(redislock.FromGoRedis(rdb), "report:nightly", redislock.WithExpiry(5*time.Second))
	other := redislock.NewRedisLock(redislock.FromGoRedis(rdb), "report:nightly")

	ok, err := lock.AcquireCtx(context.Background())
	fmt.Println("first:", ok, err)
	ok, err = other.AcquireCtx(context.Background())
	fmt.Println("second, while the first holds it:", ok, err)
	lock.Release()
	// Output:
	// first: true <nil>
	// second, while the first holds it: false <nil>
}

// Nested calls re-enter the lock they hold: n acquisitions need n releases.
func ExampleRedisLock_Holds() {
	mr := startRedis()
	defer mr.Close()
	rdb := redis.NewClient(&redis.Options{Addr: mr.Addr()})
	defer rdb.Close()
	lock := redislock.NewRedisLock(redislock.FromGoRedis(rdb), "account:7")

	writeLedger := func() {
		lock.Acquire() // re-enters: one round trip checks that it is still ours
		defer lock.Release()
		fmt.Println("in writeLedger, holds:", lock.Holds())
	}
	lock.Acquire()
	writeLedger()
	fmt.Println("back, holds:", lock.Holds(), "key still there:", mr.Exists("account:7"))
	lock.Release()
	fmt.Println("released, key still there:", mr.Exists("account:7"))
	// Output:
	// in writeLedger, holds: 2
	// back, holds: 1 key still there: true
	// released, key still there: false
}

// A job longer than its lease: the watchdog renews it, and Done tells the
// job at once when the lock is lost all the same.
func ExampleRedisLock_Done() {
	mr := startRedis()
	defer mr.Close()
	rdb := redis.NewClient(&redis.Options{Addr: mr.Addr()})
	defer rdb.Close()
	lock := redislock.NewRedisLock(redislock.FromGoRedis(rdb), "migration", redislock.WithExpiry(300*time.Millisecond))

	lock.Acquire()
	defer lock.Release()
	for step := 1; step <= 3; step++ {
		select {
		case <-lock.Done():
			fmt.Println("lost:", lock.Err())
			return
		case <-time.After(300 * time.Millisecond): // one lease per step
			fmt.Printf("step %d done, still ours: %v\n", step, mr.Exists("migration"))
		}
	}
	mr.Del("migration") // as a failover or an operator would
	<-lock.Done()
	fmt.Println("lost:", errors.Is(lock.Err(), redislock.ErrLockLost))
	// Output:
	// step 1 done, still ours: true
	// step 2 done, still ours: true
	// step 3 done, still ours: true
	// lost: true
}

// AcquireWait blocks until the lock is released, or its context ends, or
// its wait timeout passes (WithWaitTimeout bounds the wait, not the hold).
func ExampleRedisLock_AcquireWait() {
	mr := startRedis()
	defer mr.Close()
	rdb := redis.NewClient(&redis.Options{Addr: mr.Addr()})
	defer rdb.Close()
	holder := redislock.NewRedisLock(redislock.FromGoRedis(rdb), "cron:cleanup")
	waiter := redislock.NewRedisLock(redislock.FromGoRedis(rdb), "cron:cleanup")
	holder.Acquire()

	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	err := waiter.AcquireWait(ctx)
	cancel()
	fmt.Println("gave up:", errors.Is(err, redislock.ErrNotAcquired), errors.Is(err, context.DeadlineExceeded))

	time.AfterFunc(50*time.Millisecond, func() { holder.Release() })
	err = waiter.AcquireWait(context.Background()) // woken by the release
	fmt.Println("acquired after the release:", err == nil)

	impatient := redislock.NewRedisLock(redislock.FromGoRedis(rdb), "cron:cleanup",
		redislock.WithWaitTimeout(100*time.Millisecond))
	err = impatient.AcquireWait(context.Background())
	fmt.Println("impatient gave up:", errors.Is(err, redislock.ErrNotAcquired), errors.Is(err, context.DeadlineExceeded))
	waiter.Release()
	// Output:
	// gave up: true true
	// acquired after the release: true
	// impatient gave up: true true
}

// fencedWrite is the protected resource's side of fencing: a Redis hash that
// records the highest token it has seen and refuses writes with a lower one.
// A SQL table does the same with a conditional update:
//
//	UPDATE reports SET body = $2, token = $1 WHERE id = $3 AND token <= $1
var fencedWrite = redis.NewScript(`
local highest = tonumber(redis.call("HGET", KEYS[1], "token") or "0")
if tonumber(ARGV[1]) < highest then
  return 0
end
redis.call("HSET", KEYS[1], "token", ARGV[1], "body", ARGV[2])
return 1`)

func ExampleWithFencing() {
	mr := miniredis.NewMiniRedis() // FastForward moves its TTLs
	if err := mr.Start(); err != nil {
		panic(err)
	}
	defer mr.Close()
	rdb := redis.NewClient(&redis.Options{Addr: mr.Addr()})
	defer rdb.Close()
	ctx := context.Background()
	write := func(who string, token int64) {
		ok, _ := fencedWrite.Run(ctx, rdb, []string{"report:nightly"}, token, "written by "+who).Int()
		fmt.Printf("%s writes: accepted=%v\n", who, ok == 1)
	}

	a := redislock.NewRedisLock(redislock.FromGoRedis(rdb), "lock:report",
		redislock.WithFencing(), redislock.WithExpiry(time.Second), redislock.WithoutWatchdog())
	b := redislock.NewRedisLock(redislock.FromGoRedis(rdb), "lock:report", redislock.WithFencing())
	if ok, _ := a.Acquire(); ok {
		fmt.Println("a holds the lock")
	}
	tokenA := a.Token()

	mr.FastForward(2 * time.Second) // a stalls past its lease; the key expires
	if ok, _ := b.Acquire(); ok {
		fmt.Println("b holds the lock; its token is higher:", b.Token() > tokenA)
	}
	write("b", b.Token())
	write("a", tokenA) // a wakes up and writes, unaware: refused
	b.Release()
	a.Release()
	// Output:
	// a holds the lock
	// b holds the lock; its token is higher: true
	// b writes: accepted=true
	// a writes: accepted=false
}
