// Package doccommands runs the commands that README.md and docs/ quote:
// every `make X`, `gputopo ...` and `kubectl gputopo ...` found in a code
// span, a fenced block or an indented block. make targets must exist in the
// Makefile; gputopo and kubectl gputopo commands are run with the binaries
// built from this checkout, for real when they are quick and touch nothing
// outside a scratch directory, else with --help appended, which parses
// every flag and resolves every subcommand. No API server.
package doccommands

import (
	"bufio"
	"fmt"
	"os"
	"regexp"
	"strings"
)

// Command is one documented command line.
type Command struct {
	// File and Line say where it is quoted.
	File string
	Line int
	// Text is the command as quoted (continuations joined, prompt,
	// comment and environment assignments removed).
	Text string
	// Words are Text split as a shell would (no expansion).
	Words []string
}

func (c Command) String() string { return fmt.Sprintf("%s:%d: %s", c.File, c.Line, c.Text) }

// Extract finds the commands quoted in one Markdown file.
func Extract(path string) ([]Command, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var out []Command
	add := func(line int, text string) {
		for _, seg := range segments(text) {
			words, err := splitWords(seg)
			if err != nil || len(words) == 0 {
				continue
			}
			for len(words) > 0 && isAssignment(words[0]) {
				words = words[1:]
			}
			if len(words) == 0 || !isCommand(words) {
				continue
			}
			out = append(out, Command{File: path, Line: line, Text: strings.Join(words, " "), Words: words})
		}
	}
	lines := strings.Split(string(data), "\n")
	fence := "" // the open fence's marker, "" outside a fenced block
	fenceIndent := 0
	var para []string // the prose paragraph so far, for code spans
	paraLine := 0
	flush := func() {
		if len(para) > 0 {
			for _, span := range codeSpans(strings.Join(para, "\n")) {
				add(paraLine+span.line, span.text)
			}
		}
		para = nil
	}
	prevBlank := true
	inIndented := false
	for i := 0; i < len(lines); i++ {
		raw := lines[i]
		trimmed := strings.TrimLeft(raw, " ")
		indent := len(raw) - len(trimmed)
		if fence != "" {
			if strings.HasPrefix(trimmed, fence) && strings.TrimSpace(strings.TrimLeft(trimmed, fence[:1])) == "" {
				fence = ""
				continue
			}
			text, start := joinContinuation(lines, &i, fenceIndent)
			add(start+1, commandLine(text))
			continue
		}
		if m := fenceRE.FindStringSubmatch(raw); m != nil {
			flush()
			fence, fenceIndent = m[2], len(m[1])
			prevBlank = false
			continue
		}
		if strings.TrimSpace(raw) == "" {
			flush()
			prevBlank, inIndented = true, false
			continue
		}
		if indent >= 4 && (prevBlank || inIndented) && !listItemRE.MatchString(trimmed) {
			flush()
			inIndented = true
			text, start := joinContinuation(lines, &i, indent)
			add(start+1, commandLine(text))
			prevBlank = false
			continue
		}
		inIndented, prevBlank = false, false
		if len(para) == 0 {
			paraLine = i + 1
		}
		para = append(para, raw)
	}
	flush()
	return out, nil
}

var (
	fenceRE    = regexp.MustCompile("^( {0,12})(```+|~~~+)")
	listItemRE = regexp.MustCompile(`^([-*+]|\d+\.) `)
	assignRE   = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*=`)
)

// joinContinuation returns the line at *i with the lines that a trailing
// backslash continues, dedented by indent, and moves *i to the last one.
func joinContinuation(lines []string, i *int, indent int) (string, int) {
	start := *i
	dedent := func(s string) string {
		for n := 0; n < indent && strings.HasPrefix(s, " "); n++ {
			s = s[1:]
		}
		return s
	}
	text := dedent(lines[*i])
	for strings.HasSuffix(text, "\\") && *i+1 < len(lines) {
		*i++
		text = strings.TrimSuffix(text, "\\") + " " + strings.TrimSpace(lines[*i])
	}
	return text, start
}

// commandLine drops a shell prompt and a trailing comment.
func commandLine(s string) string {
	s = strings.TrimSpace(s)
	s = strings.TrimPrefix(s, "$ ")
	if i := commentStart(s); i >= 0 {
		s = s[:i]
	}
	return strings.TrimSpace(s)
}

// commentStart is the index of an unquoted " #", or -1.
func commentStart(s string) int {
	quote := byte(0)
	for i := 0; i < len(s); i++ {
		switch c := s[i]; {
		case quote != 0:
			if c == quote {
				quote = 0
			}
		case c == '\'' || c == '"':
			quote = c
		case c == '#' && (i == 0 || s[i-1] == ' ' || s[i-1] == '\t'):
			return i
		}
	}
	return -1
}

type span struct {
	line int // lines after the paragraph's first
	text string
}

// codeSpans are the paragraph's code spans, whitespace collapsed (a span
// may run over a line break).
func codeSpans(p string) []span {
	var out []span
	for i := 0; i < len(p); i++ {
		if p[i] != '`' {
			continue
		}
		n := 1
		for i+n < len(p) && p[i+n] == '`' {
			n++
		}
		marker := strings.Repeat("`", n)
		end := strings.Index(p[i+n:], marker)
		if end < 0 {
			break
		}
		body := p[i+n : i+n+end]
		out = append(out, span{line: strings.Count(p[:i], "\n"), text: strings.Join(strings.Fields(body), " ")})
		i += n + end + n - 1
	}
	return out
}

// segments splits a command line at unquoted ;, &&, || and |, and drops
// redirections (> FILE, < FILE, 2>&1).
func segments(s string) []string {
	var out []string
	var cur strings.Builder
	quote := byte(0)
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case quote != 0:
			if c == quote {
				quote = 0
			}
			cur.WriteByte(c)
		case c == '\'' || c == '"':
			quote = c
			cur.WriteByte(c)
		case c == ';' || c == '|' || c == '&':
			if c == '&' && i > 0 && s[i-1] == '>' {
				cur.WriteByte(c) // 2>&1
				continue
			}
			out = append(out, cur.String())
			cur.Reset()
			if i+1 < len(s) && (s[i+1] == '|' || s[i+1] == '&') {
				i++
			}
		default:
			cur.WriteByte(c)
		}
	}
	out = append(out, cur.String())
	for i, seg := range out {
		out[i] = strings.TrimSpace(redirectRE.ReplaceAllString(seg, " "))
	}
	return out
}

var redirectRE = regexp.MustCompile(`\s\d?[<>]{1,2}(&\d|\s*\S+)`)

// splitWords splits like a shell: whitespace separates words, quotes group
// and are removed. Nothing is expanded.
func splitWords(s string) ([]string, error) {
	var words []string
	var cur strings.Builder
	in, quote := false, byte(0)
	sc := bufio.NewScanner(strings.NewReader(s))
	sc.Split(bufio.ScanBytes)
	for sc.Scan() {
		c := sc.Bytes()[0]
		switch {
		case quote != 0:
			if c == quote {
				quote = 0
			} else {
				cur.WriteByte(c)
			}
		case c == '\'' || c == '"':
			quote, in = c, true
		case c == ' ' || c == '\t':
			if in {
				words = append(words, cur.String())
				cur.Reset()
				in = false
			}
		default:
			cur.WriteByte(c)
			in = true
		}
	}
	if quote != 0 {
		return nil, fmt.Errorf("unterminated quote in %q", s)
	}
	if in {
		words = append(words, cur.String())
	}
	return words, nil
}

func isAssignment(w string) bool { return assignRE.MatchString(w) }

// isCommand: make X, gputopo X (also as bin/gputopo) or kubectl gputopo.
func isCommand(words []string) bool {
	switch words[0] {
	case "make", "gputopo", "bin/gputopo", "./bin/gputopo":
		// A lone word is the tool's name in prose (`gputopo`).
		return len(words) > 1
	case "kubectl":
		return len(words) > 1 && words[1] == "gputopo"
	}
	return false
}
