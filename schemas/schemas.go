// Package schemas carries the contract files so that the model adapter, the
// gate and the test fixtures read the very same bytes.
package schemas

import "embed"

// FS holds every contract schema, prompt and the contract manifest.
//
//go:embed *.json prompts
var FS embed.FS

// OpenAPI is the HTTP API's description (OpenAPI 3.1), served by ingress
// at /v1/openapi.yaml and held true by the cell tests.
//
//go:embed openapi.yaml
var OpenAPI []byte
