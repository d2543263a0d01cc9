// Command lbtestbed is a multi-call binary bundling the Kubernetes control
// plane, kubelet, kubectl, an embedded etcd and a certificate generator.
//
// Dispatch: `lbtestbed <cmd> [flags]`, or invoke through a symlink whose
// basename is <cmd> (busybox style, e.g. `ln -s lbtestbed kubectl`).
package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	_ "time/tzdata" // CronJob time zone support (apiserver, controller-manager)

	"k8s.io/component-base/cli"
	"k8s.io/component-base/logs"
	_ "k8s.io/component-base/logs/json/register"          // JSON log format registration
	_ "k8s.io/component-base/metrics/prometheus/clientgo" // client-go metrics
	_ "k8s.io/component-base/metrics/prometheus/version"  // version metric

	_ "k8s.io/client-go/plugin/pkg/client/auth" // kubectl auth plugins
	kubectlcmd "k8s.io/kubectl/pkg/cmd"
	kubectlutil "k8s.io/kubectl/pkg/cmd/util"

	apiserver "k8s.io/kubernetes/cmd/kube-apiserver/app"
	controllermanager "k8s.io/kubernetes/cmd/kube-controller-manager/app"
	scheduler "k8s.io/kubernetes/cmd/kube-scheduler/app"
	kubelet "k8s.io/kubernetes/cmd/kubelet/app"

	"lbtestbed/certs"
)

var commands = map[string]func() int{
	"etcd": runEtcd,
	"kube-apiserver": func() int {
		return cli.Run(apiserver.NewAPIServerCommand())
	},
	"kube-controller-manager": func() int {
		return cli.Run(controllermanager.NewControllerManagerCommand())
	},
	"kube-scheduler": func() int {
		return cli.Run(scheduler.NewSchedulerCommand())
	},
	"kubelet": func() int {
		return cli.Run(kubelet.NewKubeletCommand(context.Background()))
	},
	"kubectl": func() int {
		// Same as upstream cmd/kubectl/kubectl.go; os.Args has been shifted so
		// that os.Args[0] is "kubectl" (NewDefaultKubectlCommand and plugin
		// handling read os.Args directly).
		logs.GlogSetter(kubectlcmd.GetLogVerbosity(os.Args)) // nolint:errcheck
		command := kubectlcmd.NewDefaultKubectlCommand()
		if err := cli.RunNoErrOutput(command); err != nil {
			kubectlutil.CheckErr(err)
		}
		return 0
	},
	"certs":        func() int { return certs.Main(os.Args) },
	"etcd-compact": runEtcdCompact,
}

func usage() {
	names := make([]string, 0, len(commands))
	for n := range commands {
		names = append(names, n)
	}
	sort.Strings(names)
	fmt.Fprintf(os.Stderr, "usage: lbtestbed <command> [flags]\ncommands:\n")
	for _, n := range names {
		fmt.Fprintf(os.Stderr, "  %s\n", n)
	}
}

func main() {
	name := filepath.Base(os.Args[0])
	if _, ok := commands[name]; !ok {
		if len(os.Args) < 2 {
			usage()
			os.Exit(2)
		}
		name = os.Args[1]
		if _, ok := commands[name]; !ok {
			if name != "-h" && name != "--help" && name != "help" {
				fmt.Fprintf(os.Stderr, "lbtestbed: unknown command %q\n", name)
			}
			usage()
			os.Exit(2)
		}
		// Shift so the sub-command sees argv as if it were its own binary.
		os.Args = append([]string{name}, os.Args[2:]...)
	}
	os.Exit(commands[name]())
}
