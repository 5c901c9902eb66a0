package main

import (
	"context"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/outboxref/orders/internal/pgtest"
)

// TestPoolSize: orders opens enough connections for its commits to share
// WAL flushes, unless DATABASE_URL chooses the size.
func TestPoolSize(t *testing.T) {
	url := pgtest.Scratch(t, "orders_pool")
	sep := "?"
	if strings.Contains(url, "?") {
		sep = "&"
	}
	for _, tc := range []struct {
		url  string
		want int32
	}{
		{url, defaultPoolSize},
		{url + sep + "pool_max_conns=3", 3},
	} {
		pool, err := openPool(context.Background(), tc.url)
		require.NoError(t, err)
		require.Equal(t, tc.want, pool.Config().MaxConns, tc.url)
		pool.Close()
	}
}
