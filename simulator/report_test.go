package simulator

import (
	"bytes"
	"encoding/xml"
	"io"
	"strings"
	"testing"
)

func TestReportTableAndSVG(t *testing.T) {
	rs, err := Run(Config{Nodes: mustCluster(t, "dgx1-v100=1"), Jobs: mustJobs(t, TraceHeader+"\n"+
		"single,0,1000,1,data\nquad,0,1000,4,model\npair,0,1000,2,model\n")})
	if err != nil {
		t.Fatal(err)
	}
	var tbl bytes.Buffer
	if err := WriteTable(&tbl, rs); err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(tbl.String()), "\n")
	if len(lines) != 2+len(PolicyNames) {
		t.Fatalf("table has %d lines, want header, rule and one row per policy:\n%s", len(lines), tbl.String())
	}
	if !strings.Contains(lines[4], "first-fit") || !strings.Contains(lines[4], "50.0%") {
		t.Errorf("first-fit row %q: want its 50.0%% NVLink share", lines[4])
	}
	var pl bytes.Buffer
	if err := WritePlacements(&pl, rs); err != nil {
		t.Fatal(err)
	}
	rows := strings.Split(strings.TrimSpace(pl.String()), "\n")
	if len(rows) != 1+3*len(PolicyNames) {
		t.Fatalf("placements has %d lines, want a header and 3 jobs per policy:\n%s", len(rows), pl.String())
	}
	if want := "first-fit,quad,0,4,model,dgx1-v100-0,dgx1-v100,1 2 3 4,cross-socket,10"; !strings.Contains(pl.String(), want) {
		t.Errorf("placements lack first fit's quad on GPUs 1-4 (%q):\n%s", want, pl.String())
	}
	var svg bytes.Buffer
	if err := WriteSVG(&svg, "t <&>", rs); err != nil {
		t.Fatal(err)
	}
	// Well-formed XML, one polyline per policy.
	dec := xml.NewDecoder(&svg)
	lines2 := 0
	for {
		tok, err := dec.Token()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatalf("SVG is not well-formed XML: %v", err)
		}
		if se, ok := tok.(xml.StartElement); ok && se.Name.Local == "polyline" {
			lines2++
		}
	}
	if lines2 != len(rs) {
		t.Errorf("%d polylines, want %d", lines2, len(rs))
	}
}
