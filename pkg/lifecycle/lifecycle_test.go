package lifecycle

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"
)

func TestRunnerStopsOnlyOnStop(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var r Runner
		parent, cancelParent := context.WithCancel(context.Background())
		var cause atomic.Value
		if err := r.Go(parent, func(ctx context.Context) {
			<-ctx.Done()
			cause.Store(context.Cause(ctx))
		}); err != nil {
			t.Fatal(err)
		}
		if err := r.Go(parent, func(context.Context) {}); !errors.Is(err, ErrStarted) {
			t.Fatalf("second Go: %v, want ErrStarted", err)
		}
		cancelParent()
		synctest.Wait()
		select {
		case <-r.Done():
			t.Fatal("the run ended with its parent context; only Stop may end it")
		default:
		}
		r.Stop(context.Background())
		r.Stop(context.Background()) // idempotent
		if got := cause.Load(); got != ErrStop {
			t.Fatalf("cause = %v, want ErrStop", got)
		}
	})
}

func TestRunnerNeverStarted(t *testing.T) {
	var r Runner
	r.Stop(context.Background()) // must not block or panic
	if r.Done() != nil {
		t.Fatal("Done before Go should be nil")
	}
}

func TestTickerPeriodKickMoreAndFinal(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var passes, batches atomic.Int32
		batches.Store(3) // the first pass finds three batches' worth
		tk := &Ticker{Name: "test", Every: time.Second, Final: true,
			Log: slog.New(slog.NewTextHandler(io.Discard, nil)),
			Pass: func(context.Context) (bool, error) {
				passes.Add(1)
				return batches.Add(-1) > 0, nil
			}}
		if err := tk.Start(context.Background()); err != nil {
			t.Fatal(err)
		}
		synctest.Wait()
		if got := passes.Load(); got != 3 {
			t.Fatalf("passes at start = %d, want 3 (one per full batch)", got)
		}
		time.Sleep(time.Second)
		synctest.Wait()
		if got := passes.Load(); got != 4 {
			t.Fatalf("passes after one period = %d, want 4", got)
		}
		tk.Kick()
		synctest.Wait()
		if got := passes.Load(); got != 5 {
			t.Fatalf("passes after a kick = %d, want 5", got)
		}
		tk.Stop(context.Background())
		if got := passes.Load(); got != 6 {
			t.Fatalf("passes after stop = %d, want 6 (the final pass)", got)
		}
		tk.Stop(context.Background())
	})
}

func TestTickerPassIsNotCutByStop(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		release := make(chan struct{})
		var cut atomic.Bool
		tk := &Ticker{Name: "test", Every: time.Hour, Log: slog.New(slog.NewTextHandler(io.Discard, nil)),
			Pass: func(ctx context.Context) (bool, error) {
				select {
				case <-release:
				case <-ctx.Done():
					cut.Store(true)
				}
				return false, nil
			}}
		if err := tk.Start(context.Background()); err != nil {
			t.Fatal(err)
		}
		synctest.Wait()
		stopped := make(chan struct{})
		go func() { tk.Stop(context.Background()); close(stopped) }()
		synctest.Wait()
		select {
		case <-stopped:
			t.Fatal("Stop returned while a pass was still running")
		default:
		}
		close(release)
		<-stopped
		if cut.Load() {
			t.Fatal("the pass's context was canceled by Stop")
		}
	})
}

type rec struct {
	name    string
	log     *[]string
	failing bool
}

func (r rec) Start(context.Context) error {
	if r.failing {
		return errors.New(r.name + " cannot start")
	}
	*r.log = append(*r.log, "start "+r.name)
	return nil
}
func (r rec) Stop(context.Context) { *r.log = append(*r.log, "stop "+r.name) }

func TestStartAllStopsWhatStartedWhenOneFails(t *testing.T) {
	var log []string
	err := StartAll(context.Background(), rec{"a", &log, false}, rec{"b", &log, false}, rec{"c", &log, true})
	if err == nil {
		t.Fatal("StartAll succeeded with a failing service")
	}
	want := []string{"start a", "start b", "stop b", "stop a"}
	if len(log) != len(want) {
		t.Fatalf("log = %v, want %v", log, want)
	}
	for i := range want {
		if log[i] != want[i] {
			t.Fatalf("log = %v, want %v", log, want)
		}
	}
}
