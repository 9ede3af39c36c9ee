package natsconf

import (
	"os"
	"testing"

	"github.com/nats-io/nats-server/v2/server"

	"assay.dev/pkg/event"
)

func namesOf(installation, cell string) event.Names {
	return event.Names{Installation: installation, Cell: cell}
}

// The shipped configuration is the generator's output for the default
// installation and cells: a change to a stream, subject or durable name
// shows up here, not as a permission error in production.
func TestShippedConfigIsGenerated(t *testing.T) {
	t.Parallel()
	shipped, err := os.ReadFile("../../../../deploy/nats/assay.conf")
	if err != nil {
		t.Fatal(err)
	}
	if want := Render("assay", []string{"us", "eu"}); string(shipped) != want {
		t.Fatal("deploy/nats/assay.conf differs from `assay nats-config`; run it again: cd cmd/assay && go run . nats-config > ../../deploy/nats/assay.conf")
	}
}

// What it writes is a configuration nats-server accepts, for any
// installation and set of cells.
func TestRenderParses(t *testing.T) {
	for _, cells := range [][]string{{"us", "eu"}, {"ap"}, {"us-1", "us-2"}} {
		for _, inst := range []string{"assay", "staging-2"} {
			dir := t.TempDir()
			for _, c := range cells {
				for _, svc := range append(append([]string(nil), Users...), RegionUsers...) {
					t.Setenv(PasswordVar(namesOf(inst, c), svc), "p0123456789abcdef")
				}
			}
			path := dir + "/nats.conf"
			if err := os.WriteFile(path, []byte(Render(inst, cells)), 0o600); err != nil {
				t.Fatal(err)
			}
			opts, err := server.ProcessConfigFile(path)
			if err != nil {
				t.Fatalf("%s %v: %v", inst, cells, err)
			}
			if len(opts.Users) != len(cells)*(len(Users)+len(RegionUsers)) || !opts.JetStream {
				t.Fatalf("%s %v: %d users, jetstream %v", inst, cells, len(opts.Users), opts.JetStream)
			}
		}
	}
}
