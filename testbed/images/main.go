// Command lbimage assembles a container image from files of this machine and
// writes it as a docker-archive tarball that `ctr -n k8s.io images import`
// takes. No registry can be reached from the test bed, so every image the
// node runs (the pod sandbox, the agent, the e2e test images) is built here.
//
//	lbimage --ref ghcr.io/example/lb-agent:0.1.0 --out agent.tar \
//	    --file target/release/lb-agent=/usr/local/bin/lb-agent \
//	    --with-libs --busybox /bin/busybox --entrypoint lb-agent
//
// The image manifest, config and archive come from go-containerregistry; the
// one layer is a plain tar of the files named (archive/tar).
package main

import (
	"archive/tar"
	"bytes"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path"
	"regexp"
	"runtime"
	"sort"
	"strings"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
)

type list []string

func (l *list) String() string     { return strings.Join(*l, ",") }
func (l *list) Set(v string) error { *l = append(*l, v); return nil }

func main() {
	if err := run(os.Args[1:]); err != nil {
		fmt.Fprintln(os.Stderr, "lbimage:", err)
		os.Exit(1)
	}
}

func run(args []string) error {
	fs := flag.NewFlagSet("lbimage", flag.ContinueOnError)
	ref := fs.String("ref", "", "image reference to record, e.g. registry.k8s.io/pause:3.10.1")
	out := fs.String("out", "", "docker-archive tarball to write")
	var files, links, env list
	fs.Var(&files, "file", "SRC=DST: copy a file of this machine to DST in the image (repeatable)")
	fs.Var(&links, "symlink", "LINK=TARGET: a symbolic link in the image (repeatable)")
	fs.Var(&env, "env", "K=V in the image config (repeatable)")
	withLibs := fs.Bool("with-libs", false, "also copy the shared libraries the files need (ldd), at the same paths")
	busybox := fs.String("busybox", "", "a static busybox to install as /bin/busybox with a link per applet (sh, grep, mount, nc, wget, ...)")
	entrypoint := fs.String("entrypoint", "", "comma-separated entrypoint")
	cmd := fs.String("cmd", "", "comma-separated default arguments")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *ref == "" || *out == "" {
		return fmt.Errorf("--ref and --out are required")
	}
	tag, err := name.NewTag(*ref, name.StrictValidation)
	if err != nil {
		return fmt.Errorf("--ref %q: %w", *ref, err)
	}
	l := layer{files: map[string]entry{}}
	for _, f := range files {
		src, dst, ok := strings.Cut(f, "=")
		if !ok || !path.IsAbs(dst) {
			return fmt.Errorf("--file %q: want SRC=/ABSOLUTE/DST", f)
		}
		if err := l.addFile(src, dst); err != nil {
			return err
		}
		if *withLibs {
			if err := l.addLibs(src); err != nil {
				return err
			}
		}
	}
	if *busybox != "" {
		if err := l.addBusybox(*busybox); err != nil {
			return err
		}
	}
	for _, s := range links {
		link, target, ok := strings.Cut(s, "=")
		if !ok || !path.IsAbs(link) {
			return fmt.Errorf("--symlink %q: want /ABSOLUTE/LINK=TARGET", s)
		}
		l.add(link, entry{link: target})
	}
	data, err := l.tar()
	if err != nil {
		return err
	}
	lay, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) {
		return io.NopCloser(bytes.NewReader(data)), nil
	})
	if err != nil {
		return err
	}
	img, err := mutate.AppendLayers(empty.Image, lay)
	if err != nil {
		return err
	}
	cfg, err := img.ConfigFile()
	if err != nil {
		return err
	}
	cfg = cfg.DeepCopy()
	cfg.OS, cfg.Architecture = "linux", runtime.GOARCH
	cfg.Created = v1.Time{Time: time.Unix(0, 0).UTC()}
	cfg.Config.Env = append([]string{"PATH=/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin"}, env...)
	if *entrypoint != "" {
		cfg.Config.Entrypoint = strings.Split(*entrypoint, ",")
	}
	if *cmd != "" {
		cfg.Config.Cmd = strings.Split(*cmd, ",")
	}
	img, err = mutate.ConfigFile(img, cfg)
	if err != nil {
		return err
	}
	return tarball.WriteToFile(*out, tag, img)
}

type entry struct {
	src  string // a file of this machine, or
	link string // a symlink target
	dir  bool
}

type layer struct{ files map[string]entry }

// add records dst; a path already taken keeps its first entry (a file named
// on the command line wins over a busybox applet link or a library found
// twice), and a parent that is not a directory is an error at tar time.
func (l *layer) add(dst string, e entry) {
	for d := path.Dir(dst); d != "/"; d = path.Dir(d) {
		if _, ok := l.files[d]; !ok {
			l.files[d] = entry{dir: true}
		}
	}
	if _, taken := l.files[dst]; taken {
		return
	}
	l.files[dst] = e
}

func (l *layer) addFile(src, dst string) error {
	st, err := os.Stat(src)
	if err != nil {
		return fmt.Errorf("--file %s: %w", src, err)
	}
	if !st.Mode().IsRegular() {
		return fmt.Errorf("--file %s: not a regular file", src)
	}
	l.add(dst, entry{src: src})
	return nil
}

var lddLine = regexp.MustCompile(`(?:=>\s*)?(/\S+)\s+\(0x`)

// addLibs copies what the dynamic loader needs for src (ldd's answer), at the
// paths the loader will look for them.
func (l *layer) addLibs(src string) error {
	out, err := exec.Command("ldd", src).CombinedOutput()
	if err != nil {
		if strings.Contains(string(out), "not a dynamic executable") {
			return nil // static: nothing to add
		}
		return fmt.Errorf("ldd %s: %v: %s", src, err, out)
	}
	// A library the loader cannot find would make an image that cannot start.
	if strings.Contains(string(out), "not found") {
		return fmt.Errorf("ldd %s: a library is missing on this machine:\n%s", src, out)
	}
	for _, m := range lddLine.FindAllStringSubmatch(string(out), -1) {
		lib := m[1]
		real, err := resolve(lib)
		if err != nil {
			return err
		}
		if real != lib {
			l.add(lib, entry{link: real})
		}
		if err := l.addFile(real, real); err != nil {
			return err
		}
	}
	return nil
}

// resolve follows symlinks to the real file, keeping absolute paths.
func resolve(p string) (string, error) {
	for i := 0; i < 16; i++ {
		t, err := os.Readlink(p)
		if err != nil {
			return p, nil
		}
		if !path.IsAbs(t) {
			t = path.Join(path.Dir(p), t)
		}
		p = t
	}
	return "", fmt.Errorf("%s: too many symlinks", p)
}

func (l *layer) addBusybox(src string) error {
	if err := l.addFile(src, "/bin/busybox"); err != nil {
		return err
	}
	out, err := exec.Command(src, "--list-full").Output()
	if err != nil {
		return fmt.Errorf("%s --list-full: %w", src, err)
	}
	for _, applet := range strings.Fields(string(out)) {
		p := "/" + applet
		if _, taken := l.files[p]; !taken {
			l.add(p, entry{link: "/bin/busybox"})
		}
	}
	return nil
}

func (l *layer) tar() ([]byte, error) {
	paths := make([]string, 0, len(l.files))
	for p := range l.files {
		paths = append(paths, p)
	}
	sort.Strings(paths) // parents before children, and reproducible
	for _, p := range paths {
		for d := path.Dir(p); d != "/"; d = path.Dir(d) {
			if !l.files[d].dir {
				return nil, fmt.Errorf("%s: its parent %s is a file or a link in this image", p, d)
			}
		}
	}
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	epoch := time.Unix(0, 0)
	for _, p := range paths {
		e := l.files[p]
		h := &tar.Header{Name: strings.TrimPrefix(p, "/"), ModTime: epoch, Format: tar.FormatPAX}
		switch {
		case e.dir:
			h.Typeflag, h.Mode, h.Name = tar.TypeDir, 0o755, h.Name+"/"
		case e.link != "":
			h.Typeflag, h.Linkname, h.Mode = tar.TypeSymlink, e.link, 0o777
		default:
			data, err := os.ReadFile(e.src)
			if err != nil {
				return nil, err
			}
			st, _ := os.Stat(e.src)
			h.Typeflag, h.Mode, h.Size = tar.TypeReg, int64(st.Mode().Perm()), int64(len(data))
			if err := tw.WriteHeader(h); err != nil {
				return nil, err
			}
			if _, err := tw.Write(data); err != nil {
				return nil, err
			}
			continue
		}
		if err := tw.WriteHeader(h); err != nil {
			return nil, err
		}
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}
