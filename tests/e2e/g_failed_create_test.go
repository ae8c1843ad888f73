package e2e

import (
	"testing"
	"time"
)

// Scenario g4 (issue 25 item 9): a create that fails after nri-accel answered CreateContainer, with
// a command that does not exist. CRI-O fails it at create (runc create) and sends no NRI event for
// it; containerd creates it and fails the start. Either way what nri-accel granted for it comes
// back: the pod's retry of the same container gets the device, and a pod that goes away after
// such a failure leaves nothing held. And (issue 39 item 4) on CRI-O a failed create whose pod
// neither retries nor goes loses its grant within nri.unconfirmed_grant_secs (5 s here): CRI-O
// never reports the container, so the bound frees it; while a running container, reported
// created, keeps its grant past the bound on both runtimes.
func TestG_FailedCreateReleases(t *testing.T) {
	eachVersion(t, func(t *testing.T, v string) {
		const bound = 5
		n := startNode(t, v, "device-nodes", NodeOptions{Layout: defaultLayout(t, 1), UnconfirmedGrantSecs: bound})

		// failCreate creates container "app" of p with a missing command; answers the ID of a
		// container that was created (and failed to start), "" when the create failed.
		failCreate := func(p *Pod) string {
			t.Helper()
			id, err := n.CRI.CreateContainerCommand(p, "app", []string{"/no/such/command"})
			if err != nil {
				t.Logf("%s: the create failed: %v", p.Config.Metadata.Name, err)
				return ""
			}
			if err := n.CRI.StartContainer(id); err == nil {
				t.Fatalf("a container whose command does not exist started")
			} else {
				t.Logf("%s: the start failed: %v", p.Config.Metadata.Name, err)
			}
			return id
		}
		// failOnce is failCreate, then the removal of a created container, as the kubelet does
		// before it retries.
		failOnce := func(p *Pod) {
			t.Helper()
			if id := failCreate(p); id != "" {
				if err := n.CRI.RemoveContainer(id); err != nil {
					t.Fatalf("removing the failed container: %v", err)
				}
			}
		}

		// The retry in the same pod gets the device.
		p := n.mustRunPod(t, "broken", annotation("app", exclusiveAsk))
		failOnce(p)
		id, err := n.CRI.Run(p, "app")
		if err != nil {
			t.Fatalf("the pod's retry after a failed create: %v\n%s", err, tail(n.Accel.Log, 20))
		}
		if view, err := n.viewDevice(t, id, n.Devs.Path(0)); err != nil || view.Minor != 0 {
			t.Errorf("the retry's device: %+v %v", view, err)
		}
		if st := n.status(t); len(st.Claims()) != 1 {
			t.Errorf("claims after the retry: %v; want the retry's only", st.Claims())
		}
		n.assertNoDoubleGrant(t)
		if err := n.CRI.RemovePod(p.ID); err != nil {
			t.Fatalf("removing the pod: %v", err)
		}
		if !waitFor(10*time.Second, func() bool { st, _ := n.Accel.Status(); return st != nil && len(st.Claims()) == 0 }) {
			t.Fatalf("the retry's claim was not released with its pod: %v", n.status(t).Claims())
		}

		// A pod removed right after a failed create, with no retry: nothing stays held.
		gone := n.mustRunPod(t, "broken-gone", annotation("app", exclusiveAsk))
		failOnce(gone)
		if err := n.CRI.RemovePod(gone.ID); err != nil {
			t.Fatalf("removing the pod: %v", err)
		}
		if !waitFor(10*time.Second, func() bool { st, _ := n.Accel.Status(); return st != nil && len(st.Claims()) == 0 }) {
			t.Errorf("a failed create's grant outlived its pod: %v", n.status(t).Claims())
		}
		n.assertNothingHeld(t)

		// A failed create whose pod stays and never retries, on CRI-O, where the container
		// never comes to exist: the grant goes within the bound (the wait is generous; the log
		// says when it went), and another pod gets the device. containerd creates the container
		// (PostCreateContainer) and fails its start: that container exists, and keeps its grant
		// until it is removed (above).
		pods := []*Pod{}
		if isCrio(v) {
			stays := n.mustRunPod(t, "broken-stays", annotation("app", exclusiveAsk))
			pods = append(pods, stays)
			failed := time.Now()
			if id := failCreate(stays); id != "" {
				t.Fatalf("CRI-O created a container whose command does not exist: %s", id)
			}
			if !waitFor(6*bound*time.Second, func() bool { st, _ := n.Accel.Status(); return st != nil && len(st.Claims()) == 0 }) {
				t.Fatalf("a failed create's grant is still held %v after the failure, with nri.unconfirmed_grant_secs %d: %v\n%s",
					time.Since(failed).Round(time.Second), bound, n.status(t).Claims(), tail(n.Accel.Log, 20))
			}
			t.Logf("the failed create's grant went %v after the failure", time.Since(failed).Round(100*time.Millisecond))
		}
		next := n.mustRunPod(t, "after-broken", annotation("app", exclusiveAsk))
		pods = append(pods, next)
		id, err = n.CRI.Run(next, "app")
		if err != nil {
			t.Fatalf("a pod after a failed create that stays: %v\n%s", err, tail(n.Accel.Log, 20))
		}
		if view, err := n.viewDevice(t, id, n.Devs.Path(0)); err != nil || view.Minor != 0 {
			t.Errorf("the next pod's device: %+v %v", view, err)
		}
		// The running container keeps its grant past the bound (it was reported created).
		time.Sleep(2 * bound * time.Second)
		if st := n.status(t); len(st.Claims()) != 1 {
			t.Errorf("claims %ds after a running container's grant: %v; want its own", 2*bound, st.Claims())
		}
		n.assertNoDoubleGrant(t)
		for _, p := range pods {
			if err := n.CRI.RemovePod(p.ID); err != nil {
				t.Fatalf("removing the pod: %v", err)
			}
		}
		if !waitFor(10*time.Second, func() bool { st, _ := n.Accel.Status(); return st != nil && len(st.Claims()) == 0 }) {
			t.Errorf("claims left after the pods went: %v", n.status(t).Claims())
		}
		n.assertNothingHeld(t)
	})
}
