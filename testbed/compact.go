package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// runEtcdCompact compacts an etcd's history up to its current revision, as
// the apiserver's periodic compaction does (--etcd-compaction-interval):
// watches resuming from an older resourceVersion then get 410 Gone.
func runEtcdCompact() int {
	fs := flag.NewFlagSet("etcd-compact", flag.ExitOnError)
	endpoint := fs.String("endpoint", "http://127.0.0.1:2379", "etcd client URL")
	_ = fs.Parse(os.Args[1:])
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c, err := clientv3.New(clientv3.Config{Endpoints: []string{*endpoint}, DialTimeout: 10 * time.Second})
	if err != nil {
		fmt.Fprintf(os.Stderr, "etcd-compact: %v\n", err)
		return 1
	}
	defer c.Close()
	r, err := c.Get(ctx, "compact-probe")
	if err != nil {
		fmt.Fprintf(os.Stderr, "etcd-compact: reading the revision: %v\n", err)
		return 1
	}
	rev := r.Header.Revision
	if _, err := c.Compact(ctx, rev, clientv3.WithCompactPhysical()); err != nil {
		fmt.Fprintf(os.Stderr, "etcd-compact: compacting at %d: %v\n", rev, err)
		return 1
	}
	fmt.Println(rev)
	return 0
}
