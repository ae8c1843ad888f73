package claims

import (
	"encoding/json"
	"fmt"
)

// Status is the daemon's answer to Status: the gate and the status document. Only the parts a
// driver commonly needs are typed; everything is in JSON.
type Status struct {
	// GateOpen says whether Prepare and Unprepare are served (the container runtime's
	// Synchronize was answered); while false they are refused with UNAVAILABLE.
	GateOpen bool
	// Claims are the claims the node holds, with the containers using each.
	Claims []StatusClaim
	// PendingUpdates is the number of container updates waiting to reach the runtime.
	PendingUpdates int
	// JSON is the whole document `nri-accel status --json` prints (devices, pools, shares,
	// slices, claims, containers, the gate, and the optional kubelet and DRA sections).
	JSON json.RawMessage
}

// StatusClaim is one claim of the status document.
type StatusClaim struct {
	UID        string   `json:"uid"`
	Namespace  string   `json:"namespace"`
	Name       string   `json:"name"`
	Containers []string `json:"containers"`
}

// statusDoc is the typed part of the document.
type statusDoc struct {
	Gate struct {
		Open bool `json:"open"`
	} `json:"gate"`
	Claims         []StatusClaim `json:"claims"`
	PendingUpdates int           `json:"pending_updates"`
}

func newStatus(gateOpen bool, doc string) (*Status, error) {
	var d statusDoc
	if err := json.Unmarshal([]byte(doc), &d); err != nil {
		return nil, &CallError{
			Method:  "Status",
			Code:    Internal,
			Message: fmt.Sprintf("nri-accel's status document is not the JSON this client reads: %v", err),
			Err:     err,
		}
	}
	return &Status{
		GateOpen:       gateOpen,
		Claims:         d.Claims,
		PendingUpdates: d.PendingUpdates,
		JSON:           json.RawMessage(doc),
	}, nil
}
