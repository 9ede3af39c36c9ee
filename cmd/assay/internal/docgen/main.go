// Command docgen writes the pages of docs/ that are made from the code:
// docs/configuration.md from the settings the binaries read (each
// service's config.Load settings and Vars, and what the assay command,
// its dev mode, the chaos harness and the tests read themselves), and the
// operations table of docs/api.md from schemas/openapi.yaml. make docs
// runs it; its tests fail when a page is stale or a variable the code
// reads is not in the reference.
package main

import (
	"bytes"
	"errors"
	"flag"
	"fmt"
	"os"
	"path/filepath"
)

func main() {
	root := flag.String("root", "../..", "the repository's root")
	flag.Parse()
	pages, err := generate(*root)
	if err != nil {
		fmt.Fprintln(os.Stderr, "docgen:", err)
		os.Exit(1)
	}
	for _, page := range sortedKeys(pages) {
		path := filepath.Join(*root, page)
		old, _ := os.ReadFile(path)
		if bytes.Equal(old, pages[page]) {
			fmt.Printf("%s: current\n", page)
			continue
		}
		if err := os.WriteFile(path, pages[page], 0o644); err != nil {
			fmt.Fprintln(os.Stderr, "docgen:", err)
			os.Exit(1)
		}
		fmt.Printf("%s: written\n", page)
	}
}

// generate makes every generated page, by its path under root.
func generate(root string) (map[string][]byte, error) {
	ss, err := readSettings(root)
	if err != nil {
		return nil, err
	}
	conf, err := configuration(ss)
	if err != nil {
		return nil, err
	}
	api, err := os.ReadFile(filepath.Join(root, apiPage))
	if err != nil {
		return nil, err
	}
	spec, err := os.ReadFile(filepath.Join(root, "schemas/openapi.yaml"))
	if err != nil {
		return nil, err
	}
	api, err = withOperations(api, spec)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", apiPage, err)
	}
	return map[string][]byte{configurationPage: conf, apiPage: api}, nil
}

const (
	configurationPage = "docs/configuration.md"
	apiPage           = "docs/api.md"
)

func joinErrs(errs []error) error {
	return errors.Join(errs...)
}
