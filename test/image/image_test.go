//go:build integration

// Package image checks the image `make image` builds without a container
// engine (_out/gputopo-image.tar, an OCI archive): its manifest and
// config, the files each layer holds, and that both binaries start from
// the image's own root filesystem (Debian's glibc, no host libraries) as
// the image's nonroot user.
package image

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"encoding/json"
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/gputopo/gputopo/test/harness"
)

type descriptor struct {
	MediaType   string            `json:"mediaType"`
	Digest      string            `json:"digest"`
	Annotations map[string]string `json:"annotations"`
}

// archive is the OCI archive's files by path.
type archive map[string][]byte

func readArchive(t *testing.T, path string) archive {
	t.Helper()
	f, err := os.Open(path)
	if errors.Is(err, os.ErrNotExist) {
		t.Fatalf("%s is missing: run `make image` (make test-integration does)", path)
	}
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	a := archive{}
	tr := tar.NewReader(f)
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return a
		}
		if err != nil {
			t.Fatalf("read %s: %v", path, err)
		}
		if h.Typeflag == tar.TypeReg {
			b, err := io.ReadAll(tr)
			if err != nil {
				t.Fatal(err)
			}
			a[h.Name] = b
		}
	}
}

func (a archive) blob(t *testing.T, digest string, into any) []byte {
	t.Helper()
	b, ok := a["blobs/"+strings.Replace(digest, ":", "/", 1)]
	if !ok {
		t.Fatalf("blob %s missing from the archive", digest)
	}
	if into != nil {
		if err := json.Unmarshal(b, into); err != nil {
			t.Fatalf("blob %s: %v", digest, err)
		}
	}
	return b
}

func TestImageRunsFromItsOwnRootFilesystem(t *testing.T) {
	a := readArchive(t, filepath.Join(harness.RepoRoot(), "_out", "gputopo-image.tar"))
	if _, ok := a["oci-layout"]; !ok {
		t.Fatal("no oci-layout file: not an OCI image layout")
	}
	var index struct {
		Manifests []descriptor `json:"manifests"`
	}
	if err := json.Unmarshal(a["index.json"], &index); err != nil || len(index.Manifests) != 1 {
		t.Fatalf("index.json: %v, %d manifests; want one", err, len(index.Manifests))
	}
	if ref := index.Manifests[0].Annotations["org.opencontainers.image.ref.name"]; !strings.Contains(ref, "gputopo") {
		t.Errorf("image reference %q", ref)
	}
	var manifest struct {
		MediaType string       `json:"mediaType"`
		Config    descriptor   `json:"config"`
		Layers    []descriptor `json:"layers"`
	}
	a.blob(t, index.Manifests[0].Digest, &manifest)
	if manifest.MediaType != "application/vnd.oci.image.manifest.v1+json" || manifest.Config.MediaType != "application/vnd.oci.image.config.v1+json" {
		t.Errorf("manifest %s with config %s; want OCI media types", manifest.MediaType, manifest.Config.MediaType)
	}
	var cfg struct {
		Architecture string `json:"architecture"`
		OS           string `json:"os"`
		Config       struct {
			User       string   `json:"User"`
			Entrypoint []string `json:"Entrypoint"`
		} `json:"config"`
	}
	a.blob(t, manifest.Config.Digest, &cfg)
	if cfg.OS != "linux" || cfg.Architecture != "amd64" || cfg.Config.User != "65532:65532" ||
		len(cfg.Config.Entrypoint) != 1 || cfg.Config.Entrypoint[0] != "/usr/local/bin/gputopo" {
		t.Errorf("config %+v; want linux/amd64, user 65532:65532, entrypoint /usr/local/bin/gputopo (as the Dockerfile)", cfg)
	}

	// Unpack the layers in order, as a runtime's snapshotter would.
	root := t.TempDir()
	files := map[string]bool{}
	for _, l := range manifest.Layers {
		var r io.Reader = bytes.NewReader(a.blob(t, l.Digest, nil))
		switch l.MediaType {
		case "application/vnd.oci.image.layer.v1.tar":
		case "application/vnd.oci.image.layer.v1.tar+gzip":
			zr, err := gzip.NewReader(r)
			if err != nil {
				t.Fatalf("layer %s: %v", l.Digest, err)
			}
			r = zr
		default:
			t.Fatalf("layer %s has media type %s", l.Digest, l.MediaType)
		}
		tr := tar.NewReader(r)
		for {
			h, err := tr.Next()
			if errors.Is(err, io.EOF) {
				break
			}
			if err != nil {
				t.Fatal(err)
			}
			files[strings.TrimSuffix(h.Name, "/")] = true
			p := filepath.Join(root, h.Name)
			switch h.Typeflag {
			case tar.TypeDir:
				if err := os.MkdirAll(p, 0o700); err != nil {
					t.Fatal(err)
				}
				mode := os.FileMode(h.Mode) & os.ModePerm
				if h.Mode&0o1000 != 0 {
					mode |= os.ModeSticky
				}
				if err := os.Chmod(p, mode); err != nil {
					t.Fatal(err)
				}
				if err := os.Lchown(p, h.Uid, h.Gid); err != nil {
					t.Fatal(err)
				}
			case tar.TypeSymlink:
				_ = os.MkdirAll(filepath.Dir(p), 0o755)
				if err := os.Symlink(h.Linkname, p); err != nil {
					t.Fatal(err)
				}
			case tar.TypeReg:
				_ = os.MkdirAll(filepath.Dir(p), 0o755)
				b, _ := io.ReadAll(tr)
				if err := os.WriteFile(p, b, os.FileMode(h.Mode)&os.ModePerm); err != nil {
					t.Fatal(err)
				}
			}
		}
	}
	for _, f := range []string{"usr/local/bin/gputopo", "usr/local/bin/gputopo-scheduler", "etc/passwd", "etc/group", "tmp", "lib64/ld-linux-x86-64.so.2", "lib/x86_64-linux-gnu/libc.so.6"} {
		if !files[f] {
			t.Errorf("the image lacks %s", f)
		}
	}
	if passwd, _ := os.ReadFile(filepath.Join(root, "etc/passwd")); !strings.Contains(string(passwd), "nonroot:x:65532:65532") {
		t.Errorf("/etc/passwd has no nonroot user 65532:\n%s", passwd)
	}
	// A world-writable /tmp, as the components' libraries expect.
	if st, err := os.Stat(filepath.Join(root, "tmp")); err != nil || st.Mode()&(os.ModePerm|os.ModeSticky) != 0o777|os.ModeSticky {
		t.Errorf("/tmp: %v, mode %v; want 1777", err, st.Mode())
	}
	// The unpacked root must be traversable by the image's user.
	if err := os.Chmod(root, 0o755); err != nil {
		t.Fatal(err)
	}

	// Run both binaries inside the unpacked root filesystem, as the image's
	// user: the cgo build of gputopo must find the image's glibc.
	if _, err := exec.LookPath("chroot"); err != nil {
		t.Skip("chroot is not installed: the binaries' start inside the image is not checked")
	}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"/usr/local/bin/gputopo", "version"}, ""}, // prints the stamped version
		{[]string{"/usr/local/bin/gputopo-scheduler", "--version"}, "Kubernetes v1."},
	} {
		out, err := exec.Command("chroot", append([]string{"--userspec=65532:65532", root}, tc.args...)...).CombinedOutput()
		if err != nil && strings.Contains(string(out), "Operation not permitted") {
			t.Skipf("chroot is not permitted here (%s): the binaries' start inside the image is not checked", strings.TrimSpace(string(out)))
		}
		if err != nil || !strings.Contains(string(out), tc.want) || strings.TrimSpace(string(out)) == "" {
			t.Errorf("%v inside the image: %v\n%s", tc.args, err, out)
		}
	}
	// The components run with a read-only root filesystem: starting must
	// write nothing (the image's binary is built without the demo, whose
	// envtest import creates a directory below /tmp at init).
	if left, _ := os.ReadDir(filepath.Join(root, "tmp")); len(left) > 0 {
		t.Errorf("starting the binaries wrote into the image's /tmp: %v", left)
	}
}
