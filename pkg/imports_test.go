// Package pkg_test holds checks on the assay.dev/pkg module as a whole.
package pkg_test

import (
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

const module = "assay.dev/pkg"

// devkit is the dev kit's import path: its modules (devkit, devkit/devpg,
// devkit/testenv) are for tests and tools, never for what ships.
const devkit = module + "/devkit"

// sideways are imports one package of the module must not make of a
// sibling: a setting's default lives with the concept or in a leaf
// package, not in the package that happens to use it first.
var sideways = map[string][]string{
	module + "/config": {module + "/store"},
	// The API's wire types are a leaf every client imports: the standard
	// library alone.
	module + "/api": {module, "assay.dev/services"},
}

// nonTestImports walks the module below dir, leaving out the modules nested
// in it (the dev kit's), and gives each package's non-test imports by file.
func nonTestImports(t *testing.T, dir string) map[string]map[string][]string {
	t.Helper()
	pkgs := map[string]map[string][]string{}
	fset := token.NewFileSet()
	err := filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			name := d.Name()
			if path != dir && (name == "testdata" || strings.HasPrefix(name, ".") || strings.HasPrefix(name, "_")) {
				return filepath.SkipDir
			}
			if path != dir {
				if _, err := os.Stat(filepath.Join(path, "go.mod")); err == nil {
					return filepath.SkipDir // a module of its own
				}
			}
			return nil
		}
		if !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
			return nil
		}
		f, err := parser.ParseFile(fset, path, nil, parser.ImportsOnly)
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(dir, filepath.Dir(path))
		if err != nil {
			return err
		}
		pkg := module
		if rel != "." {
			pkg += "/" + filepath.ToSlash(rel)
		}
		if pkgs[pkg] == nil {
			pkgs[pkg] = map[string][]string{}
		}
		file := filepath.ToSlash(filepath.Join(rel, filepath.Base(path)))
		for _, imp := range f.Imports {
			p, err := strconv.Unquote(imp.Path.Value)
			if err != nil {
				return err
			}
			pkgs[pkg][file] = append(pkgs[pkg][file], p)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return pkgs
}

func under(path, prefix string) bool {
	return path == prefix || strings.HasPrefix(path, prefix+"/")
}

// No non-test file of assay.dev/pkg imports the dev kit, so the module
// needs it only for its tests; and no package imports a sibling the
// sideways table forbids.
func TestImports(t *testing.T) {
	t.Parallel()
	pkgs := nonTestImports(t, ".")
	for pkg := range sideways {
		if pkgs[pkg] == nil {
			t.Fatalf("%s not found: the walk no longer sees the module", pkg)
		}
	}
	for pkg, files := range pkgs {
		for file, imps := range files {
			for _, imp := range imps {
				if under(imp, devkit) {
					t.Errorf("%s imports %s: only a _test.go file of assay.dev/pkg may use the dev kit", file, imp)
				}
				for _, bad := range sideways[pkg] {
					if under(imp, bad) {
						t.Errorf("%s imports %s sideways: move what it needs to the package that owns it or to a leaf package", file, imp)
					}
				}
			}
		}
	}
}
