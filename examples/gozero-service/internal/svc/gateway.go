package svc

import (
	"context"
	"strconv"
	"time"

	"github.com/zeromicro/go-zero/core/stores/redis"
)

// Gateway stands in for a payment provider. Like a real one, it takes an
// idempotency key, here the invoice id, and keeps it on its side, which
// every replica of the service shares (here, in Redis under "gateway:"):
// it charges an invoice once, and answers a second charge of it as a
// replay that takes no money. The lock keeps duplicate charges away from
// it; the key is what keeps a charge from being made twice when the lock
// is lost while a charge is under way (a break, a pause past the lease),
// which no lock can rule out.
type Gateway struct {
	// Delay is how long a charge takes; set it before the service starts.
	Delay time.Duration
	store *redis.Redis
}

// NewGateway returns a Gateway, keeping its records in store, whose
// charges take delay.
func NewGateway(store *redis.Redis, delay time.Duration) *Gateway {
	return &Gateway{Delay: delay, store: store}
}

// Charge charges invoice, after Delay, unless it was charged already: then
// it reports false, a replay. If ctx ends first, it charges nothing and
// returns the cause.
func (g *Gateway) Charge(ctx context.Context, invoice string) (charged bool, err error) {
	t := time.NewTimer(g.Delay)
	defer t.Stop()
	select {
	case <-t.C:
	case <-ctx.Done():
		return false, context.Cause(ctx)
	}
	// The provider's side: nothing of the caller's cuts it short now.
	ctx = context.WithoutCancel(ctx)
	if _, err := g.store.IncrCtx(ctx, "gateway:attempts:"+invoice); err != nil {
		return false, err
	}
	return g.store.SetnxCtx(ctx, "gateway:charged:"+invoice, "1")
}

// Attempts returns how many charges of invoice reached the provider: 1
// when the lock kept the duplicates away.
func (g *Gateway) Attempts(invoice string) int {
	n, _ := g.store.Get("gateway:attempts:" + invoice)
	attempts, _ := strconv.Atoi(n)
	return attempts
}

// Charged reports whether invoice was charged.
func (g *Gateway) Charged(invoice string) bool {
	ok, _ := g.store.Exists("gateway:charged:" + invoice)
	return ok
}
