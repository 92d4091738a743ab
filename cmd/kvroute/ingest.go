package main

import (
	"context"
	"errors"
	"io"
)

// runIngest is a TEMPORARY stub so that the binary builds before the lead
// adds the real `kvroute ingest`; replace this whole file.
func runIngest(_ context.Context, _ []string, _, _ io.Writer) error {
	return errors.New("not yet")
}
