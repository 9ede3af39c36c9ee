package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"

	"assay.dev/cmd/assay/internal/cell"
)

// dev runs `assay dev [--serve] [-v]`: the cells of every region in one
// process on embedded defaults, the demo unless --serve.
func dev(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("assay dev", flag.ContinueOnError)
	serve := fs.Bool("serve", false, "keep the cells running with the HTTP API up until interrupted")
	verbose := fs.Bool("v", false, "print the services' decision log to stderr")
	if err := fs.Parse(args); err != nil {
		return configError{err}
	}
	o := cell.DevOptions{LogTo: io.Discard, Level: slog.LevelInfo}
	if *verbose || *serve {
		o.LogTo = os.Stderr
	}
	e, err := cell.StartDev(ctx, o)
	if e != nil {
		defer e.Stop()
	}
	if err != nil {
		return err
	}
	if *serve {
		e.PrintEndpoints(os.Stdout)
		<-ctx.Done()
		fmt.Println("\nstopping…")
		return nil
	}
	return runDemo(ctx, e, os.Stdout)
}
