package main

import (
	"bytes"
	_ "embed"
	"fmt"
	"slices"
	"strings"
	"text/template"
)

// configurationTemplate is docs/configuration.md around its tables.
//
//go:embed configuration.md.tmpl
var configurationTemplate string

// aboutText says what each variable is for, in more words than a
// binary's help line has room for: "## NAME" and its text. A variable
// without an entry is described by its help lines; one the binaries do
// not read may not have one.
//
//go:embed settings.md
var aboutText string

// about reads aboutText.
func about() (map[string]string, error) {
	out := map[string]string{}
	_, body, _ := strings.Cut(aboutText, "\n## ")
	for _, part := range strings.Split(body, "\n## ") {
		name, text, _ := strings.Cut(part, "\n")
		name, text = strings.TrimSpace(name), strings.Join(strings.Fields(text), " ")
		if text == "" {
			return nil, fmt.Errorf("settings.md: %s has no text", name)
		}
		if _, dup := out[name]; dup {
			return nil, fmt.Errorf("settings.md: %s twice", name)
		}
		out[name] = text
	}
	return out, nil
}

// A group is one table of the reference.
type group struct {
	Title, Intro string
	Rows         []string
}

// groupOf is the table a setting is listed in: config.Load's settings
// together, then each service's own (a setting of several services with
// the first), then the assay command's, then the tests'.
func groupOf(ss *settings, s *setting) string {
	if ss.shared[s.name] {
		return "shared"
	}
	for _, by := range readers {
		if s.readBy(by) {
			switch by {
			case "assay", "assay-dev", "chaos":
				return "assay"
			}
			return by
		}
	}
	return ""
}

var groups = []struct{ key, title, intro string }{
	{"shared", "Every service", "What every service reads through the same code, each also taken as the flag beside it (a flag wins); `assay migrate` and `assay tenants seed` read them the same way, the other commands as their help says. The model's settings are the classifier's alone among the services."},
	{"ingress", "ingress", "The ingress service's own settings (some also read by others, as the second column says)."},
	{"classifier", "classifier", "The classifier's own settings."},
	{"committer", "committer", "The committer's own settings."},
	{"ledger", "ledger", "The ledger's own settings."},
	{"assay", "The assay commands", "Read by `assay`'s and `assay-dev`'s commands alone, not by the services."},
	{"tests", "Tests", "Read by `make test`'s tests and the test kit (`pkg/devkit/testenv`), never by a binary."},
}

// configuration renders docs/configuration.md.
func configuration(ss *settings) ([]byte, error) {
	texts, err := about()
	if err != nil {
		return nil, err
	}
	var errs []error
	for _, name := range sortedKeys(texts) {
		if ss.byName[name] == nil {
			errs = append(errs, fmt.Errorf("settings.md describes %s, which no binary reads", name))
		}
	}
	tables := map[string]*group{}
	var order []*group
	for _, g := range groups {
		tables[g.key] = &group{Title: g.title, Intro: g.intro}
		order = append(order, tables[g.key])
	}
	for _, s := range ss.list {
		meaning := texts[s.name]
		if meaning == "" {
			meaning = usages(s)
		}
		if meaning == "" {
			errs = append(errs, fmt.Errorf("%s is read (%s) but has no help line and no text in settings.md", s.name, readBy(s)))
			continue
		}
		name := "`" + s.name + "`"
		if s.flag != "" {
			name += " (`--" + s.flag + "`)"
		}
		g := tables[groupOf(ss, s)]
		g.Rows = append(g.Rows, fmt.Sprintf("| %s | %s | %s | %s |", name, readBy(s), defaults(s), cell(meaning)))
	}
	if err := joinErrs(errs); err != nil {
		return nil, err
	}
	var b bytes.Buffer
	t, err := template.New("configuration").Parse(configurationTemplate)
	if err != nil {
		return nil, err
	}
	if err := t.Execute(&b, struct{ Groups []*group }{order}); err != nil {
		return nil, err
	}
	return b.Bytes(), nil
}

// readBy names the binaries that read s.
func readBy(s *setting) string {
	var by []string
	for _, r := range s.reads {
		by = append(by, r.by)
	}
	return strings.Join(by, ", ")
}

// defaults is s's default, or each binary's where they differ.
func defaults(s *setting) string {
	type def struct{ value, by string }
	var defs []def
	for _, r := range s.reads {
		if r.def == "" {
			continue
		}
		if i := slices.IndexFunc(defs, func(d def) bool { return d.value == r.def }); i >= 0 {
			defs[i].by += ", " + r.by
			continue
		}
		defs = append(defs, def{r.def, r.by})
	}
	switch len(defs) {
	case 0:
		return "none"
	case 1:
		return shown(defs[0].value)
	}
	var out []string
	for _, d := range defs {
		out = append(out, d.by+": "+shown(d.value))
	}
	return strings.Join(out, "; ")
}

// shown is a default as the table shows it: a value as code, words as
// words.
func shown(v string) string {
	if strings.ContainsAny(v, " ") || v == "none" || v == "required" {
		return cell(v)
	}
	return "`" + v + "`"
}

// usages is what the binaries' help lines say of s, each binary's where
// they differ.
func usages(s *setting) string {
	type use struct{ text, by string }
	var uses []use
	for _, r := range s.reads {
		if r.usage == "" {
			continue
		}
		if i := slices.IndexFunc(uses, func(u use) bool { return u.text == r.usage }); i >= 0 {
			uses[i].by += ", " + r.by
			continue
		}
		uses = append(uses, use{r.usage, r.by})
	}
	if len(uses) == 1 {
		return uses[0].text
	}
	var out []string
	for _, u := range uses {
		out = append(out, u.by+": "+u.text)
	}
	return strings.Join(out, "; ")
}
