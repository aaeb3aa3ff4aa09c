// Command billing is a go-zero REST service that charges invoices, each at
// most once, under a redislock lock per invoice.
//
//	go run ./examples/gozero-service
//	curl -X POST localhost:8888/invoices/42/charge
package main

import (
	_ "embed"
	"errors"
	"flag"
	"fmt"
	"io/fs"
	"log"
	"os"

	"github.com/redislock/redislock/examples/gozero-service/internal/config"
	"github.com/redislock/redislock/examples/gozero-service/internal/errorx"
	"github.com/redislock/redislock/examples/gozero-service/internal/handler"
	"github.com/redislock/redislock/examples/gozero-service/internal/svc"

	"github.com/alicebob/miniredis/v2"
	"github.com/zeromicro/go-zero/core/conf"
	"github.com/zeromicro/go-zero/rest"
	"github.com/zeromicro/go-zero/rest/httpx"
)

const defaultConfigFile = "etc/billing.yaml"

var configFile = flag.String("f", defaultConfigFile, "the config file")

// defaultConfig is etc/billing.yaml, for a run from elsewhere than this
// directory (go run ./examples/gozero-service from the repository's root).
//
//go:embed etc/billing.yaml
var defaultConfig []byte

func main() {
	flag.Parse()

	var c config.Config
	if err := loadConfig(*configFile, &c); err != nil {
		log.Fatal(err)
	}
	if c.Redis.Host == "" {
		mr := miniredis.NewMiniRedis()
		mr.ClockTTL(true) // TTLs follow the clock, as on a real server
		if err := mr.Start(); err != nil {
			log.Fatal(err)
		}
		defer mr.Close()
		c.Redis.Host = mr.Addr()
		fmt.Printf("Redis.Host is empty: using an embedded miniredis at %s\n", c.Redis.Host)
	}

	server, ctx := newServer(c)
	defer server.Stop()
	// The Locker closes once the server has stopped: not in a shutdown
	// listener, which go-zero runs while in-flight requests still finish,
	// and whose Close would end their holds (ErrLockerClosed).
	defer ctx.Close()

	fmt.Printf("Starting server at %s:%d...\n", c.Host, c.Port)
	server.Start() // returns after SIGTERM or SIGINT, once in-flight requests are done
}

// loadConfig loads file into c; the default file, when it is not there,
// from the embedded copy.
func loadConfig(file string, c *config.Config) error {
	if file == defaultConfigFile {
		if _, err := os.Stat(file); errors.Is(err, fs.ErrNotExist) {
			return conf.LoadFromYamlBytes(defaultConfig, c)
		}
	}
	return conf.Load(file, c)
}

// newServer makes the service of c: its server, with its routes, and its
// ServiceContext, which the caller closes after the server stopped.
func newServer(c config.Config) (*rest.Server, *svc.ServiceContext) {
	server := rest.MustNewServer(c.RestConf)
	ctx := svc.NewServiceContext(c)
	handler.RegisterHandlers(server, ctx)
	httpx.SetErrorHandlerCtx(errorx.Handler)
	return server, ctx
}
