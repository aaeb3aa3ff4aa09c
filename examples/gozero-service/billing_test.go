package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/zeromicro/go-zero/core/logx"
	"github.com/zeromicro/go-zero/core/proc"
	"go.opentelemetry.io/otel"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"

	"github.com/redislock/redislock"
	"github.com/redislock/redislock/examples/gozero-service/internal/config"
	"github.com/redislock/redislock/examples/gozero-service/internal/svc"
	"github.com/redislock/redislock/examples/gozero-service/internal/types"
	"github.com/redislock/redislock/internal/redisserver"
)

func TestMain(m *testing.M) {
	_ = logx.SetUp(logx.LogConf{Level: "severe"}) // the first SetUp wins: the servers' own are ignored
	logx.Disable()
	os.Exit(m.Run())
}

// service is the billing service running in-process on a real redis-server.
type service struct {
	url   string
	svc   *svc.ServiceContext
	rdb   *redis.Client
	redis string // its Redis address
}

// startService starts the service of the embedded config, changed by
// configure, on a free port and a new redis-server; setup runs before it
// serves. It stops when t ends.
func startService(t *testing.T, configure func(*config.Config), setup func(*svc.ServiceContext)) *service {
	t.Helper()
	srv := redisserver.Start(t)
	port, err := redisserver.FreePort()
	if err != nil {
		t.Fatal(err)
	}
	var c config.Config
	if err := loadConfig(defaultConfigFile, &c); err != nil {
		t.Fatal(err)
	}
	c.Host, c.Port = "127.0.0.1", port
	c.Redis.Host = srv.Addr
	c.Redis.DisableIdentity = true // redis-server may be older than 7.2
	c.CpuThreshold = 0             // no load shedding on a busy test machine
	c.Timeout = 15000              // a safety net, in ms
	if configure != nil {
		configure(&c)
	}

	server, sc := newServer(c)
	if setup != nil {
		setup(sc)
	}
	stopped := make(chan struct{})
	go func() {
		defer close(stopped)
		server.Start()
	}()
	t.Cleanup(func() {
		proc.Shutdown() // what SIGTERM does: shuts the HTTP server down, so that Start returns
		select {
		case <-stopped:
		case <-time.After(10 * time.Second):
			t.Error("the server did not stop")
		}
		server.Stop()
		if err := sc.Close(); err != nil {
			t.Errorf("closing the Locker: %v", err)
		}
	})

	addr := net.JoinHostPort(c.Host, strconv.Itoa(port))
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		conn, err := net.Dial("tcp", addr)
		if err == nil {
			conn.Close()
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the server does not listen on %s: %v", addr, err)
		}
	}
	rdb := redis.NewClient(&redis.Options{Addr: c.Redis.Host})
	t.Cleanup(func() { rdb.Close() })
	return &service{url: "http://" + addr, svc: sc, rdb: rdb, redis: c.Redis.Host}
}

// reply is one response of the service.
type reply struct {
	status int
	body   types.ChargeResp
	raw    string
}

// charge posts a charge of invoice id.
func (s *service) charge(client *http.Client, id string) (reply, error) {
	resp, err := client.Post(s.url+"/invoices/"+id+"/charge", "", nil)
	if err != nil {
		return reply{}, err
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	if err != nil {
		return reply{}, err
	}
	r := reply{status: resp.StatusCode, raw: string(raw)}
	if r.status == http.StatusOK {
		if err := json.Unmarshal(raw, &r.body); err != nil {
			return r, fmt.Errorf("%s: %w", raw, err)
		}
	}
	return r, nil
}

// burst charges each of invoices perInvoice times, from as many goroutines,
// all let go at once, and returns the replies by invoice.
func (s *service) burst(t *testing.T, invoices []string, perInvoice int) map[string][]reply {
	t.Helper()
	client := &http.Client{
		Timeout:   20 * time.Second, // a safety net
		Transport: &http.Transport{MaxIdleConnsPerHost: len(invoices) * perInvoice},
	}
	defer client.CloseIdleConnections()

	var (
		start   = make(chan struct{})
		wg      sync.WaitGroup
		mu      sync.Mutex
		replies = map[string][]reply{}
	)
	for range perInvoice {
		for _, id := range invoices {
			wg.Add(1)
			go func() {
				defer wg.Done()
				<-start
				r, err := s.charge(client, id)
				if err != nil {
					t.Errorf("invoice %s: %v", id, err)
					return
				}
				mu.Lock()
				replies[id] = append(replies[id], r)
				mu.Unlock()
			}()
		}
	}
	close(start)
	wg.Wait()
	return replies
}

func invoiceIDs(n int) []string {
	ids := make([]string, n)
	for i := range ids {
		ids[i] = strconv.Itoa(1000 + i)
	}
	return ids
}

// TestChargeOnce: concurrent charges of the same invoices charge each once.
func TestChargeOnce(t *testing.T) {
	s := startService(t, nil, nil)
	ids := invoiceIDs(8)
	replies := s.burst(t, ids, 16)

	for _, id := range ids {
		rs := replies[id]
		if len(rs) != 16 {
			t.Errorf("invoice %s: %d replies, want 16", id, len(rs))
		}
		charged := 0
		for _, r := range rs {
			switch {
			case r.status != http.StatusOK:
				t.Errorf("invoice %s: HTTP %d %s", id, r.status, r.raw)
			case r.body.Invoice != id:
				t.Errorf("invoice %s: reply for %q", id, r.body.Invoice)
			case r.body.Charged:
				charged++
			case r.body.Reason != "already paid":
				t.Errorf("invoice %s: not charged, reason %q", id, r.body.Reason)
			}
		}
		if charged != 1 {
			t.Errorf("invoice %s: %d replies say charged, want 1", id, charged)
		}
		if n := s.svc.Gateway.Attempts(id); n != 1 || !s.svc.Gateway.Charged(id) {
			t.Errorf("invoice %s: %d charges reached the gateway, want 1 (charged: %v)", id, n, s.svc.Gateway.Charged(id))
		}
		if n := s.rdb.Exists(context.Background(), "invoice:"+id+":paid").Val(); n != 1 {
			t.Errorf("invoice %s: no paid marker", id)
		}
		if n := s.rdb.Exists(context.Background(), "invoice:"+id).Val(); n != 0 {
			t.Errorf("invoice %s: the lock is still held", id)
		}
	}
}

// TestChargeWithoutLock is the control: the same burst without the lock
// sends duplicate charges of some invoice to the gateway (its idempotency
// key answers them as replays), so TestChargeOnce's count can fail.
func TestChargeWithoutLock(t *testing.T) {
	s := startService(t, nil, func(sc *svc.ServiceContext) {
		sc.Unlocked = true
		sc.Gateway.Delay = 300 * time.Millisecond // the window between reading the marker and writing it
	})
	ids := invoiceIDs(8)
	replies := s.burst(t, ids, 16)

	duplicated := 0
	for _, id := range ids {
		charged := 0
		for _, r := range replies[id] {
			if r.status != http.StatusOK {
				t.Errorf("invoice %s: HTTP %d %s", id, r.status, r.raw)
			}
			if r.body.Charged {
				charged++
			}
		}
		if charged != 1 {
			t.Errorf("invoice %s: %d replies say charged; the gateway's key allows 1", id, charged)
		}
		if s.svc.Gateway.Attempts(id) > 1 {
			duplicated++
		}
	}
	if duplicated == 0 {
		t.Error("without the lock, no invoice was charged twice at the gateway")
	}
	t.Logf("without the lock, %d of %d invoices reached the gateway more than once", duplicated, len(ids))
}

// TestBreakDuringCharge: an operator breaks the lock of a charge under way
// (black-box round 10: a concurrent request then charged the invoice
// again). The holder learns of the loss only when it releases, after its
// charge; the request woken by the break charges too, and the gateway's
// idempotency key answers it as a replay: one charge, one reply that says
// so, and every reply 200.
func TestBreakDuringCharge(t *testing.T) {
	s := startService(t, nil, func(sc *svc.ServiceContext) {
		sc.Gateway.Delay = 500 * time.Millisecond
	})
	ctx := context.Background()
	done := make(chan map[string][]reply, 1)
	go func() { done <- s.burst(t, []string{"77"}, 8) }()
	for deadline := time.Now().Add(10 * time.Second); s.rdb.Exists(ctx, "invoice:77").Val() == 0; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the lock was never taken")
		}
	}
	st, err := redislock.NewRedisLock(redislock.FromGoRedis(s.rdb), "invoice:77").Break(ctx, "")
	if err != nil || !st.Held {
		t.Fatalf("Break = %+v, %v", st, err)
	}
	replies := <-done
	charged := 0
	for _, r := range replies["77"] {
		if r.status != http.StatusOK {
			t.Errorf("HTTP %d %s", r.status, r.raw)
		}
		if r.body.Charged {
			charged++
		}
	}
	if charged != 1 || !s.svc.Gateway.Charged("77") {
		t.Errorf("%d replies say charged; want 1", charged)
	}
	t.Logf("%d charges reached the gateway", s.svc.Gateway.Attempts("77"))
}

// TestWaitTimesOutWith503: a request that waits for a lock held elsewhere
// until go-zero's request timeout gets 503.
func TestWaitTimesOutWith503(t *testing.T) {
	s := startService(t, func(c *config.Config) { c.Timeout = 300 }, nil)
	ctx := context.Background()
	s.rdb.Set(ctx, "invoice:9", "another-replica", time.Minute)
	client := &http.Client{Timeout: 20 * time.Second}
	if r, err := s.charge(client, "9"); err != nil || r.status != http.StatusServiceUnavailable {
		t.Fatalf("reply %+v, %v; want 503", r, err)
	}
}

// TestChargeUnderWayAtShutdownFinishes: a charge under way when the
// service shuts down finishes, 200 and charged: the Locker closes after
// the server stopped. (A Close in a shutdown listener, which go-zero runs
// while in-flight requests finish, cut 18 of 20 of them short with
// ErrLockerClosed: issue 25.)
func TestChargeUnderWayAtShutdownFinishes(t *testing.T) {
	s := startService(t, nil, func(sc *svc.ServiceContext) { sc.Gateway.Delay = 500 * time.Millisecond })
	ctx := context.Background()
	client := &http.Client{Timeout: 20 * time.Second}
	got := make(chan reply, 1)
	go func() {
		r, err := s.charge(client, "10")
		if err != nil {
			t.Error(err)
		}
		got <- r
	}()
	for deadline := time.Now().Add(10 * time.Second); s.rdb.Exists(ctx, "invoice:10").Val() == 0; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the charge never took its lock")
		}
	}
	proc.Shutdown() // what SIGTERM does
	if r := <-got; r.status != http.StatusOK || !s.svc.Gateway.Charged("10") {
		t.Fatalf("reply at shutdown %+v (charged: %v); want 200, charged", r, s.svc.Gateway.Charged("10"))
	}
}

// TestLockLostMidCharge: when the invoice's lock is lost during the charge,
// the gateway charges nothing, no paid marker is written, and the reply is
// 409.
func TestLockLostMidCharge(t *testing.T) {
	s := startService(t, func(c *config.Config) {
		c.LockExpiry = 600 * time.Millisecond // renewed, and so checked, every 200ms
	}, func(sc *svc.ServiceContext) {
		sc.Gateway.Delay = 10 * time.Second // cut short by the loss, or the reply is 200
	})
	ctx := context.Background()

	done := make(chan reply, 1)
	go func() {
		r, err := s.charge(&http.Client{Timeout: 20 * time.Second}, "7")
		if err != nil {
			t.Error(err)
		}
		done <- r
	}()
	for deadline := time.Now().Add(10 * time.Second); s.rdb.Exists(ctx, "invoice:7").Val() == 0; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the lock was never taken")
		}
	}
	if err := s.rdb.Del(ctx, "invoice:7").Err(); err != nil { // the lock is lost
		t.Fatal(err)
	}

	r := <-done
	if r.status != http.StatusConflict {
		t.Errorf("reply: HTTP %d %s, want 409", r.status, r.raw)
	}
	if n := s.svc.Gateway.Attempts("7"); n != 0 {
		t.Errorf("%d charges reached the gateway, want 0", n)
	}
	if n := s.rdb.Exists(ctx, "invoice:7:paid").Val(); n != 0 {
		t.Error("a paid marker was written")
	}
}

// TestDefaultConfig: the default config file loads, from this directory and
// (embedded) from elsewhere, with an empty Redis.Host, so that main starts
// a miniredis.
func TestDefaultConfig(t *testing.T) {
	check := func(where string) {
		var c config.Config
		if err := loadConfig(defaultConfigFile, &c); err != nil {
			t.Fatalf("%s: %v", where, err)
		}
		if c.Port != 8888 || c.Redis.Host != "" || c.Redis.Type != "node" || c.LockExpiry != 10*time.Second {
			t.Errorf("%s: Port %d, Redis.Host %q, Redis.Type %q, LockExpiry %v", where, c.Port, c.Redis.Host, c.Redis.Type, c.LockExpiry)
		}
	}
	check("in the service's directory")
	t.Chdir(t.TempDir())
	check("elsewhere")
	if err := loadConfig("etc/other.yaml", &config.Config{}); err == nil {
		t.Error("a missing config file other than the default: no error")
	}
}

// evalCalls is how many EVALs the server ran: go-zero's store runs the
// lock's scripts with EVAL.
func evalCalls(t *testing.T, rdb *redis.Client) int {
	t.Helper()
	info, err := rdb.Info(context.Background(), "commandstats").Result()
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(info, "\n") {
		if rest, ok := strings.CutPrefix(line, "cmdstat_eval:calls="); ok {
			n, _ := strconv.Atoi(rest[:strings.IndexByte(rest, ',')])
			return n
		}
	}
	return 0
}

// TestTwoReplicasLockLostMidCharge: two replicas on one Redis; the lock of
// a charge under way on the first is lost (deleted here; a pause past the
// lease does the same), and the second charges the same invoice meanwhile
// (black-box round 11: with a gateway record per process, both charged).
// The gateway's key, on the provider's side, lets one charge through.
func TestTwoReplicasLockLostMidCharge(t *testing.T) {
	slow := startService(t, func(c *config.Config) { c.LockExpiry = 30 * time.Second }, func(sc *svc.ServiceContext) {
		sc.Gateway.Delay = time.Second
	})
	fast := startService(t, func(c *config.Config) {
		c.LockExpiry = 30 * time.Second
		c.Redis.Host = slow.redis
	}, nil)
	ctx := context.Background()
	client := &http.Client{Timeout: 20 * time.Second}
	first := make(chan reply, 1)
	go func() {
		r, err := slow.charge(client, "5")
		if err != nil {
			t.Error(err)
		}
		first <- r
	}()
	for deadline := time.Now().Add(10 * time.Second); slow.rdb.Exists(ctx, "invoice:5").Val() == 0; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the lock was never taken")
		}
	}
	slow.rdb.Del(ctx, "invoice:5") // lost; the first replica learns at its release
	second, err := fast.charge(client, "5")
	if err != nil {
		t.Fatal(err)
	}
	replies := []reply{<-first, second}
	charged := 0
	for _, r := range replies {
		if r.status != http.StatusOK {
			t.Errorf("HTTP %d %s", r.status, r.raw)
		}
		if r.body.Charged {
			charged++
		}
	}
	if charged != 1 || slow.svc.Gateway.Attempts("5") != 2 {
		t.Errorf("%d replies say charged, %d charges reached the gateway; want 1 of 2: %+v", charged, slow.svc.Gateway.Attempts("5"), replies)
	}
}

// TestTracesShowTheLockWaitUnderTheRequest: with a TracerProvider set (as
// go-zero's Telemetry config sets one), a charge's trace shows the wait
// for the invoice's lock and the hold under the request's span.
func TestTracesShowTheLockWaitUnderTheRequest(t *testing.T) {
	exp := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp))
	t.Cleanup(func() { otel.SetTracerProvider(noop.NewTracerProvider()); _ = tp.Shutdown(context.Background()) })
	// go-zero's setup sets a provider of its own (exporting to the
	// Telemetry config's endpoint): this one, with an exporter a test can
	// read, takes its place before the server starts.
	s := startService(t, nil, func(*svc.ServiceContext) { otel.SetTracerProvider(tp) })
	s.rdb.Set(context.Background(), "invoice:7", "another-replica", time.Second) // held elsewhere: the charge waits
	if r, err := s.charge(&http.Client{Timeout: 20 * time.Second}, "7"); err != nil || r.status != http.StatusOK || !r.body.Charged {
		t.Fatalf("reply %+v, %v; want 200, charged", r, err)
	}
	var request, wait, hold *tracetest.SpanStub
	spans := exp.GetSpans()
	for i := range spans {
		switch s := &spans[i]; {
		case s.Name == "redislock.wait":
			wait = s
		case s.Name == "redislock.hold":
			hold = s
		case s.SpanKind == trace.SpanKindServer:
			request = s
		}
	}
	if request == nil || wait == nil || hold == nil {
		t.Fatalf("the request's, the wait's and the hold's spans: %v, %v, %v", request, wait, hold)
	}
	for _, s := range []*tracetest.SpanStub{wait, hold} {
		if s.Parent.SpanID() != request.SpanContext.SpanID() {
			t.Errorf("%s is not a child of the request's span %q", s.Name, request.Name)
		}
	}
	if d := wait.EndTime.Sub(wait.StartTime); d < 100*time.Millisecond {
		t.Errorf("the wait's span lasted %v; the lock was held for a second", d)
	}
}
