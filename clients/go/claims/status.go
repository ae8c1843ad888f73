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
	// Pools are the policy's pools in config order, with each device's units and holders.
	Pools []StatusPool
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
	// UID of the claim.
	UID string `json:"uid"`
	// Namespace and Name the claim was prepared with (empty for claims that name neither).
	Namespace string `json:"namespace"`
	Name      string `json:"name"`
	// Containers are the ids of the containers using the claim now.
	Containers []string `json:"containers"`
}

// StatusPool is one pool of the status document (its "policy.pools" entry).
type StatusPool struct {
	// Name of the pool, the pool name DRA allocation results carry for its devices.
	Name string `json:"name"`
	// Family is the pool's policy: exclusive, shared, sliced, or a custom policy's name.
	Family string `json:"family"`
	// Devices of the pool, sorted by id.
	Devices []StatusDevice `json:"devices"`
}

// StatusDevice is one device of a pool: its units and which claims hold them.
type StatusDevice struct {
	// ID is the device id of the inventory (gpu0). DRA results name the device by its published
	// name, <pool>-<id> lower-cased (docs/dra.md, "What is published").
	ID string `json:"id"`
	// UnitsTotal is how many units the device offers (1, its replicas or its slots).
	UnitsTotal int `json:"units_total"`
	// UnitsUsed is how many are held.
	UnitsUsed int `json:"units_used"`
	// Held lists who holds what.
	Held []StatusHeld `json:"held"`
}

// StatusHeld is one held unit of a device.
type StatusHeld struct {
	// Unit is the unit as the policy writes it (kept raw: its shape depends on the family).
	Unit json.RawMessage `json:"unit"`
	// Claim is the holder's claim UID.
	Claim string `json:"claim"`
}

// statusDoc is the typed part of the document.
type statusDoc struct {
	Gate struct {
		Open bool `json:"open"`
	} `json:"gate"`
	Policy struct {
		Pools []StatusPool `json:"pools"`
	} `json:"policy"`
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
		Pools:          d.Policy.Pools,
		Claims:         d.Claims,
		PendingUpdates: d.PendingUpdates,
		JSON:           json.RawMessage(doc),
	}, nil
}
