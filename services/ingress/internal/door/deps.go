package door

import (
	"log/slog"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"assay.dev/pkg/contract"
	"assay.dev/pkg/telemetry"
)

// JetStream is what ingress asks of NATS JetStream; a
// jetstream.JetStream is one.
type JetStream interface {
	jetstream.Publisher             // the outbox relay's announcements
	jetstream.StreamManager         // the WORK stream and its messages
	jetstream.StreamConsumerManager // the cell's consumers, read for their backlog
	jetstream.KeyValueManager       // the placement, capacity and admission buckets
	// Conn is the connection, read for the largest payload its server
	// takes.
	Conn() *nats.Conn
}

var _ JetStream = jetstream.JetStream(nil)

// Deps are what ingress talks to.
type Deps struct {
	Store     Store
	JS        JetStream
	Contracts *contract.Registry
	Log       *slog.Logger
	Tel       *telemetry.Provider
}
