package main

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"strings"
	"time"

	"assay.dev/cmd/assay/internal/cli"
	"assay.dev/pkg/outcome"
	"assay.dev/pkg/store"
	"assay.dev/services/committer/publish"
	"assay.dev/services/ingress"
)

const devWebhookUsage = `usage: assay-dev dev webhook [--repo OWNER/REPO] [--pr N] [--action A] [--wait [--wait-for D]] [--url URL]

Send the running assay-dev dev --serve a pull_request delivery as GitHub would:
signed with the webhook secret serve keeps (assay/dev-serve.json in the
user's cache directory; $ASSAY_GITHUB_WEBHOOK_SECRET when set), naming the
fake GitHub App's installation, to the home cell of the repository's
tenant. It prints the work and how to watch it; --wait waits for its
outcome and its publication to GitHub, and prints both.
  --repo R    acme/shop (default; tenant acme, cell us) or globex/shop (globex, eu)
  --pr N      the pull request, 1 to 12 (default 1): the evaluation set's diffs
  --action A  opened (default), synchronize or reopened
  --wait      wait (up to --wait-for, default 3m) for the outcome and the publication
  --url URL   the cell to send it to (default: the tenant's home cell of the running serve)
`

// devWebhook runs `assay-dev dev webhook`.
func devWebhook(ctx context.Context, args []string, stdout io.Writer) error {
	fs := flag.NewFlagSet("assay-dev dev webhook", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	repo := fs.String("repo", "acme/shop", "the repository")
	pr := fs.Int64("pr", 1, "the pull request's number")
	action := fs.String("action", "opened", "opened, synchronize or reopened")
	wait := fs.Bool("wait", false, "wait for the outcome and the publication")
	waitFor := fs.Duration("wait-for", 3*time.Minute, "how long --wait waits")
	cellURL := fs.String("url", "", "the cell to send it to")
	if err := fs.Parse(args); err != nil {
		return cli.ConfigError{Err: fmt.Errorf("%v\n%s", err, devWebhookUsage)}
	}
	if fs.NArg() > 0 {
		return cli.ConfigError{Err: fmt.Errorf("unexpected argument %q\n%s", fs.Arg(0), devWebhookUsage)}
	}
	pull, err := findPull(*repo, *pr)
	if err != nil {
		return cli.ConfigError{Err: err}
	}
	tenant, _, _ := strings.Cut(pull.Repo, "/")
	run, err := readServeRun(devRunFile())
	if err != nil && *cellURL == "" {
		return cli.ConfigError{Err: err}
	}
	home := run.Homes[tenant]
	if *cellURL == "" {
		*cellURL = run.Cells[home]
	}
	secret, token, err := devWebhookSecrets(run, tenant)
	if err != nil {
		return cli.ConfigError{Err: err}
	}
	d := devDelivery{pull: pull, action: *action, installation: devInstallations[tenant]}
	resp, err := d.send(ctx, *cellURL, secret)
	if err != nil {
		return err
	}
	fmt.Fprintf(stdout, "delivery %s: pull_request %s of %s#%d at %.7s → cell %s (%s): HTTP %d, work %s (%s)\n",
		d.id, d.action, pull.Repo, pull.Number, pull.Head, home, *cellURL, d.status, resp.WorkID, resp.State)
	if run.GitHub == "" && run.Cells != nil {
		fmt.Fprintln(stdout, "note: this serve uses your GitHub settings, not the fake GitHub: the diff is fetched from there")
	}
	assay := assayName()
	fmt.Fprintf(stdout, "  watch it:    %s work watch %s     (the export line's ASSAY_URL and ASSAY_TOKEN)\n", assay, resp.WorkID)
	fmt.Fprintf(stdout, "  its story:   %s work show %s      (ASSAY_REGION, ASSAY_DATABASE_URL, ASSAY_NATS_URL)\n", assay, resp.WorkID)
	fmt.Fprintf(stdout, "  its page:    %s/console/work/%s\n", *cellURL, resp.WorkID)
	if run.GitHub != "" {
		fmt.Fprintf(stdout, "  on GitHub:   curl -s -H 'Authorization: token dev' %s/repos/%s/pulls/%d/reviews\n", run.GitHub, pull.Repo, pull.Number)
	}
	if !*wait {
		return nil
	}
	return watchDelivered(ctx, stdout, *cellURL, token, resp.WorkID, *waitFor)
}

// devWebhookSecrets are the webhook secret to sign with and the tenant's
// token to watch with, from the file serve keeps them in, the secret
// from $ASSAY_GITHUB_WEBHOOK_SECRET and the token from $ASSAY_TOKEN when
// they are set.
func devWebhookSecrets(run serveRun, tenant string) (secret, token string, err error) {
	var kept struct {
		Tokens        map[string]string `json:"tokens"`
		WebhookSecret string            `json:"webhookSecret"`
	}
	if run.Secrets != "" {
		raw, err := os.ReadFile(run.Secrets)
		if err != nil {
			return "", "", err
		}
		if err := json.Unmarshal(raw, &kept); err != nil {
			return "", "", fmt.Errorf("%s: %w", run.Secrets, err)
		}
	}
	secret, token = kept.WebhookSecret, kept.Tokens[tenant]
	if v := os.Getenv("ASSAY_GITHUB_WEBHOOK_SECRET"); v != "" {
		secret = v
	}
	if v := strings.TrimSpace(os.Getenv("ASSAY_TOKEN")); token == "" && v != "" {
		token = v
	}
	if secret == "" {
		return "", "", errors.New("no webhook secret: this serve keeps none (--fresh); set ASSAY_GITHUB_WEBHOOK_SECRET to the one it printed")
	}
	return secret, token, nil
}

// devDelivery is one pull_request delivery as GitHub sends it; send fills in
// its id and the answer's status.
type devDelivery struct {
	pull         devPull
	action       string
	installation int64
	id           string
	status       int
}

// body is the delivery's payload: the fields ingress reads, as GitHub
// spells them.
func (d *devDelivery) body() []byte {
	pr := map[string]any{"number": d.pull.Number, "title": d.pull.Title, "head": map[string]string{"sha": d.pull.Head},
		"base": map[string]string{"sha": d.pull.Base}, "updated_at": time.Now().UTC().Format(time.RFC3339Nano)}
	ev := map[string]any{"action": d.action, "number": d.pull.Number, "pull_request": pr,
		"repository": map[string]string{"full_name": d.pull.Repo}}
	if d.installation > 0 {
		ev["installation"] = map[string]int64{"id": d.installation}
	}
	b, _ := json.Marshal(ev)
	return b
}

// send posts the delivery, signed with secret, to the cell's webhook and
// returns the work it names; an answer without work is an error.
func (d *devDelivery) send(ctx context.Context, cellURL, secret string) (ingress.WebhookResponse, error) {
	var r ingress.WebhookResponse
	id := make([]byte, 16)
	_, _ = rand.Read(id)
	h := hex.EncodeToString(id)
	d.id = h[:8] + "-" + h[8:12] + "-" + h[12:16] + "-" + h[16:20] + "-" + h[20:]
	body := d.body()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, strings.TrimRight(cellURL, "/")+"/v1/webhooks/github", bytes.NewReader(body))
	if err != nil {
		return r, cli.ConfigError{Err: fmt.Errorf("--url: %w", err)}
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("X-GitHub-Event", "pull_request")
	req.Header.Set("X-GitHub-Delivery", d.id)
	req.Header.Set("X-Hub-Signature-256", ingress.Sign(secret, body))
	resp, err := (&http.Client{Timeout: 30 * time.Second}).Do(req)
	if err != nil {
		return r, fmt.Errorf("POST %s/v1/webhooks/github: %w (is assay-dev dev --serve running?)", cellURL, err)
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	d.status = resp.StatusCode
	if err := json.Unmarshal(raw, &r); err != nil || r.WorkID == "" || resp.StatusCode/100 != 2 {
		return r, fmt.Errorf("delivery %s to %s: HTTP %d: %s", d.id, cellURL, resp.StatusCode, bytes.TrimSpace(raw))
	}
	return r, nil
}

// watchDelivered waits for the work's outcome and its publication to
// GitHub (or the reason it has none), and prints them.
func watchDelivered(ctx context.Context, w io.Writer, cellURL, token, id string, limit time.Duration) error {
	if token == "" {
		return cli.ConfigError{Err: errors.New("--wait: no token of the tenant: this serve keeps none (--fresh); set ASSAY_TOKEN")}
	}
	c := &cli.APIClient{Base: strings.TrimRight(cellURL, "/"), Token: token, HTTP: &http.Client{}}
	deadline := time.Now().Add(limit)
	for {
		var v ingress.WorkView
		if _, err := c.Call(ctx, http.MethodGet, "/v1/work/"+id, nil, &v); err != nil {
			return err
		}
		if p, done := publishedTo(v); done {
			printDelivered(w, v, p)
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("work %s: no outcome published within %s (state %s); see assay work show %s", id, limit, v.State, id)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(250 * time.Millisecond):
		}
	}
}

// publishedTo is the work's publication to GitHub once it is settled
// (published, failed, or none with its reason); done is false until the
// work has an outcome and such a publication.
func publishedTo(v ingress.WorkView) (p ingress.PublicationView, done bool) {
	if v.Outcome == nil {
		return p, false
	}
	for _, p := range v.Publications {
		switch {
		case p.Target == publish.TargetNone:
			return p, true
		case p.Target == publish.TargetGitHub || p.Target == publish.TargetDry:
			if p.State != store.PublicationPending {
				return p, true
			}
		}
	}
	return p, false
}

func printDelivered(w io.Writer, v ingress.WorkView, p ingress.PublicationView) {
	findings := "no result"
	if v.Result != nil {
		findings = fmt.Sprintf("%d findings", v.Result.Findings)
	}
	attempts := fmt.Sprintf("%d attempt", len(v.Attempts))
	if len(v.Attempts) != 1 {
		attempts += "s"
	}
	fmt.Fprintf(w, "work %s: %s (%s, %s)\n", v.WorkID, *v.Outcome, findings, attempts)
	if *v.Outcome != outcome.Accepted && v.Reason != "" {
		fmt.Fprintf(w, "  reason: %s\n", v.Reason)
	}
	switch {
	case p.Target == publish.TargetNone:
		fmt.Fprintf(w, "not published: %s\n", p.Reason)
	case p.State == store.PublicationPublished:
		fmt.Fprintf(w, "published to %s: check run %d, %d review comments\n", p.Target, p.CheckRunID, len(p.CommentIDs))
	default:
		fmt.Fprintf(w, "publication to %s %s after %d tries: %s\n", p.Target, p.State, p.Tries, p.LastError)
	}
}
