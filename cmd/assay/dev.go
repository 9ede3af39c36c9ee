//go:build !operator

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
)

// devPort is the first cell's port under assay dev --serve; the others
// follow it. Away from the ports other dev servers take first.
const devPort = 18080

// dev runs `assay dev [--serve [--port N] [--fresh]] [-v]`: the cells of
// every region in one process on embedded defaults, the demo unless
// --serve.
func dev(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("assay dev", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	serve := fs.Bool("serve", false, "keep the cells running with the HTTP API up until interrupted")
	verbose := fs.Bool("v", false, "print the services' decision log to stderr")
	port := fs.Int("port", devPort, "--serve: the first cell's port on 127.0.0.1; the next cells take the next ports (a taken one: a free port)")
	fresh := fs.Bool("fresh", false, "--serve: new tokens, not the ones kept from the last run")
	if err := fs.Parse(args); err != nil {
		return configError{err}
	}
	if fs.NArg() > 0 {
		return configError{fmt.Errorf("unexpected argument %q", fs.Arg(0))}
	}
	if *port < 1 || *port > 65535-8 {
		return configError{fmt.Errorf("--port: %d is not a port", *port)}
	}
	o := cell.DevOptions{LogTo: io.Discard, Level: slog.LevelInfo}
	if *verbose {
		o.LogTo = os.Stderr
	}
	var logPath string
	if *serve {
		for i := range 8 {
			o.Addrs = append(o.Addrs, "127.0.0.1:"+strconv.Itoa(*port+i))
		}
		if !*fresh {
			o.Secrets = devSecretsFile()
		}
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
	}
	e, err := cell.StartDev(ctx, o)
	if e != nil {
		defer e.Stop()
	}
	if err != nil {
		return err
	}
	if !*serve {
		return runDemo(ctx, e, os.Stdout)
	}
	if logPath != "" {
		fmt.Printf("decision log: %s (-v prints it here instead)\n\n", logPath)
	}
	e.PrintEndpoints(os.Stdout)
	for i, r := range e.Regions {
		if want := "127.0.0.1:" + strconv.Itoa(*port+i); !strings.HasSuffix(e.Cells[r].URL, want) {
			fmt.Printf("\nnote: %s was taken, so cell %s listens on %s\n", want, r, e.Cells[r].URL)
		}
	}
	<-ctx.Done()
	fmt.Println("\nstopping…")
	return nil
}

// devSecretsFile keeps assay dev --serve's tokens from one run to the
// next, in the user's cache directory ("" when there is none: new tokens
// each run).
func devSecretsFile() string {
	dir, err := os.UserCacheDir()
	if err != nil {
		return ""
	}
	return filepath.Join(dir, "assay", "dev-serve.json")
}
