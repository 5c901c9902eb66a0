package relay

import (
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"
)

// TestReadFrom: a read beside the batch with the broker starts at the
// latest due time in it and skips only its rows at that time, the only
// ones it could read again; with nothing in flight it starts at the
// upkeep's floor and its skip list is empty but not nil, which pgx would
// send as NULL and which would hide every row.
func TestReadFrom(t *testing.T) {
	t.Parallel()
	base := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	row := func(at time.Duration) leased {
		return leased{claim: claim{EventID: uuid.New(), NextAttemptAt: base.Add(at)}}
	}

	floor, skip := readFrom(base, nil)
	require.Equal(t, base, floor)
	require.NotNil(t, skip, "an empty skip list must not be nil")
	require.Empty(t, skip)

	sending := []leased{row(-time.Second), row(3 * time.Microsecond), row(1 * time.Microsecond), row(3 * time.Microsecond)}
	floor, skip = readFrom(base, sending)
	require.Equal(t, base.Add(3*time.Microsecond), floor)
	require.ElementsMatch(t, []uuid.UUID{sending[1].EventID, sending[3].EventID}, skip)

	// The upkeep's floor wins when it is later than every row in flight.
	floor, skip = readFrom(base.Add(time.Second), sending)
	require.Equal(t, base.Add(time.Second), floor)
	require.Empty(t, skip)
}
