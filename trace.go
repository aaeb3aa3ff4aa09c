package redislock

import (
	"context"
	"reflect"
	"time"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"
)

// tracerName names the instrumentation scope of the spans.
const tracerName = "github.com/redislock/redislock"

// WithTracerProvider sets the OpenTelemetry TracerProvider of a lock's
// spans, or of a Locker's locks'. Without it, the global one (which
// go-zero's trace sets). A wait (AcquireWait, and Do's) is a span, a child
// of its context's: redislock.wait, with the key, the kind, the outcome
// (acquired, gave_up, error), the time waited, the attempts and the
// wake-ups. A hold under Do is another, redislock.hold, from its
// acquisition to its release, with its owner and token, how it ended, and
// a loss or a maximum hold as its error; fn's context carries it. A nil tp
// leaves the default.
func WithTracerProvider(tp trace.TracerProvider) Option {
	return func(o *options) {
		if tp != nil {
			o.tracer = tp.Tracer(tracerName)
		}
	}
}

// tracer returns the tracer of rl's spans: WithTracerProvider's, or the
// global provider's as it is now (a tracer kept from an earlier one would
// follow only the first provider set); nil while no global provider is
// set, so that nothing is paid for spans nobody records.
func (rl *RedisLock) tracer() trace.Tracer {
	if rl.opts.tracer != nil {
		return rl.opts.tracer
	}
	tp := otel.GetTracerProvider()
	if t := reflect.TypeOf(tp); t.Kind() == reflect.Pointer && t.Elem().Name() == "tracerProvider" &&
		t.Elem().PkgPath() == "go.opentelemetry.io/otel/internal/global" {
		return nil // otel's default, until a provider is set: its spans record nothing
	}
	return tp.Tracer(tracerName)
}

// waitSpan is the span of a wait, and what it counts; nil when nothing
// records it.
type waitSpan struct {
	span              trace.Span
	attempts, wakeups int
}

// startWait starts the span of a wait of rl in ctx, and returns the
// context its calls run in (ctx when nothing records the span).
func (rl *RedisLock) startWait(ctx context.Context) (context.Context, *waitSpan) {
	tr := rl.tracer()
	if tr == nil {
		return ctx, nil
	}
	sctx, span := tr.Start(ctx, "redislock.wait")
	if !span.IsRecording() { // no attributes made: nothing to pay without a provider
		return ctx, nil
	}
	span.SetAttributes(attribute.String("redislock.key", rl.key), attribute.String("redislock.kind", rl.kind()))
	return sctx, &waitSpan{span: span}
}

// attempted counts an attempt; woken a wake-up.
func (w *waitSpan) attempted() {
	if w != nil {
		w.attempts++
	}
}

func (w *waitSpan) woken() {
	if w != nil {
		w.wakeups++
	}
}

// end ends the span of a wait that began at start and ended with err.
func (w *waitSpan) end(start time.Time, err error) {
	if w == nil {
		return
	}
	outcome := waitOutcome(err)
	w.span.SetAttributes(attribute.String("redislock.outcome", outcome), attribute.Float64("redislock.waited", time.Since(start).Seconds()),
		attribute.Int("redislock.attempts", w.attempts), attribute.Int("redislock.wakeups", w.wakeups))
	if outcome == "error" {
		w.span.RecordError(err)
		w.span.SetStatus(codes.Error, bare(err))
	}
	w.span.End()
}

// startHold starts the span of hold h under Do, a child of ctx's, and
// returns ctx with it (ctx, and a nil span, when nothing records it).
func (rl *RedisLock) startHold(ctx context.Context, h *hold) (context.Context, trace.Span) {
	tr := rl.tracer()
	if tr == nil {
		return ctx, nil
	}
	sctx, span := tr.Start(ctx, "redislock.hold")
	if !span.IsRecording() {
		return ctx, nil
	}
	span.SetAttributes(attribute.String("redislock.key", rl.key), attribute.String("redislock.kind", rl.kind()),
		attribute.String("redislock.owner", h.id))
	if h.token != 0 {
		span.SetAttributes(attribute.Int64("redislock.token", h.token))
	}
	return sctx, span
}

// endHold ends span (nil: none), of hold h: how the hold ended, and a
// loss or a maximum hold, which cut fn short, as its error.
func (rl *RedisLock) endHold(span trace.Span, h *hold) {
	if span == nil {
		return
	}
	rl.mu.Lock()
	cause := h.err
	rl.mu.Unlock()
	end := endOf(cause)
	span.SetAttributes(attribute.String("redislock.end", end))
	if end == "lost" || end == "max_hold" {
		span.RecordError(cause)
		span.SetStatus(codes.Error, bare(cause))
	}
	span.End()
}
