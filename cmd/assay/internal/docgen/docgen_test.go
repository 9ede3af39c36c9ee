package main

import (
	"bytes"
	"go/scanner"
	"go/token"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// root is the repository these tests run in.
const root = "../../../.."

// The pages make docs writes are what it would write now: the
// configuration reference matches the settings the code reads, and the
// operations table the OpenAPI description.
func TestGeneratedPagesAreCurrent(t *testing.T) {
	pages, err := generate(root)
	if err != nil {
		t.Fatal(err)
	}
	for _, page := range sortedKeys(pages) {
		got, err := os.ReadFile(filepath.Join(root, page))
		if err != nil {
			t.Fatal(err)
		}
		if want := pages[page]; !bytes.Equal(got, want) {
			t.Errorf("%s is not what make docs writes; run make docs. First difference:\n%s", page, firstDifference(got, want))
		}
	}
}

// firstDifference shows the first line where got and want differ.
func firstDifference(got, want []byte) string {
	g, w := strings.Split(string(got), "\n"), strings.Split(string(want), "\n")
	for i := 0; i < max(len(g), len(w)); i++ {
		var gl, wl string
		if i < len(g) {
			gl = g[i]
		}
		if i < len(w) {
			wl = w[i]
		}
		if gl != wl {
			return "line " + strconv.Itoa(i+1) + "\n  the page: " + gl + "\n  make docs: " + wl
		}
	}
	return "none"
}

// Every ASSAY_ variable the code names in full as a string literal (what
// it hands a getenv), or as the prefix of a name it makes, outside the
// tests, is a row of docs/configuration.md; so is every one a test reads
// for itself. A setting added to the code and not to the reference fails
// here.
func TestEveryVariableTheCodeNamesIsInTheReference(t *testing.T) {
	doc, err := os.ReadFile(filepath.Join(root, configurationPage))
	if err != nil {
		t.Fatal(err)
	}
	ss, err := readSettings(root)
	if err != nil {
		t.Fatal(err)
	}
	inDoc := func(name string) bool { return bytes.Contains(doc, []byte("\n| `"+name+"`")) }
	named := map[string]string{}
	err = walkGo(root, func(path string, src []byte) error {
		if strings.HasSuffix(path, "_test.go") {
			return nil
		}
		fset := token.NewFileSet()
		var s scanner.Scanner
		s.Init(fset.AddFile(path, -1, len(src)), src, nil, 0)
		for {
			pos, tok, lit := s.Scan()
			if tok == token.EOF {
				return nil
			}
			if tok != token.STRING {
				continue
			}
			v, err := strconv.Unquote(lit)
			if err != nil || !settingName.MatchString(v) {
				continue
			}
			if strings.HasSuffix(v, "_") {
				if prefixed[v] == "" {
					t.Errorf("%s: the code makes names from %q, which docgen's prefixed does not name", fset.Position(pos), v)
					continue
				}
				v = prefixed[v]
			}
			if named[v] == "" {
				named[v] = fset.Position(pos).String()
			}
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range ss.list {
		if named[s.name] == "" {
			named[s.name] = "read by " + readBy(s)
		}
	}
	if len(named) < 50 {
		t.Fatalf("found %d variables in the code: not the code this test reads", len(named))
	}
	for _, name := range sortedKeys(named) {
		if !inDoc(name) {
			t.Errorf("%s (%s) is not in %s: add it to what the binaries read (a Vars entry, or docgen's settings.md for a command's own) and run make docs", name, named[name], configurationPage)
		}
	}
	// And the reverse: the reference names nothing no code reads.
	for _, line := range strings.Split(string(doc), "\n") {
		name, ok := strings.CutPrefix(line, "| `ASSAY_")
		if !ok {
			continue
		}
		name, _, _ = strings.Cut(name, "`")
		if ss.byName["ASSAY_"+name] == nil {
			t.Errorf("%s lists ASSAY_%s, which no binary reads", configurationPage, name)
		}
	}
}

// Every operation of schemas/openapi.yaml is listed in docs/api.md.
func TestAPIPageListsEveryOperation(t *testing.T) {
	spec, err := os.ReadFile(filepath.Join(root, "schemas/openapi.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	page, err := os.ReadFile(filepath.Join(root, apiPage))
	if err != nil {
		t.Fatal(err)
	}
	_, _, ops, err := operationsByTag(spec)
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, tagged := range ops {
		for _, op := range tagged {
			n++
			if !bytes.Contains(page, []byte("| `"+op.method+" "+op.path+"` |")) {
				t.Errorf("%s does not list %s %s (%s); run make docs", apiPage, op.method, op.path, op.id)
			}
		}
	}
	if n < 20 {
		t.Fatalf("the description has %d operations: not the description this test reads", n)
	}
}

// settings.md describes only variables some binary reads, and every
// variable without a help line of its own.
func TestEverySettingHasAMeaning(t *testing.T) {
	ss, err := readSettings(root)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := configuration(ss); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"ASSAY_REGION", "ASSAY_DATABASE_URL", "ASSAY_LEASE_TTL", "ASSAY_URL", "ASSAY_TEST_DATABASE_URL"} {
		if ss.byName[name] == nil {
			t.Errorf("%s is not found among what the binaries read: the reading of the code is broken", name)
		}
	}
	for name, by := range map[string]string{"ASSAY_SHED": "ingress", "ASSAY_LEASE_TTL": "classifier", "ASSAY_PUBLISH_DEADLINE": "committer",
		"ASSAY_LEDGER_GROUP_WAIT": "ledger", "ASSAY_URL": "assay", "ASSAY_MODEL": "assay-dev", "ASSAY_TEST_NATS_URL": "tests"} {
		if s := ss.byName[name]; s == nil || !s.readBy(by) {
			t.Errorf("%s is not found read by %s", name, by)
		}
	}
}
