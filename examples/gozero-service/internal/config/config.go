package config

import (
	"time"

	"github.com/zeromicro/go-zero/core/stores/redis"
	"github.com/zeromicro/go-zero/rest"
)

// Config is the service's configuration, loaded from etc/billing.yaml.
type Config struct {
	rest.RestConf
	Redis redis.RedisConf
	// LockExpiry is the lease of an invoice's lock, renewed while a charge runs.
	LockExpiry time.Duration `json:",default=10s"`
}
