package redislock

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/zeromicro/go-zero/core/metric"
)

// Metrics, through go-zero's core/metric: registered with Prometheus's
// default registry, and no-ops unless the service enables Prometheus (as a
// go-zero service does with its Prometheus config). Each has the lock's
// kind (lock, fair, permit, shared) and prefix (WithPrefix's, "" without)
// as labels, none the key: their number grows with the prefixes an
// operator chose, not with the number of lock names.
var (
	metricAcquisitions = metric.NewCounterVec(&metric.CounterVecOpts{
		Namespace: "redislock", Name: "acquisitions_total",
		Help:   "Acquisition attempts by result: acquired, reentered, busy, lost (a re-entry found the lock gone), error.",
		Labels: []string{"result", "kind", "prefix"},
	})
	metricWait = metric.NewHistogramVec(&metric.HistogramVecOpts{
		Namespace: "redislock", Name: "wait_duration_seconds",
		Help:    "How long AcquireWait waited, by outcome: acquired, gave_up, error.",
		Labels:  []string{"outcome", "kind", "prefix"},
		Buckets: []float64{.0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30},
	})
	metricHold = metric.NewHistogramVec(&metric.HistogramVecOpts{
		Namespace: "redislock", Name: "hold_duration_seconds",
		Help:    "How long holds lasted, from the first acquisition, by how they ended: released, lost, max_hold, closed (the Locker's Close), context (the lease ran out after the holding context ended).",
		Labels:  []string{"end", "kind", "prefix"},
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
		Labels: []string{"cause", "kind", "prefix"},
	})
	metricHeld = metric.NewGaugeVec(&metric.GaugeVecOpts{
		Namespace: "redislock", Name: "held",
		Help:   "Holds this process has now.",
		Labels: []string{"kind", "prefix"},
	})
)

// errLeaseRanOut is in the chain of the loss reported when renewals failed
// until the validity deadline.
var errLeaseRanOut = errors.New("lease ran out")

// labels are the label values of a lock's series: for each value of a
// metric's first label, the value, the lock's kind and its prefix; made
// once per kind and prefix, so that the hot path (an acquisition and its
// release) allocates nothing.
type labels struct {
	of   map[string][]string
	held []string // the gauge's: kind and prefix
}

// labelSets holds the labels of each kind and prefix in use.
var labelSets struct {
	sync.RWMutex
	m map[[2]string]*labels // by kind and prefix: a lookup allocates nothing
}

// series returns the labels of rl's series (a RedisLock not made by
// NewRedisLock has the defaults').
func (rl *RedisLock) series() *labels {
	if rl.labels == nil {
		return labelsOf(rl.kind(), rl.opts.prefix)
	}
	return rl.labels
}

// labelsOf returns the labels of a lock of kind and prefix.
func labelsOf(kind, prefix string) *labels {
	k := [2]string{kind, prefix}
	labelSets.RLock()
	l := labelSets.m[k]
	labelSets.RUnlock()
	if l != nil {
		return l
	}
	l = &labels{of: map[string][]string{}, held: []string{kind, prefix}}
	for _, v := range []string{"acquired", "reentered", "busy", "lost", "error", "gave_up", "released", "max_hold", "closed", "context",
		"key_gone", "lease_ran_out"} {
		l.of[v] = []string{v, kind, prefix}
	}
	labelSets.Lock()
	defer labelSets.Unlock()
	if have := labelSets.m[k]; have != nil {
		return have
	}
	if labelSets.m == nil {
		labelSets.m = map[[2]string]*labels{}
	}
	labelSets.m[k] = l
	return l
}

// endOf names how a hold that ended with cause ended: released, lost,
// max_hold, closed (its Locker's Close), or context (the lease ran out
// after the holding context ended).
func endOf(cause error) string {
	switch {
	case cause == nil:
		return "released"
	case errors.Is(cause, ErrLockLost):
		return "lost"
	case errors.Is(cause, ErrMaxHoldExceeded):
		return "max_hold"
	case errors.Is(cause, ErrLockerClosed):
		return "closed"
	}
	return "context"
}

// countEnd records the end of a hold. The caller holds rl.mu.
func (rl *RedisLock) countEnd(h *hold, cause error) {
	end := endOf(cause)
	if end == "lost" {
		if errors.Is(cause, errLeaseRanOut) {
			metricLosses.Inc(rl.series().of["lease_ran_out"]...)
		} else {
			metricLosses.Inc(rl.series().of["key_gone"]...)
		}
	}
	metricHold.ObserveFloat(rl.locker.clock.Now().Sub(h.renewal.Started()).Seconds(), rl.series().of[end]...)
	metricHeld.Dec(rl.series().held...)
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

// countWait records how an AcquireWait of rl that began at start ended.
func (rl *RedisLock) countWait(start time.Time, err error) {
	metricWait.ObserveFloat(time.Since(start).Seconds(), rl.series().of[waitOutcome(err)]...)
}

// countAcquire records the result of an acquisition attempt of rl.
func (rl *RedisLock) countAcquire(reentry, ok bool, err error) {
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
	metricAcquisitions.Inc(rl.series().of[outcome]...)
}

// countRenewals records the renewals of a batch by result. A batch mixes
// kinds and prefixes: the renewals have no labels but the result.
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
