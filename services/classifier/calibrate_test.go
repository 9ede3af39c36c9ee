package classifier

import "testing"

// Before any call a part is counted at its reservation; after, at the
// 90th percentile of what recent calls were billed against what they
// reserved, over the last calibrationCalls calls.
func TestCalibration(t *testing.T) {
	t.Parallel()
	var c calibration
	if got := c.project(3600); got != 3600 {
		t.Fatalf("uncalibrated: %d, want the reservation 3600", got)
	}
	for i := range 10 {
		c.observe(1000, int64(50+i)) // ratios 0.050 … 0.059
	}
	if r, n := c.ratio(); n != 10 || r != 0.058 {
		t.Fatalf("ratio %v over %d calls, want 0.058 (the 9th of 10) over 10", r, n)
	}
	if got := c.project(3600); got != 209 {
		t.Fatalf("calibrated: %d, want ceil(3600 × 0.058) = 209", got)
	}
	for range calibrationCalls {
		c.observe(1000, 500)
	}
	if r, n := c.ratio(); n != calibrationCalls || r != 0.5 {
		t.Fatalf("after %d more calls: ratio %v over %d, want 0.5 over %d", calibrationCalls, r, n, calibrationCalls)
	}
	c.observe(0, 10) // no reservation: says nothing
	if _, n := c.ratio(); n != calibrationCalls {
		t.Fatalf("a call without a reservation was counted")
	}
}
