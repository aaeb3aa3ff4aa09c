package redislock

import (
	"context"

	"github.com/redis/go-redis/v9"

	"github.com/redislock/redislock/internal/store"
)

// Scripter runs a Lua script on Redis. It is the only thing a RedisLock needs
// from a Redis client.
//
// go-zero's *redis.Redis satisfies it as it is; FromGoRedis adapts any go-redis
// v9 client. Implementations must return the script's reply as go-redis does
// (int64 for integers, string for status and bulk strings) and run the script
// with EVALSHA, falling back to EVAL when the server does not know it, as
// redis.Script.Run does.
type Scripter interface {
	ScriptRunCtx(ctx context.Context, script *redis.Script, keys []string, args ...any) (any, error)
}

// FromGoRedis adapts a go-redis v9 client (Client, ClusterClient, Ring, a
// failover client, or any UniversalClient) to Scripter, or the
// AutoPipeliner of a Client or a ClusterClient, through which concurrent
// calls share round trips (WithReplicas is refused through a
// ClusterClient's). It returns nil for a nil client, which NewRedisLock
// reports as ErrNilStore.
func FromGoRedis(c redis.Scripter) Scripter {
	return store.GoRedis(c)
}

// Evaler is an optional interface beside Scripter: a store that has it (as
// go-zero's *redis.Redis does) gets our scripts run with EVAL, never EVALSHA.
// go-zero's circuit breaker counts the NOSCRIPT replies that EVALSHA gets
// after a restart, a failover or SCRIPT FLUSH as failures, and once open
// refuses acquisitions and releases alike; EVAL never gets NOSCRIPT, for the
// cost of sending a script of a few hundred bytes with each call.
type Evaler interface {
	EvalCtx(ctx context.Context, script string, keys []string, args ...any) (any, error)
}

// Subscriber is what wake-ups need from a go-redis client: Client,
// ClusterClient, Ring and every UniversalClient have it.
type Subscriber interface {
	Subscribe(ctx context.Context, channels ...string) *redis.PubSub
}
