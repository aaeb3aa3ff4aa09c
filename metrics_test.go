package redislock

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	prom "github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/redis/go-redis/v9"
	"github.com/zeromicro/go-zero/core/prometheus"
)

// metricValue reads a metric from Prometheus's default registry: a
// counter's or gauge's value, or a histogram's count, summed over the
// series whose label (if any) has the given value.
func metricValue(t *testing.T, name, label, value string) float64 {
	t.Helper()
	families, err := prom.DefaultGatherer.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var sum float64
	for _, f := range families {
		if f.GetName() != name {
			continue
		}
		for _, m := range f.GetMetric() {
			match := label == ""
			for _, l := range m.GetLabel() {
				if l.GetName() == label && l.GetValue() == value {
					match = true
				}
			}
			if !match {
				continue
			}
			switch {
			case m.Counter != nil:
				sum += m.Counter.GetValue()
			case m.Gauge != nil:
				sum += m.Gauge.GetValue()
			case m.Histogram != nil:
				sum += float64(m.Histogram.GetSampleCount())
			}
		}
	}
	return sum
}

func TestMetrics(t *testing.T) {
	prometheus.Enable()
	type series struct{ name, label, value string }
	watched := []series{
		{"redislock_acquisitions_total", "result", "acquired"},
		{"redislock_acquisitions_total", "result", "reentered"},
		{"redislock_acquisitions_total", "result", "busy"},
		{"redislock_acquisitions_total", "result", "lost"},
		{"redislock_wait_duration_seconds", "outcome", "acquired"},
		{"redislock_wait_duration_seconds", "outcome", "gave_up"},
		{"redislock_hold_duration_seconds", "end", "released"},
		{"redislock_hold_duration_seconds", "end", "lost"},
		{"redislock_hold_duration_seconds", "end", "max_hold"},
		{"redislock_hold_duration_seconds", "end", "context"},
		{"redislock_renewals_total", "result", "ok"},
		{"redislock_renewals_total", "result", "lost"},
		{"redislock_losses_total", "cause", "key_gone"},
		{"redislock_losses_total", "cause", "lease_ran_out"},
		{"redislock_held", "", ""},
	}
	before := map[series]float64{}
	for _, s := range watched {
		before[s] = metricValue(t, s.name, s.label, s.value)
	}

	mr, c := newMini(t)
	a := NewRedisLock(FromGoRedis(c), "m")
	b := NewRedisLock(FromGoRedis(c), "m")
	mustAcquire(t, a)             // acquired, held +1
	mustAcquire(t, a)             // reentered
	if ok, _ := b.Acquire(); ok { // busy
		t.Fatal("b got a's lock")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	_ = b.AcquireWait(ctx) // wait gave_up (one more busy attempt)
	cancel()
	if held := metricValue(t, "redislock_held", "", ""); held != before[watched[14]]+1 {
		t.Fatalf("held = %v while a holds, want %v", held, before[watched[14]]+1)
	}
	mustRelease(t, a)
	mustRelease(t, a)                                           // hold released
	if err := b.AcquireWait(context.Background()); err != nil { // wait acquired
		t.Fatal(err)
	}
	mr.Del("m")
	if ok, _ := b.Acquire(); ok { // a re-entry that finds it gone: lost, key_gone
		t.Fatal("re-entered a deleted lock")
	}
	b.Release()

	w := newWatched(t, "renewed") // renewals ok, then lost; key_gone again
	w.clk.Step(t)
	w.mr.Del("renewed")
	w.clk.Advance(time.Second)
	waitDone(t, w.rl.Done(), "renewal after delete")
	w.rl.Release()

	f := newWatched(t, "failing") // renewals fail until the lease runs out
	f.spy.setFail(func(*redis.Script) error { return netErr })
	for !f.clk.StepOr(t, f.rl.Done()) {
	}
	f.rl.Release()

	m := newWatched(t, "maxhold", WithMaxHold(time.Second)) // max_hold
	m.clk.Advance(time.Second)
	waitDone(t, m.rl.Done(), "max hold")
	m.rl.Release()

	hctx, hcancel := context.WithCancel(context.Background()) // context
	hclk := newFakeClock()
	h := NewRedisLock(FromGoRedis(c), "ctx", WithExpiry(3*time.Second), withClock(hclk))
	if ok, err := h.AcquireCtx(hctx); !ok || err != nil {
		t.Fatal(ok, err)
	}
	hcancel()
	waitState(t, h, h.cur, expiring)
	hclk.Advance(3 * time.Second) // the hold lasts out its lease, then ends
	waitDone(t, h.Done(), "context")
	h.Release()

	// Exact counts of what this test did: a, b, w, f, m and h each made one
	// first acquisition; the losses are b's re-entry and w's renewal
	// (key_gone) and f's lease (lease_ran_out).
	for s, want := range map[series]float64{
		watched[0]: 6, watched[1]: 1, watched[3]: 1,
		watched[4]: 1, watched[5]: 1,
		watched[6]: 1, watched[7]: 3, watched[8]: 1, watched[9]: 1,
		watched[10]: 1, watched[11]: 1,
		watched[12]: 2, watched[13]: 1,
	} {
		if got := metricValue(t, s.name, s.label, s.value) - before[s]; got != want {
			t.Errorf("%s{%s=%q} went up by %v, want %v", s.name, s.label, s.value, got, want)
		}
	}
	// b's Acquire, the wait's first attempt, and maybe one more once it
	// subscribed.
	if got := metricValue(t, watched[2].name, watched[2].label, watched[2].value) - before[watched[2]]; got < 2 || got > 3 {
		t.Errorf("busy went up by %v, want 2 or 3", got)
	}
	if got := metricValue(t, "redislock_held", "", "") - before[watched[14]]; got != 0 {
		t.Errorf("held went from %v by %v, want back to where it was", before[watched[14]], got)
	}
}

// scrape returns what Prometheus would scrape from the default registry.
func scrape(t *testing.T) string {
	t.Helper()
	srv := httptest.NewServer(promhttp.HandlerFor(prom.DefaultGatherer, promhttp.HandlerOpts{}))
	defer srv.Close()
	resp, err := http.Get(srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return string(body)
}

// The series carry each lock's kind and prefix, as a scrape of the
// default registry shows them: a hold of each kind under a prefix is
// counted, held, and its end observed, in its own series.
func TestMetricsScrapeKindAndPrefix(t *testing.T) {
	prometheus.Enable()
	_, c := newMini(t)
	prefix := fmt.Sprintf("scrape%d:", time.Now().UnixNano()) // series of this run only
	l := NewLocker(FromGoRedis(c), WithPrefix(prefix))
	kinds := map[string][]Option{"lock": nil, "fair": {WithFairness()}, "permit": {WithPermits(3)}, "shared": {WithShared()}}
	var held []*RedisLock
	for kind, opts := range kinds {
		rl := l.NewLock("k:"+kind, opts...)
		if err := rl.AcquireWait(context.Background()); err != nil {
			t.Fatal(err)
		}
		held = append(held, rl)
	}
	during := scrape(t)
	releaseAll(held...)
	after := scrape(t)
	for kind := range kinds {
		for _, line := range []string{
			fmt.Sprintf(`redislock_held{kind=%q,prefix=%q} 1`, kind, prefix),
			fmt.Sprintf(`redislock_acquisitions_total{kind=%q,prefix=%q,result="acquired"} 1`, kind, prefix),
			fmt.Sprintf(`redislock_wait_duration_seconds_count{kind=%q,outcome="acquired",prefix=%q} 1`, kind, prefix),
		} {
			if !strings.Contains(during, line+"\n") {
				t.Errorf("while held, no line %s", line)
			}
		}
		for _, line := range []string{
			fmt.Sprintf(`redislock_held{kind=%q,prefix=%q} 0`, kind, prefix),
			fmt.Sprintf(`redislock_hold_duration_seconds_count{end="released",kind=%q,prefix=%q} 1`, kind, prefix),
		} {
			if !strings.Contains(after, line+"\n") {
				t.Errorf("once released, no line %s", line)
			}
		}
	}
	if strings.Contains(after, `k:lock`) {
		t.Error("a key in a label")
	}
	must(t, l.Close())
}
