package redisserver

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// Cluster is a Redis Cluster of primaries without replicas that a test
// started on loopback.
type Cluster struct {
	Nodes []*Server
}

// Addrs returns the nodes' addresses.
func (c *Cluster) Addrs() []string {
	addrs := make([]string, len(c.Nodes))
	for i, n := range c.Nodes {
		addrs[i] = n.Addr
	}
	return addrs
}

// StartCluster starts n cluster-enabled redis-servers, joins them with
// redis-cli --cluster create (slots split evenly, no replicas), and waits
// until every node reports cluster_state:ok. It needs redis-cli too.
func StartCluster(tb testing.TB, n int) *Cluster {
	tb.Helper()
	bin := Binary(tb, "redis-server")
	cli := Binary(tb, "redis-cli")
	c := &Cluster{}
	for i := 0; i < n; i++ {
		c.Nodes = append(c.Nodes, startNode(tb, bin))
	}
	args := append([]string{"--cluster", "create"}, c.Addrs()...)
	args = append(args, "--cluster-replicas", "0", "--cluster-yes")
	if out, err := exec.Command(cli, args...).CombinedOutput(); err != nil {
		tb.Fatalf("redis-cli --cluster create: %v\n%s", err, out)
	}
	deadline := time.Now().Add(30 * time.Second)
	for _, node := range c.Nodes {
		rc := redis.NewClient(&redis.Options{Addr: node.Addr})
		for {
			info, _ := rc.ClusterInfo(context.Background()).Result()
			if strings.Contains(info, "cluster_state:ok") {
				break
			}
			if time.Now().After(deadline) {
				rc.Close()
				tb.Fatalf("cluster node %s not ok: %s", node.Addr, info)
			}
			time.Sleep(50 * time.Millisecond)
		}
		rc.Close()
	}
	return c
}

// startNode starts a cluster-enabled redis-server that knows no other.
func startNode(tb testing.TB, bin string) *Server {
	tb.Helper()
	var s *Server
	var err error
	for try := 0; try < 10; try++ {
		port := clusterPort()
		s = &Server{Addr: "127.0.0.1:" + strconv.Itoa(port), Port: port, bin: bin, args: []string{
			"--port", strconv.Itoa(port), "--bind", "127.0.0.1", "--dir", tb.TempDir(),
			"--save", "", "--appendonly", "no", "--enable-debug-command", "yes", "--repl-diskless-sync-delay", "0",
			"--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf",
			"--cluster-node-timeout", "2000",
		}}
		if err = s.run(); err == nil {
			break
		}
	}
	if err != nil {
		tb.Fatalf("redisserver: cluster node: %v", err)
	}
	tb.Cleanup(s.Stop)
	return s
}

// AddReplica starts a node, makes it a replica of c.Nodes[i], and waits
// until it is in sync (the primary counts it online). It is not in Nodes.
func (c *Cluster) AddReplica(tb testing.TB, i int) *Server {
	tb.Helper()
	ctx := context.Background()
	s := startNode(tb, Binary(tb, "redis-server"))
	primary := c.Nodes[i]
	pc, rc := primary.Client(tb), s.Client(tb)
	id, err := pc.ClusterMyID(ctx).Result()
	if err != nil {
		tb.Fatalf("CLUSTER MYID: %v", err)
	}
	if err := rc.ClusterMeet(ctx, "127.0.0.1", strconv.Itoa(primary.Port)).Err(); err != nil {
		tb.Fatalf("CLUSTER MEET: %v", err)
	}
	deadline := time.Now().Add(30 * time.Second)
	wait := func(what string, done func() bool) {
		for !done() {
			if time.Now().After(deadline) {
				tb.Fatalf("redisserver: waited 30 s for %s", what)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	wait("the replica to replicate", func() bool { return rc.ClusterReplicate(ctx, id).Err() == nil })
	primary.WaitReplicas(tb, 1)
	return s
}

// clusterPort returns a port that is free with its cluster bus port
// (port+10000) a moment ago.
func clusterPort() int {
	for {
		port := 20000 + rand.IntN(20000)
		ok := true
		for _, p := range []int{port, port + 10000} {
			l, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", p))
			if err != nil {
				ok = false
				break
			}
			l.Close()
		}
		if ok {
			return port
		}
	}
}
