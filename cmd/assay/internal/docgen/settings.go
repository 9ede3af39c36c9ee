package main

import (
	"bufio"
	_ "embed"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"

	"assay.dev/pkg/config"
	"assay.dev/pkg/githubapp"
	"assay.dev/services/classifier"
	"assay.dev/services/committer"
	"assay.dev/services/ingress"
	"assay.dev/services/ledger"
)

// varsOf are the settings each package's FromEnv reads (its Vars, which
// the package's own test holds to what FromEnv asks for), by the name a
// service's main or a caller of FromEnv knows the package by.
var varsOf = map[string][]config.Var{
	"ingress":    ingress.Vars,
	"classifier": classifier.Vars,
	"committer":  committer.Vars,
	"ledger":     ledger.Vars,
	"githubapp":  githubapp.Vars,
}

// readerOf names, by directory, the binary whose source reads the
// environment itself (os.Getenv, os.LookupEnv, envOr). The services read
// theirs through config.Load and their Vars, found from their mains. A
// directory not here whose code reads an ASSAY_ variable stops the
// generator: name its binary here.
var readerOf = map[string]string{
	"cmd/assay":               "assay",
	"cmd/assay/assay-dev":     "assay-dev",
	"cmd/assay/internal/cell": "assay-dev",
	"cmd/chaos":               "chaos",
	"pkg/devkit/testenv":      "tests",
}

// readers is the order the reference names readers in.
var readers = []string{"ingress", "classifier", "committer", "ledger", "assay", "assay-dev", "chaos", "tests"}

// prefixed are the variables whose names the code makes from a prefix,
// each with the name the reference gives it.
var prefixed = map[string]string{
	"ASSAY_DATABASE_URL_": "ASSAY_DATABASE_URL_<CELL>",
	"ASSAY_NATS_URL_":     "ASSAY_NATS_URL_<CELL>",
}

// settingName is an ASSAY_ variable's name as the code spells it; one
// ending in _ is a prefix (prefixed).
var settingName = regexp.MustCompile(`^ASSAY_[A-Z0-9_]+$`)

// A read is one binary's reading of a variable: its default ("" when the
// code names none) and what the binary's help says of it ("" when it has
// no help line for it).
type read struct {
	by, def, usage string
}

// A setting is one variable and every reading of it.
type setting struct {
	name  string
	flag  string // the flag that mirrors it, for config.Load's settings
	reads []read
}

// readBy says whether binary by reads s.
func (s *setting) readBy(by string) bool {
	return slices.ContainsFunc(s.reads, func(r read) bool { return r.by == by })
}

// settings is every variable the binaries read, in the order first found.
type settings struct {
	list   []*setting
	byName map[string]*setting
	shared map[string]bool // the settings config.Load reads for every service
}

func (ss *settings) add(name string, r read) {
	s := ss.byName[name]
	if s == nil {
		s = &setting{name: name}
		ss.byName[name] = s
		ss.list = append(ss.list, s)
	}
	for i, old := range s.reads {
		if old.by == r.by {
			// A second reading by the same binary adds what the first lacked.
			s.reads[i].def = cmpOr(old.def, r.def)
			s.reads[i].usage = cmpOr(old.usage, r.usage)
			return
		}
	}
	s.reads = append(s.reads, r)
}

func cmpOr(a, b string) string {
	if a != "" {
		return a
	}
	return b
}

// readSettings finds every variable the binaries under root read: each
// service's config.Load settings and Vars, as its main names them, then
// what the assay command, assay-dev, the chaos harness and the tests
// read from the environment themselves.
func readSettings(root string) (*settings, error) {
	ss := &settings{byName: map[string]*setting{}, shared: map[string]bool{}}
	for _, v := range config.Shared(config.Need{Model: true}) {
		ss.shared[v.Name] = true
	}
	mains, err := filepath.Glob(filepath.Join(root, "services/*/cmd/*/main.go"))
	if err != nil {
		return nil, err
	}
	specs := map[string]serviceSpec{}
	for _, m := range mains {
		spec, err := readSpec(m)
		if err != nil {
			return nil, err
		}
		specs[spec.name] = spec
	}
	for _, name := range readers[:4] {
		spec, ok := specs[name]
		if !ok {
			return nil, fmt.Errorf("no services/%s/cmd/%s/main.go", name, name)
		}
		for _, v := range config.Shared(spec.need) {
			ss.add(v.Name, read{by: name, def: sharedDefault(v), usage: v.Usage})
		}
		for _, v := range spec.vars {
			ss.add(v.Name, read{by: name, def: v.Default, usage: v.Usage})
		}
		delete(specs, name)
	}
	for name := range specs {
		return nil, fmt.Errorf("service %s: the reference knows no such service (docgen's readers)", name)
	}
	if err := envReadsUnder(root, ss); err != nil {
		return nil, err
	}
	if err := testReads(root, ss); err != nil {
		return nil, err
	}
	flags := sharedFlags()
	for _, s := range ss.list {
		s.flag = flags[s.name]
		slices.SortStableFunc(s.reads, func(a, b read) int {
			return slices.Index(readers, a.by) - slices.Index(readers, b.by)
		})
	}
	return ss, nil
}

// sharedDefault is a shared setting's default as the reference shows it:
// "required" for one config.Load refuses to run without.
func sharedDefault(v config.Var) string {
	if v.Default == "" && strings.HasSuffix(v.Usage, "; required") {
		return "required"
	}
	return v.Default
}

// sharedFlags are the flags config.Load takes, by the variable each
// mirrors, read from the help it prints.
func sharedFlags() map[string]string {
	flags := map[string]string{}
	line := regexp.MustCompile(`^\s+--([a-z0-9-]+)\s+(ASSAY_[A-Z0-9_]+)\s`)
	sc := bufio.NewScanner(strings.NewReader(config.Usage("docgen", "", config.Need{Model: true}, nil)))
	for sc.Scan() {
		if m := line.FindStringSubmatch(sc.Text()); m != nil {
			flags[m[2]] = m[1]
		}
	}
	return flags
}

// serviceSpec is what a service's main gives host.Run: its name, the
// shared settings it needs and its own Vars.
type serviceSpec struct {
	name string
	need config.Need
	vars []config.Var
}

// readSpec reads the host.Spec literal of a service's main.
func readSpec(path string) (serviceSpec, error) {
	f, err := parser.ParseFile(token.NewFileSet(), path, nil, parser.SkipObjectResolution)
	if err != nil {
		return serviceSpec{}, err
	}
	var spec serviceSpec
	var found bool
	var errs []error
	ast.Inspect(f, func(n ast.Node) bool {
		lit, ok := n.(*ast.CompositeLit)
		if !ok || exprName(lit.Type) != "host.Spec" {
			return true
		}
		found = true
		for _, kv := range keyValues(lit) {
			switch kv.key {
			case "Name":
				spec.name, _ = stringLit(kv.value)
			case "Need":
				need, ok := kv.value.(*ast.CompositeLit)
				if !ok {
					errs = append(errs, fmt.Errorf("%s: Need is not a config.Need literal", path))
					break
				}
				spec.need, err = needOf(need)
				errs = append(errs, err)
			case "Vars":
				pkg, ok := strings.CutSuffix(exprName(kv.value), ".Vars")
				spec.vars = varsOf[pkg]
				if !ok || spec.vars == nil {
					errs = append(errs, fmt.Errorf("%s: Vars %s is none of docgen's varsOf", path, exprName(kv.value)))
				}
			}
		}
		return false
	})
	if err := joinErrs(errs); err != nil {
		return spec, err
	}
	if !found || spec.name == "" {
		return spec, fmt.Errorf("%s: no host.Spec with a Name", path)
	}
	return spec, nil
}

type keyValue struct {
	key   string
	value ast.Expr
}

func keyValues(lit *ast.CompositeLit) []keyValue {
	var out []keyValue
	for _, e := range lit.Elts {
		if kv, ok := e.(*ast.KeyValueExpr); ok {
			if id, ok := kv.Key.(*ast.Ident); ok {
				out = append(out, keyValue{id.Name, kv.Value})
			}
		}
	}
	return out
}

// needOf reads a config.Need literal; a field it does not know is an
// error, so that a new one is not left out of the reference.
func needOf(lit *ast.CompositeLit) (config.Need, error) {
	var need config.Need
	for _, kv := range keyValues(lit) {
		switch kv.key {
		case "Model":
			need.Model = exprName(kv.value) == "true"
		case "HTTPAddr":
			need.HTTPAddr, _ = stringLit(kv.value)
		case "MetricsAddr":
			need.MetricsAddr, _ = stringLit(kv.value)
		default:
			return need, fmt.Errorf("config.Need field %s: docgen does not know it", kv.key)
		}
	}
	return need, nil
}

// envReadsUnder adds what the code under root reads from the environment
// itself, directory by directory, each named by readerOf.
func envReadsUnder(root string, ss *settings) error {
	dirs := map[string][]*ast.File{}
	fset := token.NewFileSet()
	err := walkGo(root, func(path string, src []byte) error {
		if strings.HasSuffix(path, "_test.go") {
			return nil
		}
		f, err := parser.ParseFile(fset, path, src, parser.SkipObjectResolution)
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(root, filepath.Dir(path))
		if err != nil {
			return err
		}
		dirs[filepath.ToSlash(rel)] = append(dirs[filepath.ToSlash(rel)], f)
		return nil
	})
	if err != nil {
		return err
	}
	var errs []error
	for _, dir := range sortedKeys(dirs) {
		by, known := readerOf[dir]
		reads := envReads(dirs[dir])
		for _, name := range sortedKeys(reads) {
			r := reads[name]
			if !known {
				errs = append(errs, fmt.Errorf("%s reads %s: name its binary in docgen's readerOf", dir, name))
				continue
			}
			r.by = by
			ss.add(name, r)
		}
	}
	return joinErrs(errs)
}

// envReads finds what files read from the environment: the variable
// named to os.Getenv, os.LookupEnv or envOr (with envOr's default), every
// variable named in a function that hands os.Getenv a name it was given
// (a getenv that answers some names), the settings config.Load reads when
// handed os.Getenv, and a package's Vars when its FromEnv is.
func envReads(files []*ast.File) map[string]read {
	out := map[string]read{}
	add := func(name string, r read) {
		old := out[name]
		out[name] = read{def: cmpOr(old.def, r.def), usage: cmpOr(old.usage, r.usage)}
	}
	funcs := map[string]*ast.FuncDecl{}
	for _, f := range files {
		for _, d := range f.Decls {
			if fn, ok := d.(*ast.FuncDecl); ok && fn.Body != nil && fn.Recv == nil {
				funcs[fn.Name.Name] = fn
			}
		}
	}
	handsGetenv := func(call *ast.CallExpr) bool {
		return slices.ContainsFunc(call.Args, func(a ast.Expr) bool { return exprName(a) == "os.Getenv" })
	}
	for _, f := range files {
		for _, d := range f.Decls {
			fn, ok := d.(*ast.FuncDecl)
			if !ok || fn.Body == nil {
				continue
			}
			passThrough := false
			ast.Inspect(fn.Body, func(n ast.Node) bool {
				call, ok := n.(*ast.CallExpr)
				if !ok {
					return true
				}
				name := exprName(call.Fun)
				switch {
				case (name == "os.Getenv" || name == "os.LookupEnv" || name == "envOr") && len(call.Args) > 0:
					if v, ok := stringLit(call.Args[0]); ok && settingName.MatchString(v) {
						var def string
						if name == "envOr" && len(call.Args) > 1 {
							def, _ = stringLit(call.Args[1])
						}
						add(v, read{def: def})
					} else if name != "envOr" {
						passThrough = true
						// A name made by a function of the package: its prefix.
						if c, ok := call.Args[0].(*ast.CallExpr); ok {
							if made := funcs[exprName(c.Fun)]; made != nil {
								for _, v := range literals(made.Body) {
									if strings.HasSuffix(v, "_") {
										add(cmpOr(prefixed[v], v+"…"), read{})
									}
								}
							}
						}
					}
				case name == "config.Load" && handsGetenv(call):
					need := config.Need{}
					for _, a := range call.Args {
						if lit, ok := a.(*ast.CompositeLit); ok && exprName(lit.Type) == "config.Need" {
							need, _ = needOf(lit)
						}
					}
					for _, v := range config.Shared(need) {
						add(v.Name, read{def: sharedDefault(v), usage: v.Usage})
					}
				case strings.HasSuffix(name, ".FromEnv") && handsGetenv(call):
					parts := strings.Split(name, ".")
					for _, v := range varsOf[parts[len(parts)-2]] {
						add(v.Name, read{def: v.Default, usage: v.Usage})
					}
				}
				return true
			})
			if passThrough {
				for _, v := range literals(fn.Body) {
					if !strings.HasSuffix(v, "_") {
						add(v, read{})
					}
				}
			}
		}
	}
	return out
}

// literals are the ASSAY_ names (and prefixes) spelt as string literals
// in n.
func literals(n ast.Node) []string {
	var out []string
	ast.Inspect(n, func(n ast.Node) bool {
		if v, ok := stringLit(n); ok && settingName.MatchString(v) {
			out = append(out, v)
		}
		return true
	})
	return out
}

// testGetenv is a test's own reading of a variable.
var testGetenv = regexp.MustCompile(`os\.(?:Getenv|LookupEnv)\("(ASSAY_[A-Z0-9_]+)"\)`)

// testReads adds the variables tests read for themselves.
func testReads(root string, ss *settings) error {
	return walkGo(root, func(path string, src []byte) error {
		if strings.HasSuffix(path, "_test.go") {
			for _, m := range testGetenv.FindAllSubmatch(src, -1) {
				ss.add(string(m[1]), read{by: "tests"})
			}
		}
		return nil
	})
}

// walkGo calls fn with every .go file under root that holds "ASSAY_".
func walkGo(root string, fn func(path string, src []byte) error) error {
	return filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if path != root && (strings.HasPrefix(d.Name(), ".") || d.Name() == "bin" || d.Name() == "testdata") {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(path, ".go") {
			return nil
		}
		src, err := os.ReadFile(path)
		if err != nil || !strings.Contains(string(src), "ASSAY_") {
			return err
		}
		return fn(path, src)
	})
}

// exprName is pkg.Name, a.b.Name or Name for a selector or an identifier.
func exprName(e ast.Expr) string {
	switch x := e.(type) {
	case *ast.Ident:
		return x.Name
	case *ast.SelectorExpr:
		if left := exprName(x.X); left != "" {
			return left + "." + x.Sel.Name
		}
	}
	return ""
}

func stringLit(n ast.Node) (string, bool) {
	lit, ok := n.(*ast.BasicLit)
	if !ok || lit.Kind != token.STRING {
		return "", false
	}
	v, err := strconv.Unquote(lit.Value)
	return v, err == nil
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}
