package outbox

import "time"

// Lane is the queue a piece of outbox work waits in (docs/api-contract.md §21): the work a
// single API call or page caused (Interactive) is claimed before the work of imports and bulk
// actions (Bulk), whatever the bulk lane holds, and within Bulk the newsletters take turns.
// The writer that queues the work chooses its lane; the stores keep it as a small integer,
// the order in which the lanes are served.
type Lane int16

// The lanes, in the order they are served.
const (
	Interactive Lane = 0 // caused by one API call or page: a create, a confirmation, a change
	Bulk        Lane = 1 // caused by an import (docs/api-contract.md §15) or a bulk action (§20)
)

// Lanes are every lane, in the order they are served.
var Lanes = []Lane{Interactive, Bulk}

// String is the lane's name, as the metrics' lane label shows it.
func (l Lane) String() string {
	if l == Bulk {
		return "bulk"
	}
	return "interactive"
}

// LaneStats is what waits in one lane of a queue, for metrics: how many pieces of work (due,
// in a worker's hands, or scheduled for a retry) and how long the one waiting longest has
// been due (0 when none is).
type LaneStats struct {
	Lane      Lane
	Depth     int64
	OldestDue time.Duration
}
