package doccommands

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/google/go-cmp/cmp"
)

func TestExtractFindsCommandsInEveryKindOfCode(t *testing.T) {
	doc := "# Title\n" +
		"Run `make demo DEMO_FLAGS=--keep` or `gputopo` (the name) or `kubectl gputopo\nnodes`, not `make`.\n" + // spans, one over a line break
		"\n" +
		"```sh\n" +
		"make test   # every tier\n" +
		"$ kubectl gputopo node n1\n" +
		"Node n1  output line\n" +
		"gputopo machine import --smi a.txt \\\n    --gpu v100 -o b.yaml\n" +
		"nvidia-smi topo -m > t.txt; gputopo machine show t.yaml 2>&1 | less\n" +
		"NCCL_X=1 gputopo simulate --trace 'gen:mixed:seed=1'\n" +
		"```\n" +
		"\n" +
		"    kubectl gputopo explain -n NS POD\n" +
		"\n" +
		"1. A step:\n\n" +
		"   ```sh\n" +
		"   gputopo version\n" +
		"   ```\n" +
		"```yaml\n" +
		"command: gputopo webhook\n" +
		"```\n"
	path := filepath.Join(t.TempDir(), "doc.md")
	if err := os.WriteFile(path, []byte(doc), 0o644); err != nil {
		t.Fatal(err)
	}
	cmds, err := Extract(path)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, c := range cmds {
		got = append(got, c.Text)
	}
	want := []string{
		"make demo DEMO_FLAGS=--keep",
		"kubectl gputopo nodes",
		"make test",
		"kubectl gputopo node n1",
		"gputopo machine import --smi a.txt --gpu v100 -o b.yaml",
		"gputopo machine show t.yaml",
		"gputopo simulate --trace gen:mixed:seed=1",
		"kubectl gputopo explain -n NS POD",
		"gputopo version",
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("extracted (-want +got):\n%s", diff)
	}
	if cmds[4].Line != 9 {
		t.Errorf("the continued command is at line %d; want 9, where it starts", cmds[4].Line)
	}
}
