package kubectlplugin

import (
	"io"
	"regexp"
	"strings"
	"unicode/utf8"
)

// table aligns tab-separated lines like text/tabwriter, but measures cells
// without their colour escape codes, so that coloured and plain cells line
// up.
type table struct {
	w    io.Writer
	rows [][]string
}

func newTable(w io.Writer) *table { return &table{w: w} }

// Write takes one or more tab-separated, newline-terminated lines.
func (t *table) Write(b []byte) (int, error) {
	for _, line := range strings.SplitAfter(string(b), "\n") {
		if line = strings.TrimSuffix(line, "\n"); line != "" {
			t.rows = append(t.rows, strings.Split(line, "\t"))
		}
	}
	return len(b), nil
}

var ansi = regexp.MustCompile("\x1b\\[[0-9;]*m")

func visible(s string) int { return utf8.RuneCountInString(ansi.ReplaceAllString(s, "")) }

// Flush writes the rows with each column padded to its widest cell plus
// two spaces; the last cell of a row is not padded.
func (t *table) Flush() error {
	var width []int
	for _, r := range t.rows {
		for i, c := range r {
			if i >= len(width) {
				width = append(width, 0)
			}
			width[i] = max(width[i], visible(c))
		}
	}
	var b strings.Builder
	for _, r := range t.rows {
		for i, c := range r {
			b.WriteString(c)
			if i < len(r)-1 {
				b.WriteString(strings.Repeat(" ", width[i]-visible(c)+2))
			}
		}
		b.WriteByte('\n')
	}
	t.rows = nil
	_, err := io.WriteString(t.w, b.String())
	return err
}
