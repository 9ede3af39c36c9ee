package cell_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"assay.dev/cmd/assay/internal/cell"
	"assay.dev/cmd/assay/internal/cell/celltest"
	"assay.dev/cmd/assay/internal/natsconf"
	"assay.dev/pkg/config"
	"assay.dev/pkg/devkit/sim"
	"assay.dev/pkg/devkit/testenv"
	"assay.dev/pkg/evalset"
	"assay.dev/pkg/event"
	"assay.dev/pkg/store"
	"assay.dev/pkg/telemetry"
	"assay.dev/services/ingress"
)

func cellNames(cell string) event.Names { return event.Names{Installation: "assay", Cell: cell} }

// aclServer starts nats-server with deploy/nats/assay.conf, as shipped but
// for where it listens and stores, and returns a URL maker for its users.
func aclServer(t *testing.T) func(user string) string {
	t.Helper()
	passwords := map[string]string{}
	for _, r := range config.DefaultRegions {
		for _, svc := range append(append([]string(nil), natsconf.Users...), natsconf.RegionUsers...) {
			b := make([]byte, 16)
			_, _ = rand.Read(b)
			// A leading letter: the config parser would read an all-digit
			// value from the environment as a number.
			pw := "p" + hex.EncodeToString(b)
			passwords[natsconf.User(cellNames(r), svc)] = pw
			t.Setenv(natsconf.PasswordVar(cellNames(r), svc), pw)
		}
	}
	opts, err := server.ProcessConfigFile("../../../../deploy/nats/assay.conf")
	if err != nil {
		t.Fatalf("deploy/nats/assay.conf: %v", err)
	}
	opts.Host, opts.Port = "127.0.0.1", -1
	opts.StoreDir = t.TempDir()
	opts.NoSigs, opts.NoLog = true, true
	ns, err := server.NewServer(opts)
	if err != nil {
		t.Fatalf("nats-server: %v", err)
	}
	ns.Start()
	t.Cleanup(func() {
		ns.Shutdown()
		ns.WaitForShutdown()
	})
	if !ns.ReadyForConnections(10 * time.Second) {
		t.Fatal("nats-server not ready for connections within 10s")
	}
	addr, err := url.Parse(ns.ClientURL())
	if err != nil {
		t.Fatal(err)
	}
	return func(user string) string {
		pw, ok := passwords[user]
		if !ok {
			t.Fatalf("no NATS user %q", user)
		}
		return (&url.URL{Scheme: "nats", User: url.UserPassword(user, pw), Host: addr.Host}).String()
	}
}

// lockedBuffer collects a cell's log lines while its services write them.
type lockedBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *lockedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *lockedBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// aclCell runs one region's cell with every service on its own NATS user.
func aclCell(t *testing.T, region string, natsURL func(string) string, simURL string, s *sim.Server,
	tenants []store.TenantSeed, token string) (*celltest.Bundle, *lockedBuffer) {
	t.Helper()
	ctx := context.Background()
	urls := map[string]string{}
	for _, svc := range natsconf.Services {
		urls[svc] = natsURL(natsconf.User(cellNames(region), svc))
	}
	logs := &lockedBuffer{}
	// Env still opens a connection of its own; it gets ingress's user
	// because the server admits no anonymous clients, and no service uses it.
	dbURL := testenv.Database(t)
	cfg := config.Config{Regions: config.DefaultRegions, Region: region, Cell: region, Installation: "assay",
		DatabaseURL: dbURL, NATSURL: urls["ingress"], ModelBaseURL: sim.APIBase(simURL), Model: "assay-sim-1", HTTPAddr: "127.0.0.1:0"}
	// The ingress reads the region's placement map in the region's
	// account, with its cell's placement user.
	c, err := cell.Start(ctx, cell.Options{Config: cfg, NATSURLs: urls,
		Ingress: ingress.Config{PlacementNATSURL: natsURL(natsconf.User(cellNames(region), natsconf.Placement))},
		Log:     telemetry.NewLogger(logs, "test", region, slog.LevelInfo)})
	if err != nil {
		t.Fatalf("start %s cell: %v\n%s", region, err, logs)
	}
	t.Cleanup(func() {
		sctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		c.Stop(sctx)
	})
	if err := c.Env.Store.SeedTenants(ctx, tenants); err != nil {
		t.Fatalf("seed: %v", err)
	}
	return &celltest.Bundle{Cell: c, Sim: s, Token: token, Tenant: tenants[0].ID, HTTP: &http.Client{Timeout: 20 * time.Second},
		DB: testenv.Pool(t, dbURL)}, logs
}

// permissionErrors receives a connection's asynchronous errors; the server
// reports a refused publish or subscription only that way.
type permissionErrors chan error

// expect waits for the server to refuse op ("Publish" or "Subscription") on
// subject. Errors about other subjects, left by earlier checks, are skipped.
func (ch permissionErrors) expect(t *testing.T, op, subject string) {
	t.Helper()
	want := strings.ToLower(fmt.Sprintf("permissions violation for %s to %q", op, subject))
	deadline := time.After(30 * time.Second)
	for {
		select {
		case err := <-ch:
			if errors.Is(err, nats.ErrPermissionViolation) && strings.Contains(strings.ToLower(err.Error()), want) {
				return
			}
		case <-deadline:
			t.Errorf("no permissions violation for %s to %q within 30s", op, subject)
			return
		}
	}
}

func TestNATSACLLeastPrivilege(t *testing.T) {
	// Not parallel: the server configuration takes passwords from the
	// environment.
	natsURL := aclServer(t)
	s := sim.New(sim.Options{})
	simURL, err := s.Start("127.0.0.1:0")
	if err != nil {
		t.Fatalf("sim: %v", err)
	}
	t.Cleanup(func() { _ = s.Close() })

	tenants := []store.TenantSeed{
		{ID: "acme", HomeRegion: "us", Token: store.NewToken()},
		{ID: "globex", HomeRegion: "eu", Token: store.NewToken()},
	}
	us, usLogs := aclCell(t, "us", natsURL, simURL, s, tenants, tenants[0].Token)
	eu, euLogs := aclCell(t, "eu", natsURL, simURL, s, tenants, tenants[1].Token)

	// Each service works with its own credential alone: work goes through
	// ingress, classifier, committer and ledger in both cells.
	for _, tc := range []struct {
		b      *celltest.Bundle
		tenant string
	}{{us, "acme"}, {eu, "globex"}} {
		status, r := tc.b.Submit(t, celltest.CodeReview(evalset.Items()[0], "acl "+tc.tenant))
		if status != http.StatusAccepted {
			t.Fatalf("%s: HTTP %d, want 202", tc.tenant, status)
		}
		if v := tc.b.Wait(t, r.WorkID); *v.Outcome != "accepted" {
			t.Fatalf("%s: outcome %s (%s), want accepted", tc.tenant, *v.Outcome, v.Reason)
		}
		tc.b.WaitLedger(t, tc.tenant, 1)
		resp, err := tc.b.HTTP.Get(tc.b.Cell.URL + "/readyz")
		if err != nil {
			t.Fatalf("readyz: %v", err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Errorf("%s cell /readyz: HTTP %d", tc.b.Cell.Region, resp.StatusCode)
		}
		// Ingress's credential reads every durable's lag for the console.
		op := store.NewToken()
		if err := tc.b.Cell.Env.Store.AddOperatorToken(context.Background(), "ops", op); err != nil {
			t.Fatal(err)
		}
		req, _ := http.NewRequest(http.MethodGet, tc.b.Cell.URL+"/v1/console", nil)
		req.Header.Set("Authorization", "Bearer "+op)
		resp, err = tc.b.HTTP.Do(req)
		if err != nil {
			t.Fatalf("console: %v", err)
		}
		var console ingress.Console
		err = json.NewDecoder(resp.Body).Decode(&console)
		resp.Body.Close()
		if err != nil || len(console.Consumers) != len(tc.b.Names().Durables()) {
			t.Fatalf("%s console: HTTP %d, %v, consumers %+v", tc.b.Cell.Region, resp.StatusCode, err, console.Consumers)
		}
		for _, k := range console.Consumers {
			if k.Error != "" {
				t.Errorf("%s console: ingress cannot read %s: %s", tc.b.Cell.Region, k.Durable, k.Error)
			}
		}
	}
	// A refused ack or publish need not fail the work (redelivery and the
	// sweeper cover for it), so the services' own NATS errors are checked.
	for region, logs := range map[string]*lockedBuffer{"us": usLogs, "eu": euLogs} {
		for _, l := range strings.Split(logs.String(), "\n") {
			if strings.Contains(strings.ToLower(l), "permissions violation") {
				t.Errorf("%s cell: a service was refused by NATS: %s", region, l)
			}
		}
	}

	anon, _ := url.Parse(natsURL("assay-us-ingress"))
	for _, u := range []*url.Userinfo{nil, url.UserPassword("nobody", "x"), url.UserPassword("assay-us-classifier", "x")} {
		anon.User = u
		if nc, err := nats.Connect(anon.String()); err == nil {
			nc.Close()
			t.Errorf("connected as %v", u)
		}
	}

	// The US classifier's credential, on its own.
	errs := make(permissionErrors, 64)
	nc, err := nats.Connect(natsURL("assay-us-classifier"), nats.PermissionErrOnSubscribe(true),
		nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) {
			select {
			case errs <- err:
			default:
			}
		}))
	if err != nil {
		t.Fatalf("connect as us-classifier: %v", err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	call := func() (context.Context, context.CancelFunc) {
		// A refused request is dropped, not answered: it ends by timeout.
		return context.WithTimeout(context.Background(), time.Second)
	}
	// The credential itself works for what the classifier does: an
	// answer, given all the time it takes on a loaded machine.
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	if _, err := js.Consumer(ctx, "ASSAY_WORK_US", "assay-classifier-interactive"); err != nil {
		t.Errorf("us-classifier reads its own consumer: %v", err)
	}
	cancel()

	for _, subj := range []string{"assay.eu.work.interactive.acme", "assay.eu.result.acme", "assay.us.work.interactive.acme"} {
		if err := nc.Publish(subj, []byte("{}")); err != nil {
			t.Fatalf("publish %s: %v", subj, err)
		}
		if err := nc.Flush(); err != nil {
			t.Fatalf("flush: %v", err)
		}
		errs.expect(t, "Publish", subj)
	}
	ctx, cancel = call()
	if _, err := js.Publish(ctx, "assay.us.work.interactive.acme", []byte("{}")); err == nil {
		t.Error("us-classifier published work to WORK_US through JetStream")
	}
	cancel()
	errs.expect(t, "Publish", "assay.us.work.interactive.acme")

	for _, subj := range []string{"assay.eu.>", "assay.us.work.>", "assay.us.attempt.>"} {
		sub, err := nc.SubscribeSync(subj)
		if err != nil {
			t.Fatalf("subscribe %s: %v", subj, err)
		}
		if _, err := sub.NextMsg(5 * time.Second); !errors.Is(err, nats.ErrPermissionViolation) {
			t.Errorf("subscribe %s: %v, want a permissions violation", subj, err)
		}
		errs.expect(t, "Subscription", subj)
	}

	// JetStream API calls on EU streams, and reads of ATTEMPT_US, which the
	// classifier writes but never reads.
	apiChecks := []struct {
		what, subject string
		do            func(context.Context) error
	}{
		{"create a consumer on WORK_EU", "$JS.API.CONSUMER.CREATE.ASSAY_WORK_EU.classifier", func(ctx context.Context) error {
			_, err := js.CreateOrUpdateConsumer(ctx, "ASSAY_WORK_EU", jetstream.ConsumerConfig{Durable: "classifier",
				AckPolicy: jetstream.AckExplicitPolicy})
			return err
		}},
		{"read WORK_EU's info", "$JS.API.STREAM.INFO.ASSAY_WORK_EU", func(ctx context.Context) error {
			_, err := js.Stream(ctx, "ASSAY_WORK_EU")
			return err
		}},
		{"create WORK_EU", "$JS.API.STREAM.CREATE.ASSAY_WORK_EU", func(ctx context.Context) error {
			_, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "ASSAY_WORK_EU", Subjects: []string{"assay.eu.work.>"}})
			return err
		}},
		{"create a consumer on ATTEMPT_US", "$JS.API.CONSUMER.CREATE.ASSAY_ATTEMPT_US.snoop", func(ctx context.Context) error {
			_, err := js.CreateOrUpdateConsumer(ctx, "ASSAY_ATTEMPT_US", jetstream.ConsumerConfig{Durable: "snoop",
				AckPolicy: jetstream.AckExplicitPolicy})
			return err
		}},
		{"look up the ledger's consumer", "$JS.API.CONSUMER.INFO.ASSAY_ATTEMPT_US.assay-ledger", func(ctx context.Context) error {
			_, err := js.Consumer(ctx, "ASSAY_ATTEMPT_US", "assay-ledger")
			return err
		}},
		{"pull from the ledger's consumer", "$JS.API.CONSUMER.MSG.NEXT.ASSAY_ATTEMPT_US.assay-ledger", func(ctx context.Context) error {
			_, err := nc.RequestWithContext(ctx, "$JS.API.CONSUMER.MSG.NEXT.ASSAY_ATTEMPT_US.assay-ledger", []byte(`{"batch":1}`))
			return err
		}},
		{"get a message from ATTEMPT_US", "$JS.API.STREAM.MSG.GET.ASSAY_ATTEMPT_US", func(ctx context.Context) error {
			st, err := js.Stream(ctx, "ASSAY_ATTEMPT_US")
			if err != nil {
				return fmt.Errorf("unexpected: its own stream's info: %w", err)
			}
			_, err = st.GetMsg(ctx, 1)
			return err
		}},
	}
	for _, c := range apiChecks {
		ctx, cancel := call()
		if err := c.do(ctx); err == nil || strings.HasPrefix(err.Error(), "unexpected") {
			t.Errorf("us-classifier could %s (err %v)", c.what, err)
		}
		cancel()
		errs.expect(t, "Publish", c.subject)
	}

	// Nothing the US credential sent reached the EU cell's stream.
	euJS, err := jetstream.New(eu.Cell.Env.NC)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel = context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	st, err := euJS.Stream(ctx, "ASSAY_WORK_EU")
	if err != nil {
		t.Fatalf("WORK_EU as eu-ingress: %v", err)
	}
	info, err := st.Info(ctx, jetstream.WithSubjectFilter("assay.eu.work.>"))
	if err != nil {
		t.Fatalf("WORK_EU info: %v", err)
	}
	if n := info.State.Subjects["assay.eu.work.interactive.acme"]; n != 0 {
		t.Errorf("WORK_EU holds %d messages for acme from the US credential", n)
	}
	for subj := range info.State.Subjects {
		if !strings.HasSuffix(subj, ".globex") {
			t.Errorf("WORK_EU holds a message on %s", subj)
		}
	}
}

// The operator's user reads a cell's streams as assay streams and assay
// replay do: stream and consumer info, and an ordered consumer of its own,
// created, read to the end and deleted. It can neither read from, change
// nor delete a service's durable, publish to a stream, nor see another
// cell.
func TestNATSOpsUserReadsButCannotTouchDurables(t *testing.T) {
	natsURL := aclServer(t)
	s := sim.New(sim.Options{})
	simURL, err := s.Start("127.0.0.1:0")
	if err != nil {
		t.Fatalf("sim: %v", err)
	}
	t.Cleanup(func() { _ = s.Close() })
	tenants := []store.TenantSeed{{ID: "acme", HomeRegion: "us", Token: store.NewToken()}}
	us, _ := aclCell(t, "us", natsURL, simURL, s, tenants, tenants[0].Token)
	for i := range 3 {
		_, r := us.Submit(t, celltest.CodeReview(evalset.Items()[i], fmt.Sprintf("ops %d", i)))
		us.Wait(t, r.WorkID)
	}
	us.WaitLedger(t, "acme", 3)

	errs := make(permissionErrors, 64)
	nc, err := nats.Connect(natsURL(natsconf.User(cellNames("us"), natsconf.Ops)),
		nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) {
			select {
			case errs <- err:
			default:
			}
		}))
	if err != nil {
		t.Fatalf("connect as us-ops: %v", err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	n := cellNames("us")
	for _, kind := range event.Kinds {
		st, err := js.Stream(ctx, n.Stream(kind))
		if err != nil {
			t.Fatalf("ops: stream %s info: %v", kind, err)
		}
		want := st.CachedInfo().State.Msgs
		var durables int
		for range st.ListConsumers(ctx).Info() {
			durables++
		}
		if durables == 0 {
			t.Errorf("ops: no consumers listed on %s", kind)
		}
		oc, err := st.OrderedConsumer(ctx, jetstream.OrderedConsumerConfig{})
		if err != nil {
			t.Fatalf("ops: ordered consumer on %s: %v", kind, err)
		}
		var got uint64
		for got < want {
			batch, err := oc.Fetch(int(want-got), jetstream.FetchMaxWait(5*time.Second))
			if err != nil {
				t.Fatalf("ops: fetch from %s: %v", kind, err)
			}
			k := 0
			for range batch.Messages() {
				k++
			}
			if k == 0 {
				t.Fatalf("ops: read %d of %d messages of %s, then nothing (%v)", got, want, kind, batch.Error())
			}
			got += uint64(k)
		}
		name := oc.CachedInfo().Name
		if err := js.DeleteConsumer(ctx, n.Stream(kind), name); err != nil {
			t.Errorf("ops: delete its own consumer %s on %s: %v", name, kind, err)
		}
	}

	call := func() (context.Context, context.CancelFunc) {
		return context.WithTimeout(context.Background(), time.Second)
	}
	work, result := n.Stream(event.KindWork), n.Stream(event.KindAttempt)
	c1, cl1 := call()
	if err := js.DeleteConsumer(c1, result, n.ResultConsumer()); err == nil {
		t.Error("ops deleted the committer's durable")
	}
	cl1()
	c2, cl2 := call()
	if _, err := js.CreateOrUpdateConsumer(c2, work, jetstream.ConsumerConfig{Durable: n.WorkConsumer(event.Batch),
		FilterSubject: n.Lane(event.Batch), AckPolicy: jetstream.AckExplicitPolicy, MaxDeliver: 1}); err == nil {
		t.Error("ops changed the classifier's batch durable")
	}
	cl2()
	if err := nc.Publish(n.Work(event.Interactive, "acme"), []byte("{}")); err != nil {
		t.Fatal(err)
	}
	errs.expect(t, "Publish", n.Work(event.Interactive, "acme"))
	next := "$JS.API.CONSUMER.MSG.NEXT." + result + "." + n.ResultConsumer()
	if err := nc.Publish(next, []byte(`{"batch":1}`)); err != nil {
		t.Fatal(err)
	}
	errs.expect(t, "Publish", next)
	c3, cl3 := call()
	if _, err := js.Stream(c3, cellNames("eu").Stream(event.KindWork)); err == nil {
		t.Error("the us ops user read the eu cell's WORK stream")
	}
	cl3()
	// The durables are as the services made them.
	for _, d := range []struct{ stream, name string }{{result, n.ResultConsumer()}, {work, n.WorkConsumer(event.Batch)}} {
		info, err := us.Cell.Env.JS.Consumer(ctx, d.stream, d.name)
		if err != nil {
			t.Fatalf("%s: %v", d.name, err)
		}
		if info.CachedInfo().Config.MaxDeliver == 1 {
			t.Errorf("%s was changed", d.name)
		}
	}
}
