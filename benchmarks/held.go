package main

import (
	"fmt"
	"io"
	"os"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// heldChild holds heldLocks locks of the named library with renewal until
// its stdin closes, and reports on stdout: "holding" once they are all
// held, then "result CPU RSS-PER-LOCK GOROUTINES" for the time between.
// (Not a signal: go-zero's proc answers SIGUSR1 with a goroutine dump in
// /tmp, and SIGUSR2 with profiling.)
func heldChild(name, addr string) {
	lib := newLibrary(name, addr)
	defer lib.close()
	stop := make(chan struct{})
	go func() {
		_, _ = io.Copy(io.Discard, os.Stdin)
		close(stop)
	}()

	runtime.GC()
	rss0, g0 := rss(), runtime.NumGoroutine()
	stops := make([]func(), heldLocks)
	var wg sync.WaitGroup
	var failed sync.Once
	for w := 0; w < 32; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := w; i < heldLocks; i += 32 {
				stop, err := lib.hold(fmt.Sprintf("bench:held:%d", i))
				if err != nil {
					failed.Do(func() { fmt.Println("error", err) })
					continue
				}
				stops[i] = stop
			}
		}()
	}
	wg.Wait()
	time.Sleep(lease / 2) // let renewal loops and watchdogs get going
	runtime.GC()
	rss1, g1 := rss(), runtime.NumGoroutine()
	cpu0 := cpuTime()
	fmt.Println("holding")
	<-stop
	cpu := cpuTime() - cpu0
	fmt.Println("result", cpu, float64(rss1-rss0)/heldLocks, g1-g0)
	for _, stop := range stops {
		if stop != nil {
			wg.Add(1)
			go func() { defer wg.Done(); stop() }()
		}
	}
	wg.Wait()
}

// rss returns the process's resident set size in bytes.
func rss() int64 {
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			kb, _ := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), 10, 64)
			return kb << 10
		}
	}
	return 0
}

// cpuTime returns the user and system CPU time of this process so far.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
