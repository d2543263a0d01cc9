package main

import (
	"flag"
	"fmt"
	"net/url"
	"os"
	"os/signal"
	"syscall"
	"time"

	"go.etcd.io/etcd/server/v3/embed"
)

// runEtcd starts a single-member embedded etcd (plain HTTP, intended for
// loopback only) and blocks until SIGINT/SIGTERM or a server error.
func runEtcd() int {
	fs := flag.NewFlagSet("etcd", flag.ExitOnError)
	name := fs.String("name", "default", "member name")
	dataDir := fs.String("data-dir", "", "data directory (required)")
	clientURL := fs.String("listen-client-urls", "http://127.0.0.1:2379", "client URL to listen on (also advertised)")
	peerURL := fs.String("listen-peer-urls", "http://127.0.0.1:2380", "peer URL to listen on (also advertised)")
	metricsURL := fs.String("listen-metrics-urls", "", "optional metrics URL")
	logLevel := fs.String("log-level", "warn", "debug, info, warn, error")
	quota := fs.Int64("quota-backend-bytes", 0, "backend quota (0 = etcd default)")
	noFsync := fs.Bool("unsafe-no-fsync", false, "disable fsync (faster, unsafe; fine for throwaway test beds)")
	_ = fs.Parse(os.Args[1:])
	if *dataDir == "" {
		fmt.Fprintln(os.Stderr, "etcd: --data-dir is required")
		return 2
	}
	parse := func(s string) []url.URL {
		u, err := url.Parse(s)
		if err != nil {
			fmt.Fprintf(os.Stderr, "etcd: bad URL %q: %v\n", s, err)
			os.Exit(2)
		}
		return []url.URL{*u}
	}

	cfg := embed.NewConfig()
	cfg.Name = *name
	cfg.Dir = *dataDir
	cfg.ListenClientUrls = parse(*clientURL)
	cfg.AdvertiseClientUrls = parse(*clientURL)
	cfg.ListenPeerUrls = parse(*peerURL)
	cfg.AdvertisePeerUrls = parse(*peerURL)
	cfg.InitialCluster = cfg.InitialClusterFromName(cfg.Name)
	if *metricsURL != "" {
		cfg.ListenMetricsUrls = parse(*metricsURL)
	}
	cfg.LogLevel = *logLevel
	cfg.QuotaBackendBytes = *quota
	cfg.UnsafeNoFsync = *noFsync

	e, err := embed.StartEtcd(cfg)
	if err != nil {
		fmt.Fprintf(os.Stderr, "etcd: start: %v\n", err)
		return 1
	}
	defer e.Close()
	select {
	case <-e.Server.ReadyNotify():
		fmt.Fprintf(os.Stderr, "etcd: ready, serving clients on %s\n", *clientURL)
	case <-time.After(60 * time.Second):
		e.Server.Stop()
		fmt.Fprintln(os.Stderr, "etcd: not ready after 60s")
		return 1
	}
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGINT, syscall.SIGTERM)
	select {
	case s := <-sig:
		fmt.Fprintf(os.Stderr, "etcd: %v, shutting down\n", s)
		return 0
	case err := <-e.Err():
		fmt.Fprintf(os.Stderr, "etcd: %v\n", err)
		return 1
	}
}
