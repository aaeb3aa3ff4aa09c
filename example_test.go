package redislock_test

import (
	"context"
	"fmt"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"

	"github.com/redislock/redislock"
)

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
	mr := miniredis.NewMiniRedis()
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
