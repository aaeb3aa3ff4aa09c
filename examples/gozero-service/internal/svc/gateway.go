package svc

import (
	"context"
	"sync"
	"time"
)

// Gateway stands in for a payment provider. Like a real one, it takes an
// idempotency key, here the invoice id: it charges an invoice once, and
// answers a second charge of it as a replay that takes no money. The lock
// keeps duplicate charges away from it; the key is what keeps a charge from
// being made twice when the lock is lost while a charge is under way (a
// break, a pause past the lease), which no lock can rule out.
type Gateway struct {
	// Delay is how long a charge takes; set it before the service starts.
	Delay time.Duration

	mu       sync.Mutex
	attempts map[string]int // charges that reached the provider
	charged  map[string]bool
}

// NewGateway returns a Gateway whose charges take delay.
func NewGateway(delay time.Duration) *Gateway {
	return &Gateway{Delay: delay, attempts: map[string]int{}, charged: map[string]bool{}}
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
	g.mu.Lock()
	defer g.mu.Unlock()
	g.attempts[invoice]++
	if g.charged[invoice] {
		return false, nil
	}
	g.charged[invoice] = true
	return true, nil
}

// Attempts returns how many charges of invoice reached the provider: 1
// when the lock kept the duplicates away.
func (g *Gateway) Attempts(invoice string) int {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.attempts[invoice]
}

// Charged reports whether invoice was charged.
func (g *Gateway) Charged(invoice string) bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.charged[invoice]
}
