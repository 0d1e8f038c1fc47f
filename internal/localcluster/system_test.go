package localcluster

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"
)

func TestParseMode(t *testing.T) {
	for in, want := range map[string]Mode{"": ModeExtender, "extender": ModeExtender, "plugin": ModePlugin} {
		got, err := ParseMode(in)
		if err != nil || got != want {
			t.Errorf("ParseMode(%q) = %q, %v; want %q", in, got, err, want)
		}
	}
	_, err := ParseMode("Plugin")
	if err == nil || !strings.Contains(err.Error(), `"Plugin"`) || !strings.Contains(err.Error(), "extender") {
		t.Errorf("ParseMode(Plugin) = %v; want an error naming the value and the modes", err)
	}
}

func TestStartDeciderRefusesUnknownMode(t *testing.T) {
	d, err := StartDecider(DeciderOptions{Mode: "inprocess", Dir: t.TempDir()})
	if err == nil || !strings.Contains(err.Error(), `"inprocess"`) {
		t.Fatalf("StartDecider(mode inprocess) = %v, %v; want an error naming the mode", d, err)
	}
}

func TestRunning(t *testing.T) {
	r := Go(context.Background(), func(ctx context.Context) error {
		<-ctx.Done()
		return ctx.Err()
	})
	if exited, _ := r.Exited(); exited {
		t.Fatal("exited before Stop")
	}
	if err := r.Stop(); err != nil {
		t.Errorf("Stop of a component that returned context.Canceled = %v; want nil", err)
	}
	if exited, _ := r.Exited(); !exited {
		t.Error("not exited after Stop")
	}
	if err := r.Stop(); err != nil {
		t.Errorf("second Stop = %v", err)
	}

	boom := errors.New("boom")
	r = Go(context.Background(), func(context.Context) error { return boom })
	select {
	case <-r.Done():
	case <-time.After(10 * time.Second):
		t.Fatal("Done not closed")
	}
	if exited, err := r.Exited(); !exited || !errors.Is(err, boom) {
		t.Errorf("Exited = %v, %v; want true, boom", exited, err)
	}
	if err := r.Stop(); !errors.Is(err, boom) {
		t.Errorf("Stop = %v; want what the component returned", err)
	}
	var none *Running
	if err := none.Stop(); err != nil {
		t.Errorf("Stop on nil = %v", err)
	}
}
