package wake

import (
	"context"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"
	"go.uber.org/goleak"

	"github.com/redislock/redislock/internal/clock"
)

// These tests need no lock: waiters are channels, releases are PUBLISHes
// made by hand on miniredis, or Publish without pub/sub.

func TestLineWithoutPubSub(t *testing.T) {
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	s := NewSet(clock.Real{}, nil)
	ctx := context.Background()
	a := s.Join(ctx, "lock a", nil, "ch", "")
	b := s.Join(ctx, "lock b", nil, "ch", "")
	if head, n := a.Read(); !head || !n.Attempt {
		t.Fatalf("the first in line: head %v, %+v", head, n)
	}
	if head, _ := b.Read(); head {
		t.Fatal("the second in line is the head")
	}
	if q, _ := s.Waiting("lock a", nil, "ch"); !q || s.Queued("ch") != 2 || s.Waiters() != 2 {
		t.Fatalf("queued %v, %d in line, %d waiters", q, s.Queued("ch"), s.Waiters())
	}
	s.Publish("ch", "", false) // a release by a lock of the Locker
	select {
	case <-a.C():
	case <-time.After(10 * time.Second):
		t.Fatal("the head was not woken")
	}
	if _, n := a.Read(); !n.Attempt {
		t.Fatal("the head was woken without news")
	}
	a.Leave(time.Second) // it took the lock: the next waits for its release
	if head, n := b.Read(); !head || n.Attempt || n.Holder != time.Second {
		t.Fatalf("the new head: head %v, %+v", head, n)
	}
	b.Leave(0)
	s.Close()
	s.Wait()
	if s.Hubs() != 0 || s.Join(ctx, "lock c", nil, "ch", "") != nil {
		t.Fatal("a hub open, or a join, after Close")
	}
}

func TestReleasesAndHandoffsThroughPubSub(t *testing.T) {
	before := goleak.IgnoreCurrent()
	mr := miniredis.RunT(t)
	c := redis.NewClient(&redis.Options{Addr: mr.Addr()})
	s := NewSet(clock.Real{}, nil)
	ctx := context.Background()
	plain := s.Join(ctx, "lock", c, "ch", "")
	if !plain.Subscribed() {
		t.Fatal("joined before the subscription was confirmed")
	}
	fair := s.Join(ctx, "fair lock", c, "ch", "w1")
	_, _ = plain.Read()
	_, _ = fair.Read()
	mr.Publish("ch", "w1 7 0 5000") // a handoff to w1
	waitNews := func(w *Waiter) News {
		select {
		case <-w.C():
		case <-time.After(10 * time.Second):
			t.Fatal("no news within 10s")
		}
		_, n := w.Read()
		return n
	}
	if n := waitNews(fair); n.Handoff == nil || n.Handoff.Seq != 7 || n.Handoff.Lease != 5*time.Second {
		t.Fatalf("the fair waiter's news: %+v", n)
	}
	mr.Publish("ch", "") // a release that handed nothing on
	if n := waitNews(plain); !n.Attempt {
		t.Fatalf("the head's news: %+v", n)
	}
	fair.Leave(0)
	plain.Leave(0)
	s.Close() // the lingering channel closes now, and the hub with it
	s.Wait()
	if s.Hubs() != 0 {
		t.Fatalf("%d hubs after Close", s.Hubs())
	}
	c.Close()
	mr.Close()
	goleak.VerifyNone(t, before) // the hub's reader included
}
