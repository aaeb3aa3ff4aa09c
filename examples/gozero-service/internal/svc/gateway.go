package svc

import (
	"context"
	"sync"
	"time"
)

// Gateway stands in for a payment provider: it counts the charges it made,
// per invoice. It is not idempotent, so two overlapping charges of one
// invoice charge it twice.
type Gateway struct {
	// Delay is how long a charge takes; set it before the service starts.
	Delay time.Duration

	mu      sync.Mutex
	charges map[string]int
}

// NewGateway returns a Gateway whose charges take delay.
func NewGateway(delay time.Duration) *Gateway {
	return &Gateway{Delay: delay, charges: map[string]int{}}
}

// Charge charges invoice once, after Delay. If ctx ends first, it charges
// nothing and returns the cause.
func (g *Gateway) Charge(ctx context.Context, invoice string) error {
	t := time.NewTimer(g.Delay)
	defer t.Stop()
	select {
	case <-t.C:
	case <-ctx.Done():
		return context.Cause(ctx)
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	g.charges[invoice]++
	return nil
}

// Charges returns how many times invoice was charged.
func (g *Gateway) Charges(invoice string) int {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.charges[invoice]
}
