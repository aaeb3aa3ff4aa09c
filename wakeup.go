package redislock

import (
	"context"

	"github.com/redislock/redislock/internal/store"

	"github.com/redis/go-redis/v9"
)

// Subscriber is what wake-ups need from a go-redis client: Client,
// ClusterClient, Ring and every UniversalClient have it.
type Subscriber interface {
	Subscribe(ctx context.Context, channels ...string) *redis.PubSub
}

// WithPubSub sets the client whose pub/sub wakes AcquireWait when the lock is
// released. A RedisLock made with FromGoRedis uses that client by default;
// give one for go-zero's store, which exposes no pub/sub. WithPubSub(nil)
// turns wake-ups off: AcquireWait then paces its attempts by its
// RetryStrategy alone.
func WithPubSub(s Subscriber) Option {
	return func(o *options) {
		o.pubsub, o.pubsubSet = s, true
		if store.IsNil(s) {
			o.pubsub = nil
		}
	}
}
