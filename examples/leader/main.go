// Command leader is a service run as several replicas, where the leader
// runs a periodic job and every replica serves requests saying who leads.
// The replicas elect the leader with a redislock.Election on go-zero's
// Redis store; when the leader dies, the next replica in line takes the job
// over once the dead one's lease runs out, and when it shuts down (SIGINT,
// SIGTERM) it resigns and the next takes over at once.
//
//	go run ./examples/leader                      # 3 replicas in one process, an embedded Redis
//	go run ./examples/leader -addr localhost:6379 -name a -http :8081 &
//	go run ./examples/leader -addr localhost:6379 -name b -http :8082 &
//	curl localhost:8082/leader                    # a
//
// In the demo, the leader shuts down after a few runs of the job, then the
// next one, and so on.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"os"
	"os/signal"
	"sync"
	"syscall"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/zeromicro/go-zero/core/stores/redis"

	"github.com/redislock/redislock"
)

// config is a replica's flags.
type config struct {
	name   string
	key    string
	every  time.Duration // the job's period
	lease  time.Duration
	listen string // HTTP address; none when empty
	runs   int    // the demo's leaders resign after this many runs; 0: never
}

func main() {
	var c config
	addr := flag.String("addr", "", "Redis address host:port (default: an embedded miniredis, and 3 replicas in this process)")
	flag.StringVar(&c.name, "name", "", "this replica's name, the value it proclaims when it leads (default: its host name and pid)")
	flag.StringVar(&c.key, "key", "report-job", "the election's key")
	flag.DurationVar(&c.every, "every", 300*time.Millisecond, "how often the leader runs the job")
	flag.DurationVar(&c.lease, "lease", time.Second, "the leader's lease; the watchdog renews it every lease/3")
	flag.StringVar(&c.listen, "http", "", "serve GET /leader on this address")
	flag.Parse()
	if c.name == "" {
		host, _ := os.Hostname()
		c.name = fmt.Sprintf("%s-%d", host, os.Getpid())
	}

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if *addr == "" { // the demo
		mr := miniredis.NewMiniRedis()
		mr.ClockTTL(true) // TTLs follow the wall clock, as on a real server
		if err := mr.Start(); err != nil {
			log.Fatal(err)
		}
		defer mr.Close()
		*addr, c.runs = mr.Addr(), 3
	}
	// DisableIdentity: miniredis and Redis before 7.2 refuse the CLIENT
	// SETINFO of each new connection, which go-zero's breaker counts as
	// failures until it opens and drops a replica's calls.
	store := redis.MustNewRedis(redis.RedisConf{Host: *addr, Type: redis.NodeType, DisableIdentity: true})
	if c.runs == 0 {
		err := serve(ctx, c, store, os.Stdout)
		if err != nil && !errors.Is(err, context.Canceled) {
			log.Fatal(err)
		}
		return
	}
	demo(ctx, c, store, os.Stdout)
}

// demo runs replicas a, b and c in this process, each leading for c.runs
// runs of the job, then shutting down.
func demo(ctx context.Context, c config, store *redis.Redis, out io.Writer) {
	var wg sync.WaitGroup
	for _, name := range []string{"a", "b", "c"} {
		r := c
		r.name = name
		wg.Add(1)
		go func() {
			defer wg.Done()
			_ = serve(ctx, r, store, out)
		}()
	}
	wg.Wait()
	fmt.Fprintln(out, "every replica led and shut down")
}

// serve runs a replica until ctx ends: it serves GET /leader (when
// c.listen is set), prints each change of leader, and campaigns; while it
// leads, it runs the job every c.every.
func serve(ctx context.Context, c config, store *redis.Redis, out io.Writer) error {
	e := redislock.NewElection(store, c.key, redislock.WithExpiry(c.lease))
	ctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	defer func() { cancel(); wg.Wait() }() // stop = cancel, then wait
	if c.listen != "" {
		ln, err := net.Listen("tcp", c.listen)
		if err != nil {
			return err
		}
		fmt.Fprintf(out, "%s: serving GET /leader on %s\n", c.name, ln.Addr())
		srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			leader, err := e.Leader(r.Context())
			switch {
			case errors.Is(err, redislock.ErrNoLeader):
				http.Error(w, "no leader", http.StatusServiceUnavailable)
			case err != nil:
				http.Error(w, err.Error(), http.StatusBadGateway)
			default:
				fmt.Fprintln(w, leader)
			}
		})}
		wg.Add(1)
		go func() { defer wg.Done(); _ = srv.Serve(ln) }()
		defer srv.Close()
	}
	wg.Add(1)
	go func() {
		defer wg.Done()
		for leader := range e.Observe(ctx) { // "" while nobody leads
			fmt.Fprintf(out, "%s: leader is %q\n", c.name, leader)
		}
	}()
	for ctx.Err() == nil {
		if err := e.Campaign(ctx, c.name); err != nil {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			return err
		}
		if lead(ctx, c, e, out) {
			return nil // shut down, as the demo's leaders do
		}
	}
	return ctx.Err()
}

// lead runs the job every c.every while e leads: until its term ends (then
// the replica campaigns again), or ctx ends or the demo's runs are done
// (then it resigns, and reports true).
func lead(ctx context.Context, c config, e *redislock.Election, out io.Writer) (resigned bool) {
	fmt.Fprintf(out, "%s: leading, term %d\n", c.name, e.Term())
	tick := time.NewTicker(c.every)
	defer tick.Stop()
	for runs := 0; ; {
		select {
		case <-e.Done(): // its lease ran out (a paused process, a lost Redis): no more runs
			fmt.Fprintf(out, "%s: no longer leading: %v\n", c.name, e.Err())
			return false
		case <-ctx.Done():
		case <-tick.C:
			runs++
			fmt.Fprintf(out, "%s: job run %d in term %d\n", c.name, runs, e.Term())
			if c.runs == 0 || runs < c.runs {
				continue
			}
		}
		// Shutting down: the next candidate leads within a round trip, so
		// the line comes first.
		fmt.Fprintf(out, "%s: resigning\n", c.name)
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Second)
		if err := e.Resign(rctx); err != nil {
			fmt.Fprintf(out, "%s: resign failed: %v\n", c.name, err)
		}
		cancel()
		return true
	}
}
