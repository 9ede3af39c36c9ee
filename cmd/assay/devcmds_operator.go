//go:build operator

package main

import (
	"context"
	"fmt"
	"io"
)

func init() {
	helps["bench"] = "usage: assay bench goodput|pipeline|parts|cells (development builds only)\n"
}

// devCommand refuses the development commands in the operator build
// (-tags operator, the assay of the container image), which links neither
// the dev kit nor an embedded nats-server.
func devCommand(_ context.Context, name string, _ []string, _ io.Writer) error {
	return configError{fmt.Errorf("%s is a development command, not in this build of assay (built with -tags operator); run it from a development build (make build)", name)}
}
