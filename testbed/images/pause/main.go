// Command pause is the pod sandbox's process: it holds the pod's namespaces,
// reaps orphans (it is PID 1 of the pod when the PID namespace is shared) and
// exits on SIGINT/SIGTERM. Upstream's is C (build/pause/linux/pause.c); any
// static program that does this will do, and Go builds one here offline.
package main

import (
	"os"
	"os/signal"
	"syscall"
)

func main() {
	sigs := make(chan os.Signal, 8)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM, syscall.SIGCHLD)
	for s := range sigs {
		if s != syscall.SIGCHLD {
			os.Exit(0)
		}
		for {
			var ws syscall.WaitStatus
			pid, err := syscall.Wait4(-1, &ws, syscall.WNOHANG, nil)
			if pid <= 0 || err != nil {
				break
			}
		}
	}
}
