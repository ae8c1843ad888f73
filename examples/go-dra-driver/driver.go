package main

import (
	"context"
	"errors"
	"fmt"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"
	"k8s.io/dynamic-resource-allocation/resourceslice"
	"k8s.io/klog/v2"
	"k8s.io/utils/ptr"

	"nri-accel/clients/go/claims"
	"nri-accel/clients/go/claimsv1"
)

// driver is the kubelet plugin: it publishes devices and forwards prepare and unprepare to
// nri-accel.
type driver struct {
	// name is this driver's name: the results it forwards are those for it.
	name string
	// pool is the DRA pool it publishes: the node's name.
	pool   string
	client *claims.Client
	// devices by their published name.
	devices map[string]device
	// fatal stops the driver (cancels its main context) with the cause.
	fatal context.CancelCauseFunc
}

var _ kubeletplugin.DRAPlugin = (*driver)(nil)

// resources is this driver's ResourceSlice pool: one slice of the devices, each with its
// nri-accel id and pool as attributes, for DeviceClasses and claims to select on.
func (d *driver) resources() resourceslice.DriverResources {
	var devs []resourceapi.Device
	for _, dev := range d.devices {
		devs = append(devs, resourceapi.Device{
			Name: dev.Name,
			Attributes: map[resourceapi.QualifiedName]resourceapi.DeviceAttribute{
				"deviceId": {StringValue: ptr.To(dev.ID)},
				"pool":     {StringValue: ptr.To(dev.Pool)},
			},
		})
	}
	return resourceslice.DriverResources{
		Pools: map[string]resourceslice.Pool{d.pool: {Slices: []resourceslice.Slice{{Devices: devs}}}},
	}
}

// PrepareResourceClaims forwards the claims to nri-accel in one Prepare, each with its
// allocation results for this driver (mapped onto nri-accel's pool names), and answers nri-accel's
// answer claim by claim. A claim refused by nri-accel (its device is held through the other
// driver, say) gets that refusal as its error, which names the holder: the kubelet retries it.
func (d *driver) PrepareResourceClaims(ctx context.Context, rcs []*resourceapi.ResourceClaim) (map[types.UID]kubeletplugin.PrepareResult, error) {
	logger := klog.FromContext(ctx)
	out := make(map[types.UID]kubeletplugin.PrepareResult, len(rcs))
	var req []*claimsv1.Claim
	for _, rc := range rcs {
		results, err := d.results(rc)
		if err != nil {
			out[rc.UID] = kubeletplugin.PrepareResult{Err: err}
			continue
		}
		req = append(req, claims.FromAllocation(rc.Namespace, rc.Name, string(rc.UID), results))
	}
	if len(req) == 0 {
		return out, nil
	}
	logger.V(2).Info("forwarding claims to nri-accel", "claims", len(req))
	// A whole-call error (nri-accel restarting, a deadline) fails the kubelet's call: it retries.
	answers, err := d.client.Prepare(ctx, req)
	if err != nil {
		return nil, fmt.Errorf("nri-accel's Prepare: %w", err)
	}
	for _, c := range req {
		uid := types.UID(c.Uid)
		a, ok := answers[c.Uid]
		switch {
		case !ok:
			out[uid] = kubeletplugin.PrepareResult{Err: fmt.Errorf("nri-accel answered nothing for claim %s/%s", c.Namespace, c.Name)}
		case a.Err != nil:
			if refused, ok := claims.AsRefusal(a.Err); ok {
				holder, device, _ := refused.Holder()
				logger.Info("nri-accel refused the claim", "claim", klog.KRef(c.Namespace, c.Name), "holder", holder, "device", device, "reason", refused.Reason)
			}
			out[uid] = kubeletplugin.PrepareResult{Err: a.Err}
		default:
			devs := make([]kubeletplugin.Device, 0, len(a.Devices))
			for _, g := range a.Devices {
				devs = append(devs, kubeletplugin.Device{
					Requests:     g.GetRequestNames(),
					PoolName:     d.pool,
					DeviceName:   g.GetDeviceName(),
					CDIDeviceIDs: g.GetCdiDeviceIds(),
				})
			}
			logger.Info("claim prepared by nri-accel", "claim", klog.KRef(c.Namespace, c.Name), "devices", len(devs))
			out[uid] = kubeletplugin.PrepareResult{Devices: devs}
		}
	}
	return out, nil
}

// results answers rc's allocation results for this driver in nri-accel's terms: the pool is
// the nri-accel pool of the device (this driver's DRA pool is the node's name).
func (d *driver) results(rc *resourceapi.ResourceClaim) ([]claims.Result, error) {
	if rc.Status.Allocation == nil {
		return nil, fmt.Errorf("claim %s/%s is not allocated", rc.Namespace, rc.Name)
	}
	var out []claims.Result
	for _, r := range rc.Status.Allocation.Devices.Results {
		if r.Driver != d.name {
			continue
		}
		dev, ok := d.devices[r.Device]
		if r.Pool != d.pool || !ok {
			return nil, fmt.Errorf("claim %s/%s was allocated device %s of pool %s, which this driver does not publish on node %s", rc.Namespace, rc.Name, r.Device, r.Pool, d.pool)
		}
		out = append(out, claims.Result{Request: r.Request, Driver: r.Driver, Pool: dev.Pool, Device: dev.Name})
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("claim %s/%s has no allocation results for driver %s", rc.Namespace, rc.Name, d.name)
	}
	return out, nil
}

// UnprepareResourceClaims forwards the claims to nri-accel in one Unprepare. The claims are not
// fetched (they may be gone from the API server); nri-accel keeps its own record.
func (d *driver) UnprepareResourceClaims(ctx context.Context, refs []kubeletplugin.NamespacedObject) (map[types.UID]error, error) {
	req := make([]*claimsv1.ClaimRef, 0, len(refs))
	for _, r := range refs {
		req = append(req, claims.Ref(r.Namespace, r.Name, string(r.UID)))
	}
	answers, err := d.client.Unprepare(ctx, req)
	if err != nil {
		return nil, fmt.Errorf("nri-accel's Unprepare: %w", err)
	}
	out := make(map[types.UID]error, len(refs))
	for _, r := range refs {
		e, ok := answers[string(r.UID)]
		if !ok {
			e = fmt.Errorf("nri-accel answered nothing for claim %s/%s", r.Namespace, r.Name)
		}
		out[r.UID] = e
	}
	return out, nil
}

// HandleError logs errors of the helper's background work (publishing the ResourceSlice). The
// helper retries the recoverable ones; any other stops the driver, which exits with the error.
func (d *driver) HandleError(ctx context.Context, err error, msg string) {
	klog.FromContext(ctx).Error(err, msg)
	if !errors.Is(err, kubeletplugin.ErrRecoverable) && d.fatal != nil {
		d.fatal(fmt.Errorf("%s: %w", msg, err))
	}
}
