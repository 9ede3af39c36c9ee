package main

import (
	"bytes"
	"fmt"
	"strings"

	"github.com/pb33f/libopenapi"
)

// The operations table of docs/api.md sits between these two lines.
const (
	operationsBegin = "<!-- operations: written by make docs from schemas/openapi.yaml -->\n"
	operationsEnd   = "<!-- end of operations -->\n"
)

// An operation is one method of one path of the OpenAPI description.
type operation struct {
	method, path, id, summary string
	open                      bool // no bearer token asked for
}

// operationsByTag reads the description's operations, each under its
// first tag, the tags in the order the description lists them.
func operationsByTag(spec []byte) (tags []string, about map[string]string, ops map[string][]operation, err error) {
	doc, err := libopenapi.NewDocument(spec)
	if err != nil {
		return nil, nil, nil, err
	}
	model, err := doc.BuildV3Model()
	if err != nil {
		return nil, nil, nil, err
	}
	about, ops = map[string]string{}, map[string][]operation{}
	for _, t := range model.Model.Tags {
		tags = append(tags, t.Name)
		about[t.Name] = strings.TrimSpace(t.Description)
	}
	for path, item := range model.Model.Paths.PathItems.FromOldest() {
		for method, op := range item.GetOperations().FromOldest() {
			tag := ""
			if len(op.Tags) > 0 {
				tag = op.Tags[0]
			}
			if _, ok := about[tag]; !ok {
				return nil, nil, nil, fmt.Errorf("%s %s: tag %q is not among the description's tags", method, path, tag)
			}
			ops[tag] = append(ops[tag], operation{
				method: strings.ToUpper(method), path: path, id: op.OperationId,
				summary: strings.TrimSpace(op.Summary), open: op.Security != nil && len(op.Security) == 0,
			})
		}
	}
	return tags, about, ops, nil
}

// withOperations is page with its operations table made again from spec.
func withOperations(page, spec []byte) ([]byte, error) {
	before, rest, ok := bytes.Cut(page, []byte(operationsBegin))
	if !ok {
		return nil, fmt.Errorf("no line %q", strings.TrimSpace(operationsBegin))
	}
	_, after, ok := bytes.Cut(rest, []byte(operationsEnd))
	if !ok {
		return nil, fmt.Errorf("no line %q", strings.TrimSpace(operationsEnd))
	}
	tags, about, ops, err := operationsByTag(spec)
	if err != nil {
		return nil, err
	}
	var b bytes.Buffer
	b.Write(before)
	b.WriteString(operationsBegin)
	b.WriteString("\n| operation | what it does | token | operationId |\n|---|---|---|---|\n")
	for _, tag := range tags {
		if len(ops[tag]) == 0 {
			continue
		}
		fmt.Fprintf(&b, "| **%s** | %s | | |\n", tag, cell(about[tag]))
		for _, op := range ops[tag] {
			token := "bearer"
			if op.open {
				token = "none"
			}
			fmt.Fprintf(&b, "| `%s %s` | %s | %s | `%s` |\n", op.method, op.path, cell(op.summary), token, op.id)
		}
	}
	b.WriteString("\n")
	b.WriteString(operationsEnd)
	b.Write(after)
	return b.Bytes(), nil
}

// cell is text fit for one cell of a table.
func cell(s string) string {
	return strings.ReplaceAll(strings.Join(strings.Fields(s), " "), "|", `\|`)
}
