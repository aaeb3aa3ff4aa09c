package redislock

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"

	"github.com/zeromicro/go-zero/core/prometheus"

	"github.com/redislock/redislock/internal/redisserver"
)

// spanNamed returns the ended spans named name.
func spanNamed(exp *tracetest.InMemoryExporter, name string) []tracetest.SpanStub {
	var spans []tracetest.SpanStub
	for _, s := range exp.GetSpans() {
		if s.Name == name {
			spans = append(spans, s)
		}
	}
	return spans
}

// attrOf returns the value of key among attrs, and whether it is there.
func attrOf(attrs []attribute.KeyValue, key string) (attribute.Value, bool) {
	for _, a := range attrs {
		if string(a.Key) == key {
			return a.Value, true
		}
	}
	return attribute.Value{}, false
}

// The spans of waits and of holds under Do, with the SDK's in-memory
// exporter, on a real server: a wait is a child of the caller's span,
// with its key, kind, outcome, time, attempts and wake-ups; a hold under
// Do another child, from acquisition to release, whose context fn gets,
// with a loss as its error; a wait that gives up is no error.
func TestTraceSpansOfWaitsAndHolds(t *testing.T) {
	ctx := context.Background()
	srv := redisserver.Start(t)
	c, admin := srv.Client(t), srv.Client(t)
	exp := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp))
	t.Cleanup(func() { _ = tp.Shutdown(ctx) })
	l := NewLocker(FromGoRedis(c), WithTracerProvider(tp), WithExpiry(time.Second))

	t.Run("a wait, then a hold", func(t *testing.T) {
		exp.Reset()
		other := l.NewLock("trace:a")
		mustAcquire(t, other)
		rctx, request := tp.Tracer("test").Start(ctx, "request")
		released := make(chan struct{})
		go func() { // once the waiter listens for releases: its wake-up is then certain
			defer close(released)
			for admin.PubSubNumSub(ctx, relatedName("trace:a", "released")).Val()[relatedName("trace:a", "released")] == 0 {
				time.Sleep(5 * time.Millisecond)
			}
			time.Sleep(50 * time.Millisecond)
			_, _ = other.Release()
		}()
		defer func() { <-released }()
		var fnSpan trace.SpanContext
		err := l.NewLock("trace:a", WithFencing()).Do(rctx, func(ctx context.Context) error {
			_, work := tp.Tracer("test").Start(ctx, "work")
			fnSpan = work.SpanContext()
			work.End()
			return nil
		})
		request.End()
		if err != nil {
			t.Fatal(err)
		}
		waits, holds := spanNamed(exp, "redislock.wait"), spanNamed(exp, "redislock.hold")
		if len(waits) != 1 || len(holds) != 1 {
			t.Fatalf("%d wait spans and %d hold spans, want 1 and 1", len(waits), len(holds))
		}
		w, h := waits[0], holds[0]
		for _, s := range []tracetest.SpanStub{w, h} {
			if s.Parent.SpanID() != request.SpanContext().SpanID() {
				t.Errorf("%s: parent %v, want the request's span", s.Name, s.Parent.SpanID())
			}
			if v, _ := attrOf(s.Attributes, "redislock.key"); v.AsString() != "trace:a" {
				t.Errorf("%s: key %q", s.Name, v.AsString())
			}
			if v, _ := attrOf(s.Attributes, "redislock.kind"); v.AsString() != "lock" {
				t.Errorf("%s: kind %q", s.Name, v.AsString())
			}
		}
		if v, _ := attrOf(w.Attributes, "redislock.outcome"); v.AsString() != "acquired" {
			t.Errorf("wait outcome %q", v.AsString())
		}
		if v, _ := attrOf(w.Attributes, "redislock.attempts"); v.AsInt64() < 2 {
			t.Errorf("wait attempts %d, want the first and the one after the release", v.AsInt64())
		}
		if v, _ := attrOf(w.Attributes, "redislock.wakeups"); v.AsInt64() < 1 {
			t.Errorf("wait wake-ups %d, want the release's", v.AsInt64())
		}
		if v, _ := attrOf(w.Attributes, "redislock.waited"); v.AsFloat64() < 0.05 || v.AsFloat64() > w.EndTime.Sub(w.StartTime).Seconds() {
			t.Errorf("waited %v s, in a span of %v", v.AsFloat64(), w.EndTime.Sub(w.StartTime))
		}
		if v, ok := attrOf(h.Attributes, "redislock.token"); !ok || v.AsInt64() <= 0 {
			t.Errorf("hold token %v", v.AsInt64())
		}
		if v, _ := attrOf(h.Attributes, "redislock.owner"); v.AsString() == "" {
			t.Error("hold without its owner")
		}
		if v, _ := attrOf(h.Attributes, "redislock.end"); v.AsString() != "released" || h.Status.Code == codes.Error {
			t.Errorf("hold end %q, status %v", v.AsString(), h.Status)
		}
		if !h.StartTime.After(w.StartTime) || h.EndTime.Before(w.EndTime) {
			t.Error("the hold's span does not follow its wait's")
		}
		if works := spanNamed(exp, "work"); len(works) != 1 || works[0].Parent.SpanID() != h.SpanContext.SpanID() || works[0].SpanContext.SpanID() != fnSpan.SpanID() {
			t.Errorf("fn's span is not the hold's child: %v", works)
		}
	})

	t.Run("a loss", func(t *testing.T) {
		exp.Reset()
		err := l.NewLock("trace:lost", WithExpiry(300*time.Millisecond)).Do(ctx, func(ctx context.Context) error {
			must(t, admin.Del(ctx, "trace:lost").Err())
			<-ctx.Done()
			return nil
		})
		if !errors.Is(err, ErrLockLost) {
			t.Fatalf("Do = %v, want ErrLockLost", err)
		}
		holds := spanNamed(exp, "redislock.hold")
		if len(holds) != 1 {
			t.Fatalf("%d hold spans", len(holds))
		}
		h := holds[0]
		if v, _ := attrOf(h.Attributes, "redislock.end"); v.AsString() != "lost" || h.Status.Code != codes.Error || len(h.Events) == 0 || h.Events[0].Name != "exception" {
			t.Errorf("a lost hold's span: end %q, status %v, events %v", v.AsString(), h.Status, h.Events)
		}
	})

	t.Run("the Locker closed", func(t *testing.T) {
		exp.Reset()
		prometheus.Enable()
		closing := NewLocker(FromGoRedis(c), WithTracerProvider(tp), WithPrefix(fmt.Sprintf("closing%d:", time.Now().UnixNano())))
		before := metricValue(t, "redislock_hold_duration_seconds", "end", "closed")
		started := make(chan struct{})
		done := make(chan error, 1)
		go func() {
			done <- closing.NewLock("trace:closed", WithShared()).Do(ctx, func(ctx context.Context) error {
				close(started)
				<-ctx.Done()
				return nil
			})
		}()
		<-started
		must(t, closing.Close())
		if err := <-done; !errors.Is(err, ErrLockerClosed) {
			t.Fatalf("Do = %v, want ErrLockerClosed", err)
		}
		holds := spanNamed(exp, "redislock.hold")
		if len(holds) != 1 {
			t.Fatalf("%d hold spans", len(holds))
		}
		// A black-box review saw end "context" and an error status here.
		if v, _ := attrOf(holds[0].Attributes, "redislock.end"); v.AsString() != "closed" || holds[0].Status.Code == codes.Error {
			t.Errorf("a hold the Locker's Close ended: end %q, status %v", v.AsString(), holds[0].Status)
		}
		if got := metricValue(t, "redislock_hold_duration_seconds", "end", "closed") - before; got != 1 {
			t.Errorf("holds ended by Close went up by %v, want 1", got)
		}
	})

	t.Run("a wait given up", func(t *testing.T) {
		exp.Reset()
		other := l.NewLock("trace:busy", WithPermits(1))
		mustAcquire(t, other)
		defer mustRelease(t, other)
		if err := l.NewLock("trace:busy", WithPermits(1), WithWaitTimeout(100*time.Millisecond)).AcquireWait(ctx); !errors.Is(err, ErrNotAcquired) {
			t.Fatalf("AcquireWait = %v", err)
		}
		waits := spanNamed(exp, "redislock.wait")
		if len(waits) != 1 {
			t.Fatalf("%d wait spans", len(waits))
		}
		w := waits[0]
		if v, _ := attrOf(w.Attributes, "redislock.outcome"); v.AsString() != "gave_up" || w.Status.Code == codes.Error {
			t.Errorf("a wait given up: outcome %q, status %v", v.AsString(), w.Status)
		}
		if v, _ := attrOf(w.Attributes, "redislock.kind"); v.AsString() != "permit" {
			t.Errorf("kind %q", v.AsString())
		}
	})

	t.Run("the global provider", func(t *testing.T) {
		exp.Reset()
		otel.SetTracerProvider(tp)
		defer otel.SetTracerProvider(noop.NewTracerProvider())
		if err := NewRedisLock(FromGoRedis(c), "trace:global").Do(ctx, func(context.Context) error { return nil }); err != nil {
			t.Fatal(err)
		}
		if len(spanNamed(exp, "redislock.wait")) != 1 || len(spanNamed(exp, "redislock.hold")) != 1 {
			t.Errorf("the global provider's spans: %v", exp.GetSpans())
		}
	})
	must(t, l.Close())
}

// BenchmarkSpansWithoutProvider is what the spans of a Do cost when no
// TracerProvider is set (the global default): a wait's and a hold's
// starts and ends, beside a pair's round trips.
func BenchmarkSpansWithoutProvider(b *testing.B) {
	rl := NewRedisLock(replyStore{}, "bench:spans")
	h := &hold{id: "owner", rl: rl}
	ctx := context.Background()
	b.ReportAllocs()
	for b.Loop() {
		_, w := rl.startWait(ctx)
		w.attempted()
		w.end(time.Now(), nil)
		_, span := rl.startHold(ctx, h)
		rl.endHold(span, h)
	}
}
