package renew

import (
	"context"
	"errors"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/redislock/redislock/internal/clock/clocktest"
	"github.com/redislock/redislock/internal/store"
)

// These tests need no lock: a store whose replies the test sets, a clock
// that moves when the test says, and owners that are strings.

// replies is a Scripter that answers renewals with code (an error when
// err is set), and can hold them until released.
type replies struct {
	mu    sync.Mutex
	code  int64
	err   error
	calls int
	hold  chan struct{} // when set, renewals wait for it to close
}

func (r *replies) ScriptRunCtx(ctx context.Context, _ *redis.Script, keys []string, _ ...any) (any, error) {
	r.mu.Lock()
	r.calls++
	code, err, hold := r.code, r.err, r.hold
	r.mu.Unlock()
	if hold != nil {
		<-hold
	}
	if err != nil {
		return nil, err
	}
	out := make([]any, len(keys))
	for i := range out {
		out[i] = code
	}
	return out, nil
}

func (r *replies) set(code int64, err error) {
	r.mu.Lock()
	r.code, r.err = code, err
	r.mu.Unlock()
}

func (r *replies) count() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.calls
}

type report struct {
	owner string
	end   End
	err   error
}

type fixture struct {
	clk     *clocktest.Clock
	replies *replies
	s       *Scheduler[string]
	reports chan report
	retries *retries
}

// retries are the Retry reports of a fixture, in order.
type retries struct {
	sync.Mutex
	of map[string][]Retry
}

func (r *retries) add(owner string, x Retry) {
	r.Lock()
	defer r.Unlock()
	r.of[owner] = append(r.of[owner], x)
}

func (r *retries) get(owner string) []Retry {
	r.Lock()
	defer r.Unlock()
	return r.of[owner]
}

func newFixture() fixture {
	f := fixture{clk: clocktest.New(), replies: &replies{code: 1}, reports: make(chan report, 10), retries: &retries{of: map[string][]Retry{}}}
	f.s = New(f.clk, store.New(f.replies), func(o string, e End, err error) { f.reports <- report{o, e, err} }, func(int, int, int) {}, f.retries.add)
	return f
}

func (f fixture) add(owner string, maxHold time.Duration, renews bool) *Lease[string] {
	const lease = 3 * time.Second
	return f.s.Add(owner, context.Background(), store.Extend, []string{owner}, "id-"+owner, lease, f.clk.Now().Add(lease-Margin(lease)), maxHold, renews)
}

// next steps the clock from duty to duty until a report comes.
func (f fixture) next(t *testing.T) report {
	t.Helper()
	for range 100 {
		select {
		case r := <-f.reports:
			return r
		default:
		}
		came := make(chan struct{})
		go func() {
			for len(f.reports) == 0 {
				time.Sleep(time.Millisecond)
			}
			close(came)
		}()
		f.clk.StepOr(t, came)
	}
	t.Fatal("no report after 100 steps")
	return report{}
}

func TestRenewsAndKeepsTheLease(t *testing.T) {
	f := newFixture()
	l := f.add("a", 0, true)
	for i := range 5 {
		before := f.s.Until(l)
		f.clk.Step(t)
		if f.replies.count() != i+1 || !f.s.Until(l).After(before) {
			t.Fatalf("renewal %d: %d calls, until %v after %v", i+1, f.replies.count(), f.s.Until(l), before)
		}
	}
	f.s.Remove(l)
	if !f.s.Idle() || len(f.reports) != 0 {
		t.Fatalf("after Remove: idle %v, %d reports", f.s.Idle(), len(f.reports))
	}
}

func TestReportsEachEnd(t *testing.T) {
	f := newFixture()
	f.add("held", time.Second, true) // a maximum hold at the first renewal
	if r := f.next(t); r.owner != "held" || r.end != MaxHold {
		t.Fatalf("report %+v; want MaxHold", r)
	}

	f.replies.set(0, nil) // the key is gone
	f.add("gone", 0, true)
	if r := f.next(t); r.owner != "gone" || r.end != Gone {
		t.Fatalf("report %+v; want Gone", r)
	}

	failure := errors.New("network down")
	f.replies.set(0, failure) // renewals fail until the lease runs out
	start := f.clk.Now()
	l := f.add("failing", 0, true)
	r := f.next(t)
	if r.owner != "failing" || r.end != RanOut || !errors.Is(r.err, failure) {
		t.Fatalf("report %+v; want RanOut with the failure", r)
	}
	if f.clk.Now().Before(start.Add(3*time.Second - Margin(3*time.Second))) {
		t.Fatal("ran out before its deadline")
	}
	if n := f.replies.count(); n < 5 {
		t.Fatalf("%d renewals tried; want the retries", n)
	}
	retried := f.retries.get("failing")
	if len(retried) < 4 {
		t.Fatalf("%d failed renewals reported to retry; want the retries", len(retried))
	}
	for i, r := range retried {
		if r.Attempt != i+1 || r.In <= 0 || !errors.Is(r.Err, failure) {
			t.Fatalf("retry %d reported as %+v", i+1, r)
		}
	}
	if len(f.retries.get("held")) != 0 || len(f.retries.get("gone")) != 0 {
		t.Fatal("retries reported of renewals that did not fail")
	}
	if f.s.Extended(l, f.clk.Now()) {
		t.Fatal("a lease whose end was reported was extended")
	}

	calls := f.replies.count()
	f.add("stopped", 0, false) // kept to its deadline only
	if r := f.next(t); r.owner != "stopped" || r.end != RanOut || r.err != nil || f.replies.count() != calls {
		t.Fatalf("report %+v after %d renewals; want RanOut, none", r, f.replies.count()-calls)
	}
}

func TestLateRenewalIsReported(t *testing.T) {
	f := newFixture()
	f.replies.hold = make(chan struct{})
	l := f.add("a", 0, true)
	stepped := make(chan struct{})
	go func() { defer close(stepped); f.clk.Step(t) }()
	for !f.s.InFlight(l) {
		time.Sleep(time.Millisecond)
	}
	f.s.Remove(l) // its owner ended it meanwhile
	close(f.replies.hold)
	if r := f.next(t); r.owner != "a" || r.end != Late {
		t.Fatalf("report %+v; want Late", r)
	}
	<-stepped
}

func TestCloseReturnsTheOwnersAndStops(t *testing.T) {
	f := newFixture()
	f.add("a", 0, true)
	f.add("b", 0, true)
	owners := f.s.Close()
	if len(owners) != 2 {
		t.Fatalf("Close returned %v", owners)
	}
	if f.add("c", 0, true) != nil {
		t.Fatal("Add after Close")
	}
	f.clk.Advance(time.Hour)
	f.s.Wait()
	if f.replies.count() != 0 || len(f.reports) != 0 {
		t.Fatalf("after Close: %d renewals, %d reports", f.replies.count(), len(f.reports))
	}
}

// refusal is an error reply of Redis.
type refusal string

func (r refusal) Error() string { return string(r) }
func (refusal) RedisError()     {}

// denying refuses, as an ACL without one key does, every call that
// carries the key "denied", whole; it renews every other key.
type denying struct {
	mu    sync.Mutex
	sizes []int // the keys of each call
}

func (d *denying) ScriptRunCtx(_ context.Context, _ *redis.Script, keys []string, _ ...any) (any, error) {
	d.mu.Lock()
	d.sizes = append(d.sizes, len(keys))
	d.mu.Unlock()
	out := make([]any, len(keys))
	for i, k := range keys {
		if k == "denied" {
			return nil, refusal("NOPERM this user has no permissions to access one of the keys used as arguments")
		}
		out[i] = int64(1)
	}
	return out, nil
}

// Found by the black-box review of issue 26: a batch refused whole for one
// of its keys failed the renewals of all the others, whose leases then ran
// out with an error naming that key. The refused batch's leases are
// renewed each on its own: only the denied one fails.
func TestBatchRefusedWholeIsRenewedLeaseByLease(t *testing.T) {
	d := &denying{}
	clk := clocktest.New()
	reports := make(chan report, 10)
	st := store.New(d)
	st.Single = true // one primary: leases are batched
	s := New(clk, st, func(o string, e End, err error) { reports <- report{o, e, err} }, func(int, int, int) {}, func(string, Retry) {})
	const lease = 3 * time.Second
	var leases []*Lease[string]
	for _, k := range []string{"a", "denied", "b"} {
		leases = append(leases, s.Add(k, context.Background(), store.Extend, []string{k}, "id-"+k, lease, clk.Now().Add(lease-Margin(lease)), 0, true))
	}
	before := s.Until(leases[0])
	clk.Step(t)
	waitFor := time.Now().Add(5 * time.Second)
	for s.InFlight(leases[0]) || s.InFlight(leases[2]) {
		if time.Now().After(waitFor) {
			t.Fatal("the renewals never came back")
		}
		time.Sleep(time.Millisecond)
	}
	if !s.Until(leases[0]).After(before) || !s.Until(leases[2]).After(before) {
		t.Errorf("a and b not renewed: until %v, %v (was %v)", s.Until(leases[0]), s.Until(leases[2]), before)
	}
	if s.Until(leases[1]).After(before) {
		t.Error("the denied lease was renewed")
	}
	d.mu.Lock()
	sizes := slices.Clone(d.sizes)
	d.mu.Unlock()
	if !slices.Equal(sizes, []int{3, 1, 1, 1}) {
		t.Errorf("calls of %v keys; want the batch of 3, then each alone", sizes)
	}
	if len(reports) != 0 {
		t.Errorf("%d reports: no lease ends yet", len(reports))
	}
	s.Close()
	s.Wait()
}
