// Package natsconf writes the least-privilege NATS server configuration of
// an installation: one account per cell, one user per service, each user
// allowed only its own subjects and the exact JetStream API calls its
// service makes; and one account per region for the map of which cell
// serves which tenant, the one thing a region's cells share. The names come from the same code the services name their
// streams, subjects and durables with, so the configuration cannot drift
// from them; deploy/nats/assay.conf is its output for the default
// installation and cells.
package natsconf

import (
	"fmt"
	"strings"

	"assay.dev/pkg/event"
)

// Services are the services that connect to NATS, in the order they are
// listed.
var Services = []string{"ingress", "classifier", "committer", "ledger"}

// Ops is the operator's user of a cell: what assay streams, assay replay
// and assay work show read the streams with.
const Ops = "ops"

// Users are every user of a cell: the services, then the operator's.
var Users = append(append([]string(nil), Services...), Ops)

// The users each cell has in its region's account: its ingress's, which
// reads the placement map and registers where the cell answers, and its
// operator's, which places tenants.
const (
	Placement = "placement"
	Placer    = "placer"
	// Publisher is the cell's committer's user in the region's account,
	// where the GitHub write budgets are shared.
	Publisher = "publisher"
)

// RegionUsers are a cell's users in its region's account.
var RegionUsers = []string{Placement, Placer, Publisher}

// Cell is a cell of the installation and the region it serves.
type Cell struct{ ID, Region string }

// ParseCell reads a cell as --cells gives it: "us-2:us" is cell us-2 of
// region us, and "us" alone the cell named after its region.
func ParseCell(spec string) (Cell, error) {
	id, region, ok := strings.Cut(spec, ":")
	if !ok {
		region = id
	}
	if !event.ValidToken(id) || !event.ValidToken(region) {
		return Cell{}, fmt.Errorf("%q is not a cell (a name, or cell:region; lower-case letters, digits, hyphens)", spec)
	}
	return Cell{ID: id, Region: region}, nil
}

// RegionAccount is the NATS account of a region's placement map.
func RegionAccount(installation, region string) string {
	return strings.ToUpper(strings.ReplaceAll(installation+"_placement_"+region, "-", "_"))
}

// Account is the NATS account of a cell: the hard wall between cells.
func Account(n event.Names) string {
	return strings.ToUpper(strings.ReplaceAll(n.Installation+"_"+n.Cell, "-", "_"))
}

// User is a service's NATS user in a cell.
func User(n event.Names, service string) string { return n.Installation + "-" + n.Cell + "-" + service }

// PasswordVar is the server's environment variable that holds a user's
// password (plain, or a bcrypt hash).
func PasswordVar(n event.Names, service string) string {
	return Account(n) + "_" + strings.ToUpper(service) + "_NATS_PASSWORD"
}

// Render is the server configuration for the cells of an installation,
// each given as ParseCell reads it (a spec it cannot read is a cell named
// by the whole of it).
func Render(installation string, cells []string) string {
	var b strings.Builder
	b.WriteString(header)
	b.WriteString("\naccounts {\n")
	var regions []string
	members := map[string][]event.Names{}
	for _, spec := range cells {
		c, err := ParseCell(spec)
		if err != nil {
			c = Cell{ID: spec, Region: spec}
		}
		n := event.Names{Installation: installation, Cell: c.ID}
		fmt.Fprintf(&b, "  %s {\n    jetstream: enabled\n    users [\n", Account(n))
		for _, u := range Users {
			writeUser(&b, n, u, grants(n, u))
		}
		b.WriteString("    ]\n  }\n")
		if members[c.Region] == nil {
			regions = append(regions, c.Region)
		}
		members[c.Region] = append(members[c.Region], n)
	}
	for _, region := range regions {
		fmt.Fprintf(&b, "  %s {\n    jetstream: enabled\n    users [\n", RegionAccount(installation, region))
		for _, n := range members[region] {
			for _, u := range RegionUsers {
				writeUser(&b, n, u, regionGrant(n, region, u))
			}
		}
		b.WriteString("    ]\n  }\n")
	}
	b.WriteString("}\n")
	return b.String()
}

const header = `# assay NATS server: one account per cell, one user per service.
# Written by "assay nats-config"; do not edit by hand, run it again.
#
# Accounts are the hard wall: subjects, streams and consumers of one account
# do not exist for another, so one cell's credential cannot even name
# another cell's stream. What a region's cells share, the map of which cell
# serves which tenant, is the one bucket of a region's account, where each
# cell has two users: its ingress's, which reads the map and writes only
# where its own cell answers, and its operator's, which places tenants. Inside an account each user may publish only to its
# own subjects and to the exact JetStream API calls its service makes;
# everything else is denied. Services subscribe only to inboxes (JetStream
# API answers, publish acks and pulled messages all arrive there), and the
# classifier to its cell's cancels. The ops user reads the streams for
# incident review (assay streams, assay replay) through ephemeral consumers
# of its own, and may not touch a service's durable.
#
# Passwords are read from the environment when the server starts (it refuses
# to start if one is unset); "assay nats-config --passwords FILE" writes a
# fresh one per user as an env file. They may be plain text or bcrypt hashes;
# see README.md. Where the server listens and stores is left to its command
# line (-p, -sd) or to a file that includes this one.

jetstream: enabled
`

// grant is one user's permissions.
type grant struct {
	publish   []line
	deny      []string // publish subjects refused even where an allow covers them
	subscribe []string
}

// line is one allowed subject with an optional comment above it.
type line struct{ comment, subject string }

func writeUser(b *strings.Builder, n event.Names, service string, g grant) {
	fmt.Fprintf(b, "      {\n        user: %q\n        password: $%s\n        permissions {\n          publish {\n            allow [\n",
		User(n, service), PasswordVar(n, service))
	for _, l := range g.publish {
		if l.comment != "" {
			fmt.Fprintf(b, "              # %s\n", l.comment)
		}
		fmt.Fprintf(b, "              %q\n", l.subject)
	}
	b.WriteString("            ]\n")
	if len(g.deny) > 0 {
		b.WriteString("            deny [\n")
		for _, d := range g.deny {
			fmt.Fprintf(b, "              %q\n", d)
		}
		b.WriteString("            ]\n")
	}
	b.WriteString("          }\n")
	quoted := make([]string, len(g.subscribe))
	for i, s := range g.subscribe {
		quoted[i] = fmt.Sprintf("%q", s)
	}
	fmt.Fprintf(b, "          subscribe { allow [%s] }\n        }\n      }\n", strings.Join(quoted, ", "))
}

// grants are what one service of a cell may do.
func grants(n event.Names, service string) grant {
	inbox := []string{"_INBOX.>"}
	switch service {
	case "ingress":
		work := n.Stream(event.KindWork)
		return grant{publish: []line{{"The outbox relay and the sweeper publish work and cancels.", n.Subjects(event.KindWork)}},
			subscribe: inbox}.with(owns(work), "It owns the WORK stream: creates it at start, reads it for /readyz.").
			with([]string{"$JS.API.CONSUMER.INFO." + work + "." + n.WorkConsumer(event.Interactive),
				"$JS.API.CONSUMER.INFO." + work + "." + n.WorkConsumer(event.Batch),
				"$JS.API.STREAM.MSG.GET." + work},
				"The sweeper reads how far each lane's consumer got, to tell a lost announcement from a backlog.").
			with([]string{"$JS.API.CONSUMER.INFO." + n.Stream(event.KindResult) + "." + n.ResultConsumer(),
				"$JS.API.CONSUMER.INFO." + n.Stream(event.KindAttempt) + "." + n.ResultConsumer(),
				"$JS.API.CONSUMER.INFO." + n.Stream(event.KindAttempt) + "." + n.AttemptConsumer(),
				"$JS.API.CONSUMER.INFO." + n.Stream(event.KindOutcome) + "." + n.OutcomeConsumer()},
				"The console shows every durable's lag; reading a consumer's info changes nothing.").
			with(watchesKV(n.CapacityBucket()), "It watches the capacity its classifiers report, to refuse what the cell could not serve in time.").
			with(append(owns("KV_"+n.AdmitBucket()), "$JS.API.INFO", "$KV."+n.AdmitBucket()+".>",
				"$JS.API.DIRECT.GET.KV_"+n.AdmitBucket()+".>", "$JS.API.STREAM.MSG.GET.KV_"+n.AdmitBucket()),
				"It owns the admission bucket: the tenants' rates, shared by the cell's ingress instances (making a bucket reads the account's info).")
	case "classifier":
		g := grant{publish: []line{
			{"Attempts, with their results, through its outbox; never work. RESULT holds what earlier releases published.", n.Subjects(event.KindResult)},
			{"", n.Subjects(event.KindAttempt)},
		}, subscribe: append(inbox, n.Cancels())}
		g = g.with(append(owns(n.Stream(event.KindResult)), owns(n.Stream(event.KindAttempt))...),
			"It owns the RESULT and ATTEMPT streams.")
		g = g.with(append(owns("KV_"+n.CapacityBucket()), "$JS.API.INFO", "$KV."+n.CapacityBucket()+".>",
			"$JS.API.CONSUMER.INFO."+n.Stream(event.KindResult)+"."+n.ResultConsumer(),
			"$JS.API.CONSUMER.INFO."+n.Stream(event.KindAttempt)+"."+n.ResultConsumer()),
			"It owns the capacity bucket and reports its service rate and backlog there, the committer's too (making a bucket reads the account's info).")
		calls := n.CallsBucket()
		g = g.with(append(append(owns("KV_"+calls), "$KV."+calls+".>", "$JS.API.DIRECT.GET.KV_"+calls+".>",
			"$JS.API.STREAM.MSG.GET.KV_"+calls), watchesKV(calls)[1:]...),
			"It owns the cell's model-call slots: takes one per call, gives it back, refreshes what it holds and watches what the others hold.")
		for i, lane := range []string{event.Interactive, event.Batch} {
			comment := ""
			if i == 0 {
				comment = "Its durable pull consumer on WORK per lane, created with the lane's filter."
			}
			g = g.with(consumes(n.Stream(event.KindWork), n.WorkConsumer(lane), n.Lane(lane)), comment)
		}
		return g
	case "committer":
		return grant{publish: []line{{"Outcomes through its outbox, for its publisher.", n.Subjects(event.KindOutcome)}},
			subscribe: inbox}.with(owns(n.Stream(event.KindOutcome)), "It owns the OUTCOME stream.").
			with(consumes(n.Stream(event.KindAttempt), n.ResultConsumer(), ""), "Its durable pull consumer on ATTEMPT, whose events carry their results.").
			with(consumes(n.Stream(event.KindResult), n.ResultConsumer(), ""), "Its durable pull consumer on RESULT, for results an earlier release published on their own.").
			with(consumes(n.Stream(event.KindOutcome), n.OutcomeConsumer(), ""), "Its publisher's durable pull consumer on OUTCOME.").
			with(budgetCalls(n.GitHubBucket(n.Cell)), "Its publishers draw each GitHub App installation's write budget from the cell's bucket when no region's is named.")
	case "ledger":
		return grant{subscribe: inbox}.with(consumes(n.Stream(event.KindAttempt), n.AttemptConsumer(), ""),
			"Its durable pull consumer on ATTEMPT.")
	case Ops:
		return opsGrant(n)
	}
	panic("natsconf: unknown service " + service)
}

// placementCalls are the calls on the region's placement bucket of a user who
// makes it if need be, watches it and writes the keys under key (a
// subject, wildcards allowed).
func placementCalls(n event.Names, region, key string) []string {
	pb := n.PlacementBucket(region)
	return append(append(owns("KV_"+pb), "$JS.API.INFO", "$KV."+pb+"."+key), watchesKV(pb)[1:]...)
}

// budgetCalls are the calls on a bucket of GitHub write budgets: make it
// if need be (which reads the account's info), read a key and write it
// under the revision read.
func budgetCalls(bucket string) []string {
	return append(owns("KV_"+bucket), "$JS.API.INFO", "$KV."+bucket+".>", "$JS.API.DIRECT.GET.KV_"+bucket+".>",
		"$JS.API.STREAM.MSG.GET.KV_"+bucket)
}

// opsGrant reads every stream of the cell: its info, its consumers' info,
// and ephemeral ordered consumers of its own (created, pulled without
// acks, deleted). It publishes to no stream, and every API call on a
// service's durable is denied, so a review cannot take, move or delete a
// service's messages.
func opsGrant(n event.Names) grant {
	g := grant{subscribe: []string{"_INBOX.>"}}
	durables := map[string][]string{}
	for _, d := range n.Durables() {
		durables[d.Stream] = append(durables[d.Stream], d.Durable)
	}
	for i, kind := range event.Kinds {
		stream := n.Stream(kind)
		comment := ""
		if i == 0 {
			comment = "Each stream's info and consumers, and ordered consumers of its own on it."
		}
		g = g.with([]string{"$JS.API.STREAM.INFO." + stream, "$JS.API.CONSUMER.LIST." + stream,
			"$JS.API.CONSUMER.INFO." + stream + ".*", "$JS.API.CONSUMER.CREATE." + stream + ".>",
			"$JS.API.CONSUMER.MSG.NEXT." + stream + ".*", "$JS.API.CONSUMER.DELETE." + stream + ".*"}, comment)
		for _, d := range durables[stream] {
			g.deny = append(g.deny, "$JS.API.CONSUMER.CREATE."+stream+"."+d, "$JS.API.CONSUMER.CREATE."+stream+"."+d+".>",
				"$JS.API.CONSUMER.MSG.NEXT."+stream+"."+d, "$JS.API.CONSUMER.DELETE."+stream+"."+d)
		}
	}
	return g
}

// regionGrant is what a cell's user in its region's account may do: watch
// the placement map (making the bucket if need be) and write its keys, the
// ingress's under cell.<its cell>, the operator's under tenant.> and
// moving.> (a tenant held while it moves).
func regionGrant(n event.Names, region, user string) grant {
	g := grant{subscribe: []string{"_INBOX.>"}}
	switch user {
	case Placement:
		return g.with(placementCalls(n, region, "cell."+n.Cell),
			"Its ingress watches the region's placement map, to serve its own tenants and send the others' requests on, and registers where its cell answers.")
	case Placer:
		pb := n.PlacementBucket(region)
		return g.with(append(placementCalls(n, region, "tenant.>"), "$KV."+pb+".moving.>"),
			"Its operator places and moves tenants on the region's cells (assay tenant place, move) and reads where they are.")
	case Publisher:
		return g.with(budgetCalls(n.GitHubBucket(region)),
			"Its committer's publishers draw each GitHub App installation's write budget, shared by every cell of the region.")
	}
	panic("natsconf: unknown region user " + user)
}

// with adds subjects under one comment.
func (g grant) with(subjects []string, comment string) grant {
	for i, s := range subjects {
		l := line{subject: s}
		if i == 0 {
			l.comment = comment
		}
		g.publish = append(g.publish, l)
	}
	return g
}

// owns are the API calls that ensure a stream: CreateOrUpdateStream tries
// the update, then creates on "not found"; the info call serves readiness.
func owns(stream string) []string {
	return []string{"$JS.API.STREAM.INFO." + stream, "$JS.API.STREAM.CREATE." + stream, "$JS.API.STREAM.UPDATE." + stream}
}

// watchesKV are the API calls of a watch on a key-value bucket: its
// stream's info, an ordered consumer of the watcher's own (created with a
// name and filter of its choosing, deleted at the end) and its flow-control
// replies.
func watchesKV(bucket string) []string {
	stream := "KV_" + bucket
	return []string{"$JS.API.STREAM.INFO." + stream, "$JS.API.CONSUMER.CREATE." + stream, "$JS.API.CONSUMER.CREATE." + stream + ".>",
		"$JS.API.CONSUMER.DELETE." + stream + ".*", "$JS.FC." + stream + ".>"}
}

// consumes are the API calls and acks of one durable pull consumer:
// CreateOrUpdateConsumer (with the filter in the subject when it has one),
// its info for readiness, pulls, and acks in both subject forms (the
// server's default, and with domain and account hash under the
// js_ack_fc_v2 feature flag).
func consumes(stream, durable, filter string) []string {
	create := "$JS.API.CONSUMER.CREATE." + stream + "." + durable
	out := []string{create}
	if filter != "" {
		out = append(out, create+"."+filter)
	}
	return append(out,
		"$JS.API.CONSUMER.INFO."+stream+"."+durable,
		"$JS.API.CONSUMER.MSG.NEXT."+stream+"."+durable,
		"$JS.ACK."+stream+"."+durable+".>",
		"$JS.ACK.*.*."+stream+"."+durable+".>")
}
