package envconfig_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/outboxref/orders/internal/envconfig"
)

// TestMaskURL: every form of connection string pgx accepts is printed
// without its password, and one that cannot be parsed is not printed.
func TestMaskURL(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct{ name, in, want string }{
		{"NoPassword", "postgres://postgres@127.0.0.1:5432/orders?sslmode=disable", "postgres://postgres@127.0.0.1:5432/orders?sslmode=disable"},
		{"UserinfoPassword", "postgres://app:s3cret@db:5432/orders", "postgres://app:xxxxx@db:5432/orders"},
		{"QueryPassword", "postgres://app@db/orders?sslmode=require&password=s3cret", "postgres://app@db/orders?password=xxxxx&sslmode=require"},
		{"KeywordValue", "host=db user=app password=s3cret dbname=orders", "host=db user=app password=xxxxx dbname=orders"},
		{"KeywordValueQuoted", "host=db password='s3 cret' sslpassword = k3y dbname=orders", "host=db password=xxxxx sslpassword = xxxxx dbname=orders"},
		{"Unparseable", "postgres://app:50%off@db/orders", "(unparseable URL, hidden)"},
		{"PlainHTTP", "http://127.0.0.1:8080", "http://127.0.0.1:8080"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			got := envconfig.MaskURL(tc.in)
			require.Equal(t, tc.want, got)
			require.NotContains(t, got, "s3")
			require.NotContains(t, got, "k3y")
		})
	}
}
