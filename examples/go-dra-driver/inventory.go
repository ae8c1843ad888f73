package main

import (
	"context"
	"fmt"
	"strings"

	"nri-accel/clients/go/claims"
)

// device is one nri-accel device this driver publishes.
type device struct {
	// ID is nri-accel's device id (accel0).
	ID string
	// Pool is the nri-accel pool (policy) holding it: the `pool` a Prepare's results carry.
	Pool string
	// Name is the device's name in this driver's ResourceSlice, the name nri-accel publishes
	// it under too (docs/dra.md): `<pool>-<id>`, lower-cased, every other character `-`.
	Name string
}

// inventory asks nri-accel for its status and answers the devices ids names.
func inventory(ctx context.Context, client *claims.Client, ids []string) ([]device, error) {
	st, err := client.Status(ctx)
	if err != nil {
		return nil, err
	}
	return pick(st.Pools, ids)
}

// pick answers the devices ids names among nri-accel's pools, in the order given. Each must be
// a device of an exclusive pool: one claim holds it whole, which is all this example publishes
// (shares and slices need the capacity and counter fields nri-accel's own driver publishes).
func pick(pools []claims.StatusPool, ids []string) ([]device, error) {
	where := map[string]claims.StatusPool{}
	for _, p := range pools {
		for _, d := range p.Devices {
			where[d.ID] = p
		}
	}
	var out []device
	for _, id := range ids {
		p, ok := where[id]
		switch {
		case !ok:
			return nil, fmt.Errorf("device %s is in no pool of nri-accel's (nri-accel status lists the pools and their devices): fix -devices", id)
		case p.Family != "exclusive":
			return nil, fmt.Errorf("device %s is in pool %s of family %s, and this driver publishes only devices of exclusive pools: fix -devices", id, p.Name, p.Family)
		}
		out = append(out, device{ID: id, Pool: p.Name, Name: sanitize(p.Name) + "-" + sanitize(id)})
	}
	return out, nil
}

// sanitize lower-cases s and turns every character outside [a-z0-9] into '-', as nri-accel
// does for the device names it publishes.
func sanitize(s string) string {
	return strings.Map(func(r rune) rune {
		if r >= 'A' && r <= 'Z' {
			r += 'a' - 'A'
		}
		if (r >= 'a' && r <= 'z') || (r >= '0' && r <= '9') {
			return r
		}
		return '-'
	}, s)
}
