package e2e

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// envInt reads an integer knob from the environment.
func envInt(name string, def int) int {
	if v, err := strconv.Atoi(os.Getenv(name)); err == nil && v > 0 {
		return v
	}
	return def
}

// Scenario i: several create/remove loops at once asking for devices that come with CPUs
// (cpus_per_device: 1), beside a bystander whose cpuset moves with every grant and release, for
// NRI_ACCEL_E2E_CHURN_SECONDS (default 60). A health check creates a container under a deadline
// every few seconds (a hung containerd still answers list calls). Asserts: no hang (else the
// goroutine dump is kept), no failure other than nri-accel's own refusal, no double grant, and
// nothing held at the end.
func TestI_ConcurrentChurn(t *testing.T) {
	seconds := envInt("NRI_ACCEL_E2E_CHURN_SECONDS", 60)
	loops := envInt("NRI_ACCEL_E2E_CHURN_LOOPS", 4)
	eachVersionAndMode(t, func(t *testing.T, v, mode string) {
		layout := defaultLayout(t, 1)
		layout.WholeDevices = 2
		n := startNode(t, v, mode, NodeOptions{Layout: layout})
		bp := n.mustRunPod(t, "bystander", nil)
		bystander := n.mustRun(t, bp, "idle")
		health := n.mustRunPod(t, "health", nil)

		ctx, cancel := context.WithTimeout(context.Background(), time.Duration(seconds)*time.Second)
		defer cancel()
		var (
			grants, refusals, healthChecks atomic.Int64
			mu                             sync.Mutex
			failures                       []string
		)
		fail := func(format string, args ...any) {
			mu.Lock()
			defer mu.Unlock()
			failures = append(failures, fmt.Sprintf(format, args...))
			cancel()
		}
		// Every CRI call of the churn has a deadline: past it, containerd is taken as hung.
		cri, err := dialCRI(n.RT.CRISocket())
		must(t, err)
		defer cri.Close()
		cri.Timeout = 30 * time.Second

		var wg sync.WaitGroup
		for l := 0; l < loops; l++ {
			wg.Add(1)
			go func(l int) {
				defer wg.Done()
				for i := 0; ctx.Err() == nil; i++ {
					p, err := cri.RunPod(fmt.Sprintf("churn-%d-%d", l, i), annotation("app", exclusiveAsk))
					if err != nil {
						fail("loop %d: RunPodSandbox: %v", l, err)
						return
					}
					if _, err := cri.Run(p, "app"); err != nil {
						if strings.Contains(err.Error(), "refused") && strings.Contains(err.Error(), "claim ctr-") {
							refusals.Add(1)
						} else {
							fail("loop %d iteration %d: create/start: %v", l, i, err)
						}
					} else {
						grants.Add(1)
					}
					if err := cri.RemovePod(p.ID); err != nil {
						fail("loop %d iteration %d: RemovePodSandbox: %v", l, i, err)
						return
					}
				}
			}(l)
		}
		// Health check: a plain container is created and removed under a deadline.
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; ctx.Err() == nil; i++ {
				hc, err := dialCRI(n.RT.CRISocket())
				if err != nil {
					fail("health: dial: %v", err)
					return
				}
				hc.Timeout = 30 * time.Second
				id, err := hc.Run(health, fmt.Sprintf("check-%d", i))
				if err == nil {
					err = hc.RemoveContainer(id)
				}
				hc.Close()
				if err != nil {
					fail("health check %d: the runtime did not create a plain container within 30 s: %v", i, err)
					return
				}
				healthChecks.Add(1)
				// No exclusive device held twice at any sampled moment.
				if st, err := n.Accel.Status(); err == nil {
					for dev, claims := range st.Held() {
						if strings.HasPrefix(dev, "accel") && len(claims) > 1 {
							fail("health check %d: %s held by %v", i, dev, claims)
						}
					}
				}
				select {
				case <-ctx.Done():
				case <-time.After(3 * time.Second):
				}
			}
		}()
		wg.Wait()
		t.Logf("churn on %s/%s: %d loops, %d s: %d grants, %d refusals, %d health checks",
			v, mode, loops, seconds, grants.Load(), refusals.Load(), healthChecks.Load())
		if len(failures) > 0 {
			n.RT.Dump()
			t.Fatalf("churn failed (%d grants before): %s", grants.Load(), strings.Join(failures, "\n"))
		}
		if grants.Load() == 0 {
			t.Fatal("the churn granted nothing")
		}
		n.assertNoDoubleGrant(t)
		if !waitFor(10*time.Second, func() bool { st, _ := n.Accel.Status(); return st != nil && len(st.Claims()) == 0 }) {
			t.Errorf("claims left after the churn: %v", n.status(t).Claims())
		}
		n.assertNothingHeld(t)
		if !n.awaitCPUs(t, bystander, layout.CPUs) {
			t.Errorf("bystander's cpuset %q after the churn, want all CPUs %s", n.cpusInside(t, bystander), layout.CPUs)
		}
	})
}
