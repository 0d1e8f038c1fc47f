// Command docsplice replaces generated sections of a Markdown file, so that
// `make bench` and `make bench-scheduler` regenerate docs/benchmarks.md
// from the run that just happened. A section is the text between
//
//	<!-- begin NAME -->
//	<!-- end NAME -->
//
// Usage: docsplice -doc FILE NAME=PATH [NAME=text:PATH ...]; "text:" fences
// the content as a code block. A missing marker is an error: the document,
// not the tool, decides where results go.
package main

import (
	"flag"
	"fmt"
	"os"
	"strings"
)

func main() {
	doc := flag.String("doc", "", "Markdown file to update in place")
	flag.Parse()
	if err := run(*doc, flag.Args()); err != nil {
		fmt.Fprintln(os.Stderr, "docsplice:", err)
		os.Exit(1)
	}
}

func run(doc string, specs []string) error {
	if doc == "" || len(specs) == 0 {
		return fmt.Errorf("usage: docsplice -doc FILE NAME=PATH [NAME=text:PATH ...]")
	}
	b, err := os.ReadFile(doc)
	if err != nil {
		return err
	}
	text := string(b)
	for _, s := range specs {
		name, path, ok := strings.Cut(s, "=")
		if !ok || name == "" {
			return fmt.Errorf("argument %q: want NAME=PATH", s)
		}
		fence := strings.HasPrefix(path, "text:")
		path = strings.TrimPrefix(path, "text:")
		content, err := os.ReadFile(path)
		if err != nil {
			return fmt.Errorf("section %s: %w", name, err)
		}
		body := strings.TrimRight(string(content), "\n") + "\n"
		if fence {
			body = "```text\n" + body + "```\n"
		}
		if text, err = splice(text, name, body); err != nil {
			return err
		}
	}
	return os.WriteFile(doc, []byte(text), 0o644)
}

func splice(text, name, body string) (string, error) {
	begin, end := "<!-- begin "+name+" -->\n", "<!-- end "+name+" -->"
	i := strings.Index(text, begin)
	j := strings.Index(text, end)
	if i < 0 || j < i {
		return "", fmt.Errorf("section %s: markers %q and %q not found in order", name, strings.TrimSpace(begin), end)
	}
	return text[:i+len(begin)] + body + text[j:], nil
}
