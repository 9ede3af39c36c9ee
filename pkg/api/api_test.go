package api_test

import (
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/goccy/go-yaml"

	"assay.dev/pkg/api"
	"assay.dev/pkg/story"
	"assay.dev/schemas"
)

// schemaOf names each type's component schema in the OpenAPI document.
var schemaOf = map[string]any{
	"SubmitRequest":    api.SubmitRequest{},
	"SubmitResponse":   api.SubmitResponse{},
	"Links":            api.Links{},
	"WorkView":         api.WorkView{},
	"WorkReview":       api.WorkReview{},
	"AttemptView":      api.AttemptView{},
	"ResultView":       api.ResultView{},
	"PublicationView":  api.PublicationView{},
	"WorkList":         api.WorkList{},
	"WorkSummary":      api.WorkSummary{},
	"WorkEvent":        api.WorkEvent{},
	"BatchRequest":     api.BatchRequest{},
	"BatchItemRequest": api.BatchItemRequest{},
	"BatchLinks":       api.BatchLinks{},
	"BatchResponse":    api.BatchResponse{},
	"BatchItemWork":    api.BatchItemWork{},
	"BatchView":        api.BatchView{},
	"BatchItemView":    api.BatchItemView{},
	"BatchEvent":       api.BatchEvent{},
	"ReviewView":       api.ReviewView{},
	"ReviewList":       api.ReviewList{},
	"Actor":            api.Actor{},
	"ResolveRequest":   api.ResolveRequest{},
	"WebhookResponse":  api.WebhookResponse{},
	"IgnoredResponse":  api.IgnoredResponse{},
	"ActionRequest":    api.ActionRequest{},
	"ActionResponse":   api.ActionResponse{},
	// A work's story (GET /v1/work/{id}/story), kept in pkg/story.
	"WorkStory":    story.Story{},
	"WorkRow":      story.WorkRow{},
	"AttemptStory": story.AttemptStory{},
	"Decision":     story.Decision{},
}

// unlisted are fields a type reads that its schema leaves out on purpose,
// by type and JSON name.
var unlisted = map[string][]string{
	// ResolveRequest reads by only to refuse it (400 invalid_resolver);
	// the document does not offer it.
	"ResolveRequest": {"by"},
	// AttemptStory's excerpt is read only by the operator's tool from the
	// cell's database (assay work show --answers full); the HTTP API asks
	// for shapes, never an excerpt.
	"AttemptStory": {"excerpt"},
}

// schema is the part of a component schema the check reads.
type schema struct {
	Properties map[string]any `yaml:"properties"`
	Required   []string       `yaml:"required"`
	AllOf      []schema       `yaml:"allOf"`
}

// componentSchemas reads the OpenAPI document's component schemas.
func componentSchemas(t *testing.T) map[string]schema {
	t.Helper()
	var doc struct {
		Components struct {
			Schemas map[string]schema `yaml:"schemas"`
		} `yaml:"components"`
	}
	if err := yaml.Unmarshal(schemas.OpenAPI, &doc); err != nil {
		t.Fatalf("read openapi.yaml: %v", err)
	}
	if len(doc.Components.Schemas) == 0 {
		t.Fatal("openapi.yaml has no component schemas")
	}
	return doc.Components.Schemas
}

// flat is a schema's properties and required names, with those of each
// allOf part.
func (s schema) flat() (props map[string]bool, required []string) {
	props = map[string]bool{}
	for p := range s.Properties {
		props[p] = true
	}
	required = slices.Clone(s.Required)
	for _, part := range s.AllOf {
		pp, rr := part.flat()
		for p := range pp {
			props[p] = true
		}
		required = append(required, rr...)
	}
	return props, required
}

// jsonFields are the names encoding/json gives t's fields, the fields of
// an embedded struct without a name of its own among them.
func jsonFields(t reflect.Type) []string {
	var names []string
	for f := range t.Fields() {
		tag := f.Tag.Get("json")
		if tag == "-" {
			continue
		}
		name, _, _ := strings.Cut(tag, ",")
		if f.Anonymous && name == "" {
			ft := f.Type
			if ft.Kind() == reflect.Pointer {
				ft = ft.Elem()
			}
			if ft.Kind() == reflect.Struct {
				names = append(names, jsonFields(ft)...)
				continue
			}
		}
		if !f.IsExported() {
			continue
		}
		if name == "" {
			name = f.Name
		}
		names = append(names, name)
	}
	return names
}

// mismatches says where v's JSON fields and the schema part ways: a field
// the schema does not have, or a property the schema requires that no
// field writes.
func mismatches(v any, s schema, unlisted ...string) []string {
	props, required := s.flat()
	fields := jsonFields(reflect.TypeOf(v))
	var out []string
	for _, f := range fields {
		if !props[f] && !slices.Contains(unlisted, f) {
			out = append(out, "field "+f+" is not a property of the schema")
		}
	}
	for _, r := range required {
		if !slices.Contains(fields, r) {
			out = append(out, "required property "+r+" is no field")
		}
	}
	return out
}

// Every API type writes what its schema in the OpenAPI document describes:
// each JSON field of the type is a property of the schema, and each
// property the schema requires is a field of the type. A field added to
// a type and not to the document, or the other way round, fails here.
func TestTypesMatchTheOpenAPIDocument(t *testing.T) {
	t.Parallel()
	components := componentSchemas(t)
	for name, v := range schemaOf {
		s, ok := components[name]
		if !ok {
			t.Errorf("%T: openapi.yaml has no schema %s", v, name)
			continue
		}
		for _, m := range mismatches(v, s, unlisted[name]...) {
			t.Errorf("%T against schema %s: %s", v, name, m)
		}
	}
}

// The check fails a type with a field its schema lacks, and one that
// lacks a property its schema requires.
func TestTheCheckSeesDrift(t *testing.T) {
	t.Parallel()
	s := componentSchemas(t)["SubmitResponse"]
	type extra struct {
		api.SubmitResponse
		Queue string `json:"queue"`
	}
	if m := mismatches(extra{}, s); len(m) != 1 || !strings.Contains(m[0], "queue") {
		t.Errorf("a field the schema lacks: %q", m)
	}
	type short struct {
		WorkID string `json:"workId"`
	}
	if m := mismatches(short{}, s); len(m) != 4 {
		t.Errorf("four required properties missing: %q", m)
	}
}
