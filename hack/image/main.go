// Command image assembles the gputopo image as an OCI archive without a
// container engine: a root filesystem from Debian's packages (the glibc
// that gputopo's cgo build links and go-nvml's dlopen needs), a nonroot
// user, and the binaries, with go-containerregistry. `make image` runs it;
// see docs/install.md, "Building the image". The layout matches the
// Dockerfile's: /usr/local/bin/gputopo and /usr/local/bin/gputopo-scheduler,
// user 65532, entrypoint gputopo.
//
// With -single PATH it writes a one-binary image instead: the static binary
// given with -bin at PATH, run as -user. `make image` writes two for the
// runtime tests, which import the archives into containerd (nothing can be
// pulled here): the pod sandbox image (hack/image/pause at /pause, user
// 65535, the shape of registry.k8s.io/pause) and kube-scheduler from bin/
// (the chart's extender-mode scheduler image).
package main

import (
	"archive/tar"
	"bytes"
	"errors"
	"flag"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// nonroot is the user the image runs as, as distroless's nonroot.
const nonroot = 65532

// epoch stamps every file and the image, so that the same inputs give
// the same digest.
var epoch = time.Unix(0, 0).UTC()

type options struct {
	out, ref, version string
	debs              []string
	bins              []string
	single, user      string
}

func main() {
	var o options
	var debs, bins string
	flag.StringVar(&o.out, "out", "_out/gputopo-image.tar", "OCI archive to write (a tar of an OCI image layout)")
	flag.StringVar(&o.ref, "ref", "ghcr.io/gputopo/gputopo:dev", "image reference recorded in the layout (org.opencontainers.image.ref.name)")
	flag.StringVar(&o.version, "version", "dev", "version label")
	flag.StringVar(&debs, "debs", "", "comma-separated Debian .deb files whose contents form the base layer (libc6)")
	flag.StringVar(&bins, "bin", "", "comma-separated binaries for /usr/local/bin")
	flag.StringVar(&o.single, "single", "", "write a one-binary image: -bin is one static binary, installed at this path and run as -user; no -debs")
	flag.StringVar(&o.user, "user", "65532:65532", "uid:gid of a -single image")
	flag.Parse()
	o.debs, o.bins = split(debs), split(bins)
	if err := build(o); err != nil {
		fmt.Fprintln(os.Stderr, "image:", err)
		os.Exit(1)
	}
}

func split(s string) []string {
	var out []string
	for _, f := range strings.Split(s, ",") {
		if f = strings.TrimSpace(f); f != "" {
			out = append(out, f)
		}
	}
	return out
}

func build(o options) error {
	var (
		img v1.Image
		err error
	)
	if o.single != "" {
		img, err = singleImage(o)
	} else {
		img, err = gputopoImage(o)
	}
	if err != nil {
		return err
	}
	dir, err := os.MkdirTemp("", "gputopo-image-layout-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	p, err := layout.Write(dir, empty.Index)
	if err != nil {
		return fmt.Errorf("write OCI layout: %w", err)
	}
	if err := p.AppendImage(img, layout.WithAnnotations(map[string]string{
		// The OCI name, and the full name containerd's import (ctr images
		// import) registers the image under.
		"org.opencontainers.image.ref.name": o.ref,
		"io.containerd.image.name":          o.ref,
	})); err != nil {
		return fmt.Errorf("write image into the layout: %w", err)
	}
	if err := os.MkdirAll(filepath.Dir(o.out), 0o755); err != nil {
		return err
	}
	if err := tarDir(dir, o.out); err != nil {
		return err
	}
	d, _ := img.Digest()
	fmt.Printf("image: %s (%s) written to %s\n", o.ref, d, o.out)
	return nil
}

// gputopoImage is Debian's libc6 and the nonroot user below the gputopo
// binaries.
func gputopoImage(o options) (v1.Image, error) {
	if len(o.debs) == 0 || len(o.bins) == 0 {
		return nil, errors.New("-debs and -bin are required: the base layer is Debian's libc6, the top layer the binaries")
	}
	base, err := debLayer(o.debs)
	if err != nil {
		return nil, err
	}
	binLayer, err := binariesLayer(o.bins)
	if err != nil {
		return nil, err
	}
	return withConfig(o, "gputopo", fmt.Sprintf("%d:%d", nonroot, nonroot), []string{"/usr/local/bin/gputopo"},
		mutate.Addendum{Layer: base, MediaType: types.OCILayer, History: v1.History{CreatedBy: "Debian packages: " + strings.Join(baseNames(o.debs), " "), Created: v1.Time{Time: epoch}}},
		mutate.Addendum{Layer: binLayer, MediaType: types.OCILayer, History: v1.History{CreatedBy: "gputopo binaries", Created: v1.Time{Time: epoch}}},
	)
}

// singleImage is one static binary at o.single (its parent directories
// included) and nothing else, run as o.user.
func singleImage(o options) (v1.Image, error) {
	if len(o.debs) != 0 || len(o.bins) != 1 {
		return nil, errors.New("-single takes exactly one -bin (a static binary) and no -debs")
	}
	if !strings.HasPrefix(o.single, "/") || strings.HasSuffix(o.single, "/") {
		return nil, fmt.Errorf("-single %q: want the binary's absolute path in the image, e.g. /pause", o.single)
	}
	body, err := os.ReadFile(o.bins[0])
	if err != nil {
		return nil, err
	}
	rel := strings.TrimPrefix(o.single, "/")
	var es []entry
	for d := filepath.Dir(rel); d != "."; d = filepath.Dir(d) {
		es = append(es, dirEntry(d+"/", 0o755, 0))
	}
	es = append(es, fileEntry(rel, 0o755, body))
	l, err := layerOf(es)
	if err != nil {
		return nil, err
	}
	title := filepath.Base(rel)
	return withConfig(o, title, o.user, []string{o.single},
		mutate.Addendum{Layer: l, MediaType: types.OCILayer, History: v1.History{CreatedBy: title, Created: v1.Time{Time: epoch}}})
}

// withConfig stacks the layers into an OCI image and writes its config.
func withConfig(o options, title, user string, entrypoint []string, layers ...mutate.Addendum) (v1.Image, error) {
	img, err := mutate.Append(mutate.MediaType(empty.Image, types.OCIManifestSchema1), layers...)
	if err != nil {
		return nil, fmt.Errorf("assemble layers: %w", err)
	}
	img = mutate.ConfigMediaType(img, types.OCIConfigJSON)
	cf, err := img.ConfigFile()
	if err != nil {
		return nil, err
	}
	cf = cf.DeepCopy()
	cf.Architecture, cf.OS, cf.Created = "amd64", "linux", v1.Time{Time: epoch}
	cf.Config.User = user
	cf.Config.Entrypoint = entrypoint
	cf.Config.Env = []string{"PATH=/usr/local/bin:/usr/bin:/bin"}
	cf.Config.Labels = map[string]string{
		"org.opencontainers.image.title":   title,
		"org.opencontainers.image.version": o.version,
		"org.opencontainers.image.source":  "https://github.com/gputopo/gputopo",
	}
	if img, err = mutate.ConfigFile(img, cf); err != nil {
		return nil, fmt.Errorf("image config: %w", err)
	}
	return img, nil
}

func baseNames(paths []string) []string {
	var out []string
	for _, p := range paths {
		out = append(out, filepath.Base(p))
	}
	return out
}

// entry is one file of a layer.
type entry struct {
	hdr  *tar.Header
	body []byte
}

// debLayer extracts the packages (dpkg-deb) and adds what a distroless
// base has besides: /etc/passwd and /etc/group with root and nonroot,
// /tmp and nonroot's home.
func debLayer(debs []string) (v1.Layer, error) {
	root, err := os.MkdirTemp("", "gputopo-image-rootfs-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(root)
	for _, d := range debs {
		if out, err := exec.Command("dpkg-deb", "-x", d, root).CombinedOutput(); err != nil {
			return nil, fmt.Errorf("dpkg-deb -x %s: %w: %s", d, err, out)
		}
	}
	var es []entry
	err = filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil || path == root {
			return err
		}
		rel, _ := filepath.Rel(root, path)
		// Documentation is not needed at run time.
		if strings.HasPrefix(rel, "usr/share/doc") || strings.HasPrefix(rel, "usr/share/lintian") {
			return nil
		}
		info, err := os.Lstat(path)
		if err != nil {
			return err
		}
		link := ""
		if info.Mode()&fs.ModeSymlink != 0 {
			if link, err = os.Readlink(path); err != nil {
				return err
			}
		}
		hdr, err := tar.FileInfoHeader(info, link)
		if err != nil {
			return err
		}
		hdr.Name = rel
		if info.IsDir() {
			hdr.Name += "/"
		}
		var body []byte
		if info.Mode().IsRegular() {
			if body, err = os.ReadFile(path); err != nil {
				return err
			}
		}
		es = append(es, entry{hdr, body})
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("read the packages' files: %w", err)
	}
	passwd := fmt.Sprintf("root:x:0:0:root:/root:/sbin/nologin\nnonroot:x:%d:%d:nonroot:/home/nonroot:/sbin/nologin\n", nonroot, nonroot)
	group := fmt.Sprintf("root:x:0:\nnonroot:x:%d:\n", nonroot)
	es = append(es,
		dirEntry("etc/", 0o755, 0), fileEntry("etc/passwd", 0o644, []byte(passwd)), fileEntry("etc/group", 0o644, []byte(group)),
		dirEntry("tmp/", 0o1777, 0), dirEntry("home/", 0o755, 0), dirEntry("home/nonroot/", 0o700, nonroot),
		dirEntry("root/", 0o700, 0))
	return layerOf(es)
}

func binariesLayer(bins []string) (v1.Layer, error) {
	es := []entry{dirEntry("usr/", 0o755, 0), dirEntry("usr/local/", 0o755, 0), dirEntry("usr/local/bin/", 0o755, 0)}
	for _, b := range bins {
		body, err := os.ReadFile(b)
		if err != nil {
			return nil, err
		}
		es = append(es, fileEntry("usr/local/bin/"+filepath.Base(b), 0o755, body))
	}
	return layerOf(es)
}

func dirEntry(name string, mode int64, uid int) entry {
	return entry{hdr: &tar.Header{Typeflag: tar.TypeDir, Name: name, Mode: mode, Uid: uid, Gid: uid}}
}

func fileEntry(name string, mode int64, body []byte) entry {
	return entry{hdr: &tar.Header{Typeflag: tar.TypeReg, Name: name, Mode: mode, Size: int64(len(body))}, body: body}
}

// layerOf writes the entries as a tar in name order (directories first
// where they share a prefix), owned by root unless set, stamped with the
// epoch, and returns it as an uncompressed OCI layer.
func layerOf(es []entry) (v1.Layer, error) {
	sort.SliceStable(es, func(i, j int) bool { return es[i].hdr.Name < es[j].hdr.Name })
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	seen := map[string]bool{}
	for _, e := range es {
		h := *e.hdr
		if seen[h.Name] {
			continue
		}
		seen[h.Name] = true
		h.ModTime, h.AccessTime, h.ChangeTime = epoch, time.Time{}, time.Time{}
		h.Uname, h.Gname = "", ""
		h.Format = tar.FormatPAX
		if err := tw.WriteHeader(&h); err != nil {
			return nil, fmt.Errorf("layer entry %s: %w", h.Name, err)
		}
		if len(e.body) > 0 {
			if _, err := tw.Write(e.body); err != nil {
				return nil, err
			}
		}
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	data := buf.Bytes()
	return tarball.LayerFromOpener(func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(data)), nil },
		tarball.WithMediaType(types.OCILayer))
}

// tarDir writes dir as a tar at out: an OCI archive (oci-archive: in
// skopeo, ctr images import).
func tarDir(dir, out string) error {
	f, err := os.Create(out)
	if err != nil {
		return err
	}
	tw := tar.NewWriter(f)
	err = filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil || path == dir {
			return err
		}
		rel, _ := filepath.Rel(dir, path)
		info, err := d.Info()
		if err != nil {
			return err
		}
		hdr, err := tar.FileInfoHeader(info, "")
		if err != nil {
			return err
		}
		hdr.Name, hdr.ModTime = filepath.ToSlash(rel), epoch
		if d.IsDir() {
			hdr.Name += "/"
		}
		if err := tw.WriteHeader(hdr); err != nil {
			return err
		}
		if d.Type().IsRegular() {
			b, err := os.ReadFile(path)
			if err != nil {
				return err
			}
			_, err = tw.Write(b)
			return err
		}
		return nil
	})
	if cerr := tw.Close(); err == nil {
		err = cerr
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("write %s: %w", out, err)
	}
	return nil
}
