package redislock

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/zeromicro/go-zero/core/logx"

	"github.com/redislock/redislock/internal/redisserver"
)

// logBook is a real slog JSON handler's output, read back as records.
type logBook struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *logBook) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

// newLogBook returns a book and a logger of every level that writes to it.
func newLogBook() (*logBook, *slog.Logger) {
	b := &logBook{}
	return b, slog.New(slog.NewJSONHandler(b, &slog.HandlerOptions{Level: slog.LevelDebug}))
}

// records returns the records written so far.
func (b *logBook) records(t *testing.T) []map[string]any {
	t.Helper()
	b.mu.Lock()
	defer b.mu.Unlock()
	var recs []map[string]any
	for _, line := range strings.Split(strings.TrimSpace(b.buf.String()), "\n") {
		if line == "" {
			continue
		}
		var r map[string]any
		if err := json.Unmarshal([]byte(line), &r); err != nil {
			t.Fatalf("a line that is no JSON record: %q", line)
		}
		recs = append(recs, r)
	}
	return recs
}

// with returns the records whose msg is msg.
func (b *logBook) with(t *testing.T, msg string) []map[string]any {
	var recs []map[string]any
	for _, r := range b.records(t) {
		if r["msg"] == msg {
			recs = append(recs, r)
		}
	}
	return recs
}

// await returns the records whose msg is msg once there are n of them
// (a line is written after Done closes), or after two seconds.
func (b *logBook) await(t *testing.T, msg string, n int) []map[string]any {
	t.Helper()
	for deadline := time.Now().Add(2 * time.Second); ; time.Sleep(5 * time.Millisecond) {
		if recs := b.with(t, msg); len(recs) >= n || time.Now().After(deadline) {
			return recs
		}
	}
}

// above returns the records above Debug.
func (b *logBook) above(t *testing.T) []map[string]any {
	var recs []map[string]any
	for _, r := range b.records(t) {
		if r["level"] != "DEBUG" {
			recs = append(recs, r)
		}
	}
	return recs
}

// expectRecord checks that r has level and the attributes want (a string
// value of "*" only says the attribute is there).
func expectRecord(t *testing.T, what string, r map[string]any, level string, want map[string]any) {
	t.Helper()
	if r["level"] != level {
		t.Errorf("%s: level %v, want %s (%v)", what, r["level"], level, r)
	}
	for k, v := range want {
		got, ok := r[k]
		switch {
		case !ok:
			t.Errorf("%s: no %q attribute in %v", what, k, r)
		case v == "*":
		case fmt.Sprint(got) != fmt.Sprint(v):
			t.Errorf("%s: %s = %v, want %v", what, k, got, v)
		}
	}
}

// Each event the library logs, through WithLogger on a real server: a
// lost hold is one warning with its key, kind, owner, token and cause; a
// failed renewal a warning for the first of a run, debug for the others;
// a wake-up Redis refused one error per Locker and key; the end of a
// holding context debug.
func TestLogRecordsOfEachEvent(t *testing.T) {
	ctx := context.Background()
	srv := redisserver.Start(t)
	admin := srv.Client(t)

	t.Run("lost", func(t *testing.T) {
		book, log := newLogBook()
		rl := NewRedisLock(FromGoRedis(srv.Client(t)), "log:lost", WithExpiry(300*time.Millisecond), WithFencing(), WithLogger(log))
		mustAcquire(t, rl)
		owner, token := holderID(rl), rl.Token()
		must(t, admin.Del(ctx, "log:lost").Err())
		waitDone(t, rl.Done(), "the key deleted")
		recs := book.await(t, "redislock: hold lost", 1)
		if len(recs) != 1 {
			t.Fatalf("%d records of the loss, want 1: %v", len(recs), book.records(t))
		}
		expectRecord(t, "the loss", recs[0], "WARN", map[string]any{"key": "log:lost", "kind": "lock", "owner": owner,
			"token": float64(token), "cause": "*"})
		if c, _ := recs[0]["cause"].(string); !strings.Contains(c, "renewal found the key gone or taken") {
			t.Errorf("the loss's cause: %q", c)
		}
		if ok, err := rl.Release(); ok || !errors.Is(err, ErrLockLost) {
			t.Errorf("Release after the loss = %v, %v", ok, err)
		}
		if n := len(book.with(t, "redislock: hold lost")); n != 1 {
			t.Errorf("the loss logged %d times once Release reported it too", n)
		}
	})

	t.Run("renewal", func(t *testing.T) {
		book, log := newLogBook()
		s := newSpy(FromGoRedis(srv.Client(t)))
		failing := errors.New("the network is down")
		rl := NewRedisLock(s, "log:renewal", WithExpiry(300*time.Millisecond), WithShared(), WithLogger(log))
		mustAcquire(t, rl)
		s.setFail(func(script *redis.Script) error {
			if script == extendHolders { // a share's renewals
				return failing
			}
			return nil
		})
		waitDone(t, rl.Done(), "renewals failing")
		recs := book.with(t, "redislock: renewal failed; retrying")
		if len(recs) < 2 {
			t.Fatalf("%d records of failed renewals, want at least 2: %v", len(recs), book.records(t))
		}
		for i, r := range recs {
			level := "DEBUG"
			if i == 0 {
				level = "WARN"
			}
			expectRecord(t, fmt.Sprintf("failed renewal %d", i+1), r, level, map[string]any{"key": "log:renewal", "kind": "shared",
				"attempt": float64(i + 1), "retry_in": "*", "cause": failing.Error()})
		}
		if recs := book.await(t, "redislock: hold lost", 1); len(recs) != 1 || !strings.Contains(fmt.Sprint(recs[0]["cause"]), "lease ran out") {
			t.Errorf("the lease's end: %v", recs)
		}
	})

	t.Run("wake-up refused", func(t *testing.T) {
		book, log := newLogBook()
		c, _ := aclUser(t, srv, "logpub", "resetchannels")
		l := NewLocker(FromGoRedis(c), WithLogger(log))
		for range 3 {
			for _, key := range []string{"log:a", "log:b"} {
				rl := l.NewLock(key)
				mustAcquire(t, rl)
				mustRelease(t, rl)
			}
		}
		refused := "redislock: Redis refused to publish a release; waiters in other processes are not woken"
		recs := book.with(t, refused)
		if len(recs) != 2 {
			t.Fatalf("%d records of refused wake-ups of 2 keys, want 2: %v", len(recs), book.records(t))
		}
		for i, key := range []string{"log:a", "log:b"} {
			expectRecord(t, "the refused wake-up", recs[i], "ERROR", map[string]any{"key": key})
		}
		// A lock with a logger of its own gets its line there (found by a
		// black-box review: it went to the Locker's).
		own, ownLog := newLogBook()
		rl := l.NewLock("log:own", WithLogger(ownLog))
		mustAcquire(t, rl)
		mustRelease(t, rl)
		if recs := own.with(t, refused); len(recs) != 1 || len(book.with(t, refused)) != 2 {
			t.Errorf("the lock's own logger has %v; the Locker's %d records", recs, len(book.with(t, refused)))
		}
		must(t, l.Close())
	})

	t.Run("holding context", func(t *testing.T) {
		book, log := newLogBook()
		rl := NewRedisLock(FromGoRedis(srv.Client(t)), "log:ctx", WithExpiry(300*time.Millisecond), WithPermits(2), WithLogger(log))
		hctx, cancel := context.WithCancelCause(ctx)
		if ok, err := rl.AcquireCtx(hctx); !ok || err != nil {
			t.Fatalf("AcquireCtx = %v, %v", ok, err)
		}
		cancel(errors.New("request finished"))
		waitDone(t, rl.Done(), "the lease after the holding context")
		recs := book.await(t, "redislock: holding context ended; renewal stopped, the lease runs out", 1)
		book.await(t, "redislock: hold ended", 1)
		if len(recs) != 1 {
			t.Fatalf("%d records of the holding context's end: %v", len(recs), book.records(t))
		}
		expectRecord(t, "the holding context's end", recs[0], "DEBUG", map[string]any{"key": "log:ctx", "kind": "permit", "cause": "request finished"})
		if above := book.above(t); len(above) > 0 {
			t.Errorf("a lease run out after the application ended its holding context, logged above debug: %v", above)
		}
	})
}

// A clean shutdown logs nothing above debug, whichever the application
// closes first, its client or its Locker: with holds of every kind, and
// waiters subscribed to wake-ups, on a Locker with WithLogger and on a
// store's default Locker (which logs to slog.Default).
func TestCleanShutdownLogsNothingAboveDebug(t *testing.T) {
	srv := redisserver.Start(t)
	for _, clientFirst := range []bool{true, false} {
		for _, ownLocker := range []bool{true, false} {
			what := fmt.Sprintf("client closed first %v, WithLogger %v", clientFirst, ownLocker)
			book, log := newLogBook()
			c := srv.Client(t)
			var l *Locker
			if ownLocker {
				l = NewLocker(FromGoRedis(c), WithLogger(log), WithExpiry(time.Second))
			} else {
				before := slog.Default()
				slog.SetDefault(log)
				l = NewLocker(FromGoRedis(c), WithExpiry(time.Second))
				defer slog.SetDefault(before)
			}
			key := fmt.Sprintf("log:shutdown:%v:%v", clientFirst, ownLocker)
			var held []*RedisLock
			for i, opts := range [][]Option{nil, {WithFencing()}, {WithFairness()}, {WithPermits(2)}, {WithShared()}} {
				rl := l.NewLock(fmt.Sprintf("%s:%d", key, i), opts...)
				mustAcquire(t, rl)
				held = append(held, rl)
			}
			// A waiter on each of two keys, subscribed, then gone: their
			// channels linger subscribed.
			for i := range 2 {
				wctx, cancel := context.WithTimeout(context.Background(), 150*time.Millisecond)
				if err := l.NewLock(fmt.Sprintf("%s:%d", key, i)).AcquireWait(wctx); !errors.Is(err, ErrNotAcquired) {
					t.Errorf("%s: a wait for a held key = %v", what, err)
				}
				cancel()
			}
			if clientFirst {
				_ = c.Close()
				// Renewals fail meanwhile, and the leases run out (a
				// black-box review saw a Warn for each hold here).
				waitDone(t, held[0].Done(), "the lease after the client's Close")
				time.Sleep(100 * time.Millisecond)
				_ = l.Close() // releases that cannot be sent: its error, not a log line above debug
			} else {
				must(t, l.Close())
				_ = c.Close()
			}
			time.Sleep(200 * time.Millisecond) // a linger's unsubscribe, would it log
			for _, rl := range held {
				if !isClosed(rl.Done()) {
					t.Errorf("%s: a hold of %s outlived Close", what, rl.Key())
				}
			}
			if above := book.above(t); len(above) > 0 {
				t.Errorf("%s: logged above debug: %v", what, above)
			}
			if len(book.records(t)) == 0 {
				t.Errorf("%s: nothing logged at all: the ends of the holds are debug records", what)
			}
		}
	}
}

// A lock of a store's default Locker, whose client the application
// closes while it holds: the lease runs out as renewals fail, at Debug.
func TestClosedClientLogsItsHoldsEndAtDebug(t *testing.T) {
	srv := redisserver.Start(t)
	book, log := newLogBook()
	c := srv.Client(t)
	rl := NewRedisLock(FromGoRedis(c), "log:closed-client", WithExpiry(300*time.Millisecond), WithFencing(), WithLogger(log))
	mustAcquire(t, rl)
	_ = c.Close()
	waitDone(t, rl.Done(), "the lease after the client's Close")
	recs := book.await(t, "redislock: hold lost", 1)
	if len(recs) != 1 {
		t.Fatalf("%d records of the hold's end: %v", len(recs), book.records(t))
	}
	expectRecord(t, "the hold's end", recs[0], "DEBUG", map[string]any{"key": "log:closed-client", "cause": "*"})
	if above := book.above(t); len(above) > 0 {
		t.Errorf("logged above debug: %v", above)
	}
}

// go-zero's store logs through logx by default, a warning as an error
// with the attributes as fields; a go-redis client through slog.Default.
func TestDefaultLoggerOfEachStore(t *testing.T) {
	ctx := context.Background()
	srv := redisserver.Start(t)
	admin := srv.Client(t)
	logxOut := &logBook{}
	logx.SetLevel(logx.DebugLevel)
	logx.SetWriter(logx.NewWriter(logxOut))
	t.Cleanup(func() {
		if !testing.Verbose() {
			logx.Disable()
		}
	})
	book, log := newLogBook()
	before := slog.Default()
	slog.SetDefault(log)
	t.Cleanup(func() { slog.SetDefault(before) })

	for key, st := range map[string]Scripter{"log:default:go-zero": goZeroStore(t, srv.Addr), "log:default:go-redis": FromGoRedis(srv.Client(t))} {
		rl := NewRedisLock(st, key, WithExpiry(300*time.Millisecond))
		mustAcquire(t, rl)
		must(t, admin.Del(ctx, key).Err())
		waitDone(t, rl.Done(), "the key deleted")
	}
	recs := book.await(t, "redislock: hold lost", 1)
	var out string
	for deadline := time.Now().Add(2 * time.Second); !strings.Contains(out, "log:default:go-zero") && time.Now().Before(deadline); time.Sleep(5 * time.Millisecond) {
		logxOut.mu.Lock()
		out = logxOut.buf.String()
		logxOut.mu.Unlock()
	}
	var line map[string]any
	for _, l := range strings.Split(out, "\n") {
		if strings.Contains(l, "log:default:go-zero") {
			if err := json.Unmarshal([]byte(l), &line); err != nil {
				t.Fatalf("logx's line: %q: %v", l, err)
			}
		}
	}
	if line == nil {
		t.Fatalf("go-zero's store's loss not in logx's output: %q", out)
	}
	expectRecord(t, "logx's line", line, "error", map[string]any{"content": "redislock: hold lost", "key": "log:default:go-zero",
		"kind": "lock", "owner": "*", "cause": "*"})
	if c, _ := line["caller"].(string); !strings.HasSuffix(strings.Split(c, ":")[0], "hold.go") {
		t.Errorf("logx's caller = %q, want the line in hold.go that logged", c)
	}
	if len(recs) != 1 || recs[0]["key"] != "log:default:go-redis" {
		t.Errorf("the go-redis client's loss in slog.Default: %v", recs)
	}
	if strings.Contains(out, "log:default:go-redis") {
		t.Errorf("the go-redis client's loss went to logx: %q", out)
	}
}
