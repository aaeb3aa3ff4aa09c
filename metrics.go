package redislock

import (
	"context"
	"errors"
	"time"

	"github.com/zeromicro/go-zero/core/metric"
)

// Metrics, through go-zero's core/metric: registered with Prometheus's
// default registry, and no-ops unless the service enables Prometheus (as a
// go-zero service does with its Prometheus config). None has a key label,
// so that their number does not grow with the number of lock names.
var (
	metricAcquisitions = metric.NewCounterVec(&metric.CounterVecOpts{
		Namespace: "redislock", Name: "acquisitions_total",
		Help:   "Acquisition attempts by result: acquired, reentered, busy, lost (a re-entry found the lock gone), error.",
		Labels: []string{"result"},
	})
	metricWait = metric.NewHistogramVec(&metric.HistogramVecOpts{
		Namespace: "redislock", Name: "wait_duration_seconds",
		Help:    "How long AcquireWait waited, by outcome: acquired, gave_up, error.",
		Labels:  []string{"outcome"},
		Buckets: []float64{.0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30},
	})
	metricHold = metric.NewHistogramVec(&metric.HistogramVecOpts{
		Namespace: "redislock", Name: "hold_duration_seconds",
		Help:    "How long holds lasted, from the first acquisition, by how they ended: released, lost, max_hold, context (the lease ran out after the holding context ended).",
		Labels:  []string{"end"},
		Buckets: []float64{.001, .005, .01, .05, .1, .5, 1, 5, 10, 30, 60, 300, 900, 3600},
	})
	metricRenewals = metric.NewCounterVec(&metric.CounterVecOpts{
		Namespace: "redislock", Name: "renewals_total",
		Help:   "Watchdog renewals by result: ok, lost (the key was gone or taken), failed (retried).",
		Labels: []string{"result"},
	})
	metricLosses = metric.NewCounterVec(&metric.CounterVecOpts{
		Namespace: "redislock", Name: "losses_total",
		Help:   "Holds lost, by cause: key_gone (deleted, expired or taken, found by a renewal, re-entry, release or TTL), lease_ran_out (renewals failed until the validity deadline).",
		Labels: []string{"cause"},
	})
	metricHeld = metric.NewGaugeVec(&metric.GaugeVecOpts{
		Namespace: "redislock", Name: "held",
		Help: "Locks held by this process now.",
	})
)

// errLeaseRanOut is in the chain of the loss reported when renewals failed
// until the validity deadline.
var errLeaseRanOut = errors.New("lease ran out")

// label returns v as the one-value slice the vectors take; the values of
// the hot path (an acquisition and its release) allocate nothing.
func label(v string) []string {
	switch v {
	case "acquired":
		return acquiredLabel
	case "released":
		return releasedLabel
	}
	return []string{v}
}

var acquiredLabel, releasedLabel = []string{"acquired"}, []string{"released"}

// endOf names how a hold that ended with cause ended: released, lost,
// max_hold, or context (the lease ran out after the holding context ended).
func endOf(cause error) string {
	switch {
	case cause == nil:
		return "released"
	case errors.Is(cause, ErrLockLost):
		return "lost"
	case errors.Is(cause, ErrMaxHoldExceeded):
		return "max_hold"
	}
	return "context"
}

// countEnd records the end of a hold. The caller holds rl.mu.
func (rl *RedisLock) countEnd(h *hold, cause error) {
	end := endOf(cause)
	if end == "lost" {
		if errors.Is(cause, errLeaseRanOut) {
			metricLosses.Inc("lease_ran_out")
		} else {
			metricLosses.Inc("key_gone")
		}
	}
	metricHold.ObserveFloat(rl.locker.clock.Now().Sub(h.renewal.Started()).Seconds(), label(end)...)
	metricHeld.Dec()
}

// waitOutcome names how a wait that returned err ended: acquired,
// gave_up, or error.
func waitOutcome(err error) string {
	switch {
	case err == nil:
		return "acquired"
	case errors.Is(err, ErrNotAcquired), errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		return "gave_up"
	}
	return "error"
}

// countWait records how an AcquireWait that began at start ended.
func countWait(start time.Time, err error) {
	metricWait.ObserveFloat(time.Since(start).Seconds(), waitOutcome(err))
}

// countAcquire records an acquisition attempt's result.
func countAcquire(reentry, ok bool, err error) {
	outcome := "busy"
	switch {
	case ok && reentry:
		outcome = "reentered"
	case ok:
		outcome = "acquired"
	case errors.Is(err, ErrLockLost), errors.Is(err, ErrMaxHoldExceeded):
		outcome = "lost"
	case err != nil:
		outcome = "error"
	}
	metricAcquisitions.Inc(label(outcome)...)
}

// countRenewals records the renewals of a batch by result.
func countRenewals(ok, lost, failed int) {
	if ok > 0 {
		metricRenewals.Add(float64(ok), "ok")
	}
	if lost > 0 {
		metricRenewals.Add(float64(lost), "lost")
	}
	if failed > 0 {
		metricRenewals.Add(float64(failed), "failed")
	}
}
