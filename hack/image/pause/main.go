// Command pause is the pod sandbox process of the image `make image` writes
// as _out/pause-image.tar: it holds the pod's namespaces, reaps children
// it inherits as PID 1, and exits on SIGINT or SIGTERM. It is built
// static (CGO_ENABLED=0) and is the whole image, like Kubernetes'
// registry.k8s.io/pause, which the runtime tests cannot pull.
package main

import (
	"os"
	"os/signal"
	"syscall"
)

func main() {
	stop := make(chan os.Signal, 1)
	signal.Notify(stop, syscall.SIGINT, syscall.SIGTERM)
	children := make(chan os.Signal, 1)
	signal.Notify(children, syscall.SIGCHLD)
	for {
		select {
		case <-stop:
			return
		case <-children:
			for {
				var ws syscall.WaitStatus
				if pid, err := syscall.Wait4(-1, &ws, syscall.WNOHANG, nil); pid <= 0 || err != nil {
					break
				}
			}
		}
	}
}
