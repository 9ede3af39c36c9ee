package publish

import (
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"assay.dev/pkg/store"
)

// The test vector of the Standard Webhooks reference libraries
// (standard-webhooks/standard-webhooks, libraries/go/webhook_test.go,
// TestWebhookSign): this secret, id, timestamp and payload sign as this
// signature.
func TestSignatureTestVector(t *testing.T) {
	t.Parallel()
	const (
		secret  = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
		id      = "msg_p5jXN8AQM9LWM0D4loKWxJek"
		payload = `{"test": 2432232314}`
		want    = "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE="
	)
	at := time.Unix(1614265330, 0)
	got, err := Sign(secret, id, at, []byte(payload))
	if err != nil || got != want {
		t.Fatalf("Sign = %q, %v; want %q", got, err, want)
	}
	h := http.Header{}
	h.Set(HeaderID, id)
	h.Set(HeaderTimestamp, "1614265330")
	h.Set(HeaderSignature, "v1,Ceo5qEr07ixe2NLpvHk3FH9bwy/WavXrAFQ/9tdO6mc= "+want)
	if err := Verify(secret, h, []byte(payload), at.Add(time.Minute), 5*time.Minute); err != nil {
		t.Fatalf("Verify of the vector: %v", err)
	}
	if err := Verify(secret, h, []byte(payload+" "), at, 5*time.Minute); err == nil {
		t.Fatal("a changed body verified")
	}
	if err := Verify(secret, h, []byte(payload), at.Add(6*time.Minute), 5*time.Minute); err == nil {
		t.Fatal("a stale timestamp verified")
	}
}

// A tenant's callback is signed, carries the outcome id as its webhook-id
// on every try, is retried with a growing backoff after failures, and is
// sent once however often the outcome is delivered.
func TestCallbackSignedAndRetried(t *testing.T) {
	t.Parallel()
	b := setup(t, func(c *Config) { c.Backoff = Backoff{Base: 200 * time.Millisecond, Cap: 300 * time.Millisecond} })
	secret := store.NewCallbackSecret()
	var mu sync.Mutex
	var got []struct {
		at  time.Time
		id  string
		err error
	}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		mu.Lock()
		defer mu.Unlock()
		got = append(got, struct {
			at  time.Time
			id  string
			err error
		}{time.Now(), r.Header.Get(HeaderID), Verify(secret, r.Header, body, time.Now(), 5*time.Minute)})
		if len(got) <= 2 || !strings.Contains(string(body), `"outcome":"accepted"`) {
			http.Error(w, "not now", http.StatusServiceUnavailable)
			return
		}
		w.WriteHeader(http.StatusNoContent)
	}))
	t.Cleanup(srv.Close)
	if err := b.st.SetCallback(t.Context(), "acme", store.Callback{URL: srv.URL, Secret: secret}); err != nil {
		t.Fatal(err)
	}
	b.start(t)
	w := b.accepted(t, 6)
	ev := outcomeOf(w)
	b.deliver(t, ev, 1)
	waitFor(t, "the callback delivered", func() bool {
		p, err := b.st.GetPublication(t.Context(), w.ID, TargetCallback)
		return err == nil && !p.PublishedAt.IsZero()
	})
	b.deliver(t, ev, 2)
	waitFor(t, "the redeliveries acknowledged", func() bool { return b.ackedAll(t) })
	mu.Lock()
	defer mu.Unlock()
	if len(got) != 3 {
		t.Fatalf("the endpoint got %d callbacks, want 3 (two failures, one success, nothing for the redeliveries)", len(got))
	}
	for i, c := range got {
		if c.err != nil || c.id != ev.OutcomeID {
			t.Errorf("callback %d: id %q (want %q), signature: %v", i, c.id, ev.OutcomeID, c.err)
		}
	}
	// Backoff after the first failure, then doubled to the cap, each wait
	// drawn from the upper half of its interval.
	for i, want := range []time.Duration{100 * time.Millisecond, 150 * time.Millisecond} {
		if gap := got[i+1].at.Sub(got[i].at); gap < want {
			t.Errorf("try %d came %s after the failure, before its least backoff of %s", i+2, gap, want)
		}
	}
	t.Logf("callback tries %s and %s apart, each signed with webhook-id %s", got[1].at.Sub(got[0].at), got[2].at.Sub(got[1].at), ev.OutcomeID)
}
