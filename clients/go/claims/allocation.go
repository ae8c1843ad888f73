package claims

import "nri-accel/clients/go/claimsv1"

// Result is one device allocation result of a ResourceClaim (resource.k8s.io
// DeviceRequestAllocationResult: request, driver, pool, device, shareID). The client does not
// import k8s.io/api; a driver copies the fields it got from the claim's status.
type Result struct {
	// Request is the name of the claim's request this device satisfies.
	Request string
	// Driver is the DRA driver that published the device.
	Driver string
	// Pool is the pool the device belongs to.
	Pool string
	// Device is the published name of the device within its pool.
	Device string
	// ShareID is the allocation's share id for a device that allows multiple allocations;
	// empty when there is none.
	ShareID string
}

// ForDriver keeps the results of one driver: a claim may hold devices of several drivers, and a
// driver forwards to nri-accel the devices it published itself (docs/claims-api.md, "Messages").
func ForDriver(driver string, results []Result) []Result {
	var out []Result
	for _, r := range results {
		if r.Driver == driver {
			out = append(out, r)
		}
	}
	return out
}

// FromAllocation builds the claim to Prepare from a kubelet claim (namespace, name, uid) and its
// allocation results for this driver (see [ForDriver]): nri-accel grants exactly those devices or
// refuses the claim.
func FromAllocation(namespace, name, uid string, results []Result) *claimsv1.Claim {
	rs := make([]*claimsv1.AllocationResult, 0, len(results))
	for _, r := range results {
		ar := &claimsv1.AllocationResult{
			Request: r.Request,
			Driver:  r.Driver,
			Pool:    r.Pool,
			Device:  r.Device,
		}
		if r.ShareID != "" {
			share := r.ShareID
			ar.ShareId = &share
		}
		rs = append(rs, ar)
	}
	return &claimsv1.Claim{
		Namespace: namespace,
		Uid:       uid,
		Name:      name,
		Ask:       &claimsv1.Claim_Results{Results: &claimsv1.AllocationResults{Results: rs}},
	}
}

// FromCount builds a claim whose devices nri-accel's policy chooses: count units per request
// (the path of claims that do not come from a Kubernetes scheduler).
func FromCount(namespace, name, uid string, requests ...*claimsv1.CountRequest) *claimsv1.Claim {
	return &claimsv1.Claim{
		Namespace: namespace,
		Uid:       uid,
		Name:      name,
		Ask:       &claimsv1.Claim_Count{Count: &claimsv1.CountRequests{Requests: requests}},
	}
}

// Ref names a claim to Unprepare. kubelet sends namespace, name and uid; an empty namespace and
// name release by UID alone.
func Ref(namespace, name, uid string) *claimsv1.ClaimRef {
	return &claimsv1.ClaimRef{Namespace: namespace, Uid: uid, Name: name}
}
