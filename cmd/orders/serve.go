package main

import (
	"context"
	"fmt"
	"io"
)

func runServe(ctx context.Context, getenv func(string) string, stdout io.Writer) error {
	return fmt.Errorf("serve: not wired yet")
}
