// etcd-bench: load from etcd's own Go client (clientv3 3.4), against raftkv or etcd.
//
// Built from source by `make etcd-bench` (GOPATH mode, Debian's golang-etcd-server-dev),
// never committed as a binary. Its CPU is Go's, not Python's, so a Python server measured
// with it does not share its interpreter's cost with the load generator.
//
//	etcd-bench -endpoints 127.0.0.1:2379 -op put -clients 64 -duration 5s
//	etcd-bench -endpoints ... -op range -clients 64
//	etcd-bench -endpoints ... -op watch -watchers 5000 -conns 10 -rate 40 -duration 10s
//
// put and range: `clients` goroutines share `conns` connections and call as fast as they
// can. watch: `watchers` watches on one prefix, spread over `conns` connections, and one
// writer putting `rate` keys a second under the prefix; each value carries its send time,
// so every delivered event gives a delivery latency. One JSON object is printed.
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"go.etcd.io/etcd/clientv3"
	"google.golang.org/grpc"
)

type result struct {
	Op          string  `json:"op"`
	Ops         int64   `json:"ops"`
	Errors      int64   `json:"errors"`
	OpsPerS     float64 `json:"ops_per_s"`
	P50Ms       float64 `json:"p50_ms"`
	P99Ms       float64 `json:"p99_ms"`
	Events      int64   `json:"events,omitempty"`
	EventsPerS  float64 `json:"events_per_s,omitempty"`
	Expected    int64   `json:"expected_events,omitempty"`
	WriterPutsS float64 `json:"writer_puts_per_s,omitempty"`
	Seconds     float64 `json:"seconds"`
}

func percentile(sorted []time.Duration, p float64) float64 {
	if len(sorted) == 0 {
		return 0
	}
	i := int(p * float64(len(sorted)-1))
	return float64(sorted[i].Microseconds()) / 1000
}

// clients dials n connections. window > 0 sets each stream's receive window (and twice that
// for the connection) instead of grpc-go's default, which starts at 64 KiB and grows by its
// bandwidth-delay estimate.
func clients(endpoints []string, n int, window int) []*clientv3.Client {
	var opts []grpc.DialOption
	if window > 0 {
		opts = append(opts, grpc.WithInitialWindowSize(int32(window)), grpc.WithInitialConnWindowSize(int32(2*window)))
	}
	out := make([]*clientv3.Client, n)
	for i := range out {
		c, err := clientv3.New(clientv3.Config{Endpoints: endpoints, DialTimeout: 5 * time.Second, DialOptions: opts})
		if err != nil {
			fmt.Fprintln(os.Stderr, "etcd-bench:", err)
			os.Exit(1)
		}
		out[i] = c
	}
	return out
}

func closed(loop func(ctx context.Context, c *clientv3.Client, i int) (time.Duration, error),
	cs []*clientv3.Client, workers int, d time.Duration) result {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	var mu sync.Mutex
	var all []time.Duration
	var errs int64
	var wg sync.WaitGroup
	start := time.Now()
	for w := 0; w < workers; w++ {
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			var mine []time.Duration
			for i := 0; ctx.Err() == nil; i++ {
				took, err := loop(ctx, cs[w%len(cs)], w*1_000_000+i)
				if err != nil {
					if ctx.Err() == nil {
						atomic.AddInt64(&errs, 1)
					}
					continue
				}
				mine = append(mine, took)
			}
			mu.Lock()
			all = append(all, mine...)
			mu.Unlock()
		}(w)
	}
	wg.Wait()
	secs := time.Since(start).Seconds()
	sort.Slice(all, func(i, j int) bool { return all[i] < all[j] })
	return result{Ops: int64(len(all)), Errors: errs, OpsPerS: float64(len(all)) / secs,
		P50Ms: percentile(all, 0.5), P99Ms: percentile(all, 0.99), Seconds: secs}
}

func main() {
	endpoints := flag.String("endpoints", "127.0.0.1:2379", "comma-separated")
	op := flag.String("op", "put", "put, range or watch")
	workers := flag.Int("clients", 1, "goroutines calling at once (put, range)")
	conns := flag.Int("conns", 1, "client connections")
	duration := flag.Duration("duration", 5*time.Second, "how long")
	valueSize := flag.Int("value-size", 256, "bytes per value")
	keys := flag.Int("keys", 10000, "distinct keys (put)")
	watchers := flag.Int("watchers", 1000, "watches on the prefix (watch)")
	rate := flag.Float64("rate", 100, "writer puts a second (watch)")
	window := flag.Int("window", 0, "each stream's receive window in bytes (0: grpc-go's default)")
	flag.Parse()
	eps := strings.Split(*endpoints, ",")
	cs := clients(eps, *conns, *window)
	value := strings.Repeat("v", *valueSize)
	var r result
	switch *op {
	case "put":
		r = closed(func(ctx context.Context, c *clientv3.Client, i int) (time.Duration, error) {
			t := time.Now()
			_, err := c.Put(ctx, fmt.Sprintf("bench/%08d", i%*keys), value)
			return time.Since(t), err
		}, cs, *workers, *duration)
	case "range":
		if _, err := cs[0].Put(context.Background(), "bench/range", value); err != nil {
			fmt.Fprintln(os.Stderr, "etcd-bench:", err)
			os.Exit(1)
		}
		r = closed(func(ctx context.Context, c *clientv3.Client, i int) (time.Duration, error) {
			t := time.Now()
			_, err := c.Get(ctx, "bench/range")
			return time.Since(t), err
		}, cs, *workers, *duration)
	case "watch":
		r = watch(cs, *watchers, *rate, *duration)
	default:
		fmt.Fprintln(os.Stderr, "etcd-bench: unknown -op", *op)
		os.Exit(2)
	}
	r.Op = *op
	for _, c := range cs {
		c.Close()
	}
	json.NewEncoder(os.Stdout).Encode(r)
}

func watch(cs []*clientv3.Client, watchers int, rate float64, d time.Duration) result {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var events int64
	var mu sync.Mutex
	var lat []time.Duration
	var ready sync.WaitGroup
	for w := 0; w < watchers; w++ {
		ready.Add(1)
		go func(w int) {
			ch := cs[w%len(cs)].Watch(clientv3.WithRequireLeader(ctx), "watchbench/", clientv3.WithPrefix(), clientv3.WithCreatedNotify())
			<-ch // created
			ready.Done()
			var mine []time.Duration
			for resp := range ch {
				now := time.Now().UnixNano()
				for _, ev := range resp.Events {
					atomic.AddInt64(&events, 1)
					if sent, err := strconv.ParseInt(string(ev.Kv.Value), 10, 64); err == nil {
						mine = append(mine, time.Duration(now-sent))
					}
				}
			}
			mu.Lock()
			lat = append(lat, mine...)
			mu.Unlock()
		}(w)
	}
	ready.Wait()
	start := time.Now()
	interval := time.Duration(float64(time.Second) / rate)
	var puts int64
	for i := 0; time.Since(start) < d; i++ {
		next := start.Add(time.Duration(i) * interval)
		time.Sleep(time.Until(next))
		pctx, pcancel := context.WithTimeout(context.Background(), 5*time.Second)
		_, err := cs[0].Put(pctx, fmt.Sprintf("watchbench/%d", i%64), strconv.FormatInt(time.Now().UnixNano(), 10))
		pcancel()
		if err == nil {
			puts++
		}
	}
	secs := time.Since(start).Seconds()
	time.Sleep(2 * time.Second) // the last events in flight
	got := atomic.LoadInt64(&events)
	cancel()
	time.Sleep(200 * time.Millisecond)
	mu.Lock()
	sort.Slice(lat, func(i, j int) bool { return lat[i] < lat[j] })
	p50, p99 := percentile(lat, 0.5), percentile(lat, 0.99)
	mu.Unlock()
	return result{Ops: puts, OpsPerS: float64(puts) / secs, WriterPutsS: float64(puts) / secs,
		Events: got, EventsPerS: float64(got) / secs, Expected: puts * int64(watchers),
		P50Ms: p50, P99Ms: p99, Seconds: secs}
}
