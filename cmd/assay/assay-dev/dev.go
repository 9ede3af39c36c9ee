package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"assay.dev/cmd/assay/internal/cell"
	"assay.dev/cmd/assay/internal/cli"
)

// devPort is the first cell's port under assay-dev dev --serve; the others
// follow it. Away from the ports other dev servers take first.
const devPort = 18080

// dev runs `assay-dev dev [--serve [--port N] [--fresh]] [-v]`: the cells of
// every region in one process on embedded defaults, the demo unless
// --serve.
func dev(ctx context.Context, args []string, stdout io.Writer) error {
	fs := flag.NewFlagSet("assay-dev dev", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	serve := fs.Bool("serve", false, "keep the cells running with the HTTP API up until interrupted")
	verbose := fs.Bool("v", false, "print the services' decision log to stderr")
	port := fs.Int("port", devPort, "--serve: the first cell's port on 127.0.0.1; the next cells take the next ports (a taken one: a free port)")
	fresh := fs.Bool("fresh", false, "--serve: new tokens, not the ones kept from the last run")
	if err := fs.Parse(args); err != nil {
		return cli.ConfigError{Err: err}
	}
	if fs.NArg() > 0 {
		return cli.ConfigError{Err: fmt.Errorf("unexpected argument %q", fs.Arg(0))}
	}
	if *port < 1 || *port > 65535-8 {
		return cli.ConfigError{Err: fmt.Errorf("--port: %d is not a port", *port)}
	}
	if err := leftoverExport(); err != nil {
		return cli.ConfigError{Err: err}
	}
	o := cell.DevOptions{LogTo: io.Discard, Level: slog.LevelInfo}
	if *verbose {
		o.LogTo = os.Stderr
	}
	if !*serve {
		e, err := cell.StartDev(ctx, o)
		if e != nil {
			defer e.Stop()
		}
		if err != nil {
			return err
		}
		return runDemo(ctx, e, stdout)
	}
	for i := range 8 {
		o.Addrs = append(o.Addrs, "127.0.0.1:"+strconv.Itoa(*port+i))
	}
	if !*fresh {
		o.Secrets = devSecretsFile()
	}
	var logPath string
	if !*verbose {
		// The decision log goes to a file, so the summary stays on
		// screen.
		f, err := os.CreateTemp("", "assay-dev-*.log")
		if err != nil {
			return err
		}
		defer f.Close()
		o.LogTo, logPath = f, f.Name()
	}
	return serveDev(ctx, o, *port, logPath, stdout)
}

// serveDev runs assay-dev dev --serve until ctx ends: the cells, and the fake
// GitHub they read diffs from and publish to.
func serveDev(ctx context.Context, o cell.DevOptions, port int, logPath string, stdout io.Writer) error {
	s, err := startServing(ctx, o, devRunFile())
	if s != nil {
		defer s.Stop()
	}
	if err != nil {
		return err
	}
	if logPath != "" {
		fmt.Fprintf(stdout, "decision log: %s (-v prints it here instead)\n\n", logPath)
	}
	s.PrintEndpoints(stdout)
	for i, r := range s.Regions {
		if want := "127.0.0.1:" + strconv.Itoa(port+i); !strings.HasSuffix(s.Cells[r].URL, want) {
			fmt.Fprintf(stdout, "\nnote: %s was taken, so cell %s listens on %s\n", want, r, s.Cells[r].URL)
		}
	}
	s.printCommands(stdout)
	<-ctx.Done()
	fmt.Fprintln(stdout, "\nstopping…")
	return nil
}

// devSecretsFile keeps assay-dev dev --serve's tokens from one run to the
// next, in the user's cache directory ("" when there is none: new tokens
// each run).
func devSecretsFile() string {
	dir, err := os.UserCacheDir()
	if err != nil {
		return ""
	}
	return filepath.Join(dir, "assay", "dev-serve.json")
}
