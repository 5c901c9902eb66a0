package main

import (
	"context"
	"fmt"
	"io"
)

func runRelayOnly(ctx context.Context, getenv func(string) string, stdout io.Writer) error {
	return fmt.Errorf("relay: not wired yet")
}
