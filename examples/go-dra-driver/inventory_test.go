package main

import (
	"reflect"
	"strings"
	"testing"

	"nri-accel/clients/go/claims"
)

// Pools as nri-accel's Status answers them.
var pools = []claims.StatusPool{
	{Name: "whole", Family: "exclusive", Devices: []claims.StatusDevice{{ID: "accel0", UnitsTotal: 1}, {ID: "GPU_1", UnitsTotal: 1}}},
	{Name: "shared", Family: "shared", Devices: []claims.StatusDevice{{ID: "shared0", UnitsTotal: 2}}},
}

func TestPickNamesDevicesAsNriAccelPublishesThem(t *testing.T) {
	got, err := pick(pools, []string{"GPU_1", "accel0"})
	if err != nil {
		t.Fatal(err)
	}
	want := []device{
		{ID: "GPU_1", Pool: "whole", Name: "whole-gpu-1"},
		{ID: "accel0", Pool: "whole", Name: "whole-accel0"},
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("got %+v, want %+v", got, want)
	}
}

func TestPickRefusesUnknownAndNonExclusiveDevices(t *testing.T) {
	for id, want := range map[string]string{
		"accel9":  "device accel9 is in no pool",
		"shared0": "device shared0 is in pool shared of family shared",
	} {
		_, err := pick(pools, []string{"accel0", id})
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%s: got %v, want an error containing %q", id, err, want)
		}
	}
}
