package demo

import (
	"io"

	"github.com/gputopo/gputopo/internal/picture"
)

// WriteSVG draws every node's GPUs and links and the pods placed on them
// (picture.WriteSVG).
func WriteSVG(w io.Writer, nodes []NodeView, pods []PodView) error {
	return picture.WriteSVG(w, nodes, pods)
}
