package main

import (
	"reflect"
	"strings"
	"testing"
)

// A status document as nri-accel writes it (the parts read here, and one part more).
const doc = `{"gate":{"open":true},"policy":{"pools":[
 {"name":"whole","family":"exclusive","devices":[{"id":"accel0","units_total":1},{"id":"GPU_1","units_total":1}]},
 {"name":"shared","family":"shared","devices":[{"id":"shared0","units_total":2}]}]}}`

func TestParseInventoryNamesDevicesAsNriAccelPublishesThem(t *testing.T) {
	got, err := parseInventory([]byte(doc), []string{"GPU_1", "accel0"})
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

func TestParseInventoryRefusesUnknownAndNonExclusiveDevices(t *testing.T) {
	for id, want := range map[string]string{
		"accel9":  "device accel9 is in no pool",
		"shared0": "device shared0 is in pool shared of family shared",
	} {
		_, err := parseInventory([]byte(doc), []string{"accel0", id})
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%s: got %v, want an error containing %q", id, err, want)
		}
	}
	if _, err := parseInventory([]byte("{"), []string{"accel0"}); err == nil {
		t.Error("a document that does not decode was accepted")
	}
}
