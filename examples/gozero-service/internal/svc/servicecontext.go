package svc

import (
	"time"

	"github.com/redislock/redislock"
	"github.com/redislock/redislock/examples/gozero-service/internal/config"

	"github.com/zeromicro/go-zero/core/stores/redis"
)

// ServiceContext holds what the service's handlers share.
type ServiceContext struct {
	Config config.Config
	Redis  *redis.Redis
	// Locker makes the invoice locks of the whole service, on Redis; Close
	// ends the holds still held, at shutdown.
	Locker  *redislock.Locker
	Gateway *Gateway

	// Unlocked makes charges skip the lock. Only the tests set it, to show
	// the duplicate charges that reach the gateway without it.
	Unlocked bool
}

// NewServiceContext connects to c.Redis and makes the service's Locker.
func NewServiceContext(c config.Config) *ServiceContext {
	store := redis.MustNewRedis(c.Redis)
	return &ServiceContext{
		Config: c,
		Redis:  store,
		// go-zero's store as it is: it is a redislock.Scripter. Without a
		// prefix, the keys are those go-zero's redis.NewRedisLock(store, key)
		// takes, so replicas not yet switched exclude these ones.
		Locker:  redislock.NewLocker(store, redislock.WithExpiry(c.LockExpiry)),
		Gateway: NewGateway(store, 100*time.Millisecond),
	}
}

// Close ends the holds of the service's locks and releases them.
func (s *ServiceContext) Close() error {
	return s.Locker.Close()
}
