package sim

import (
	"errors"
	"hash/maphash"
	"io"
	"net/http"
	"sync"

	"assay.dev/pkg/model"
)

// UsageDetails is what the provider reports beside its unit counts, as
// OpenAI reports it in usage.prompt_tokens_details and
// usage.completion_tokens_details. The zero UsageDetails reports none.
type UsageDetails struct {
	// CacheMinTokens, when positive, turns the prompt cache on, as
	// OpenAI's prompt caching works: a prompt whose first CacheMinTokens
	// units, and then each further CacheBlockTokens, were the start of a
	// prompt answered before (for the same model, by any tenant) has
	// those units reported as cached_tokens. A prompt is the text of its
	// messages, in order; the first call of a prefix caches it, later
	// ones read it. OpenAI's own: 1024.
	CacheMinTokens int `json:"cacheMinTokens,omitempty"`
	// CacheBlockTokens is the step of a cached prefix past
	// CacheMinTokens. Default (and OpenAI's) 128.
	CacheBlockTokens int `json:"cacheBlockTokens,omitempty"`
	// ReasoningTokens are added to every answer's completion units and
	// reported as its reasoning_tokens, as a reasoning model counts its
	// hidden reasoning inside completion_tokens.
	ReasoningTokens int `json:"reasoningTokens,omitempty"`
}

// maxCachedPrefixes bounds the prefixes the prompt cache remembers; past
// it the cache starts empty again, as a provider's cache evicts.
const maxCachedPrefixes = 1 << 20

// usageDetails is the server's UsageDetails and its prompt cache.
type usageDetails struct {
	mu       sync.Mutex
	cfg      UsageDetails
	seed     maphash.Seed
	prefixes map[uint64]struct{}
}

func (d *UsageDetails) validate() error {
	if d.CacheMinTokens < 0 || d.CacheBlockTokens < 0 || d.ReasoningTokens < 0 {
		return errors.New("usage details: counts cannot be negative")
	}
	if d.CacheBlockTokens > 0 && d.CacheMinTokens == 0 {
		return errors.New("usage details: cacheBlockTokens without cacheMinTokens")
	}
	return nil
}

// SetUsageDetails replaces what the provider reports beside its counts;
// the prompt cache starts empty.
func (s *Server) SetUsageDetails(d UsageDetails) error {
	if err := d.validate(); err != nil {
		return err
	}
	if d.CacheMinTokens > 0 && d.CacheBlockTokens == 0 {
		d.CacheBlockTokens = 128
	}
	s.details.mu.Lock()
	defer s.details.mu.Unlock()
	s.details.cfg, s.details.prefixes = d, map[uint64]struct{}{}
	return nil
}

// UsageDetails returns what the provider reports beside its counts, with
// defaults filled.
func (s *Server) UsageDetails() UsageDetails {
	s.details.mu.Lock()
	defer s.details.mu.Unlock()
	return s.details.cfg
}

// addDetails adds to u, the usage of c's answer, the details the server
// reports: the prompt's cached units, read from and then written to the
// prompt cache, and the answer's reasoning units.
func (s *Server) addDetails(c *call, u *model.Usage) {
	d := &s.details
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.cfg.ReasoningTokens > 0 {
		u.CompletionTokens += d.cfg.ReasoningTokens
		u.TotalTokens += d.cfg.ReasoningTokens
		u.CompletionTokensDetails.ReasoningTokens = d.cfg.ReasoningTokens
	}
	if d.cfg.CacheMinTokens <= 0 {
		return
	}
	cached := 0
	for _, h := range d.prefixHashes(cmpOr(c.req.Model, s.opts.Model), c.req.Messages) {
		if _, seen := d.prefixes[h.sum]; seen {
			cached = h.tokens
		}
		if len(d.prefixes) >= maxCachedPrefixes {
			clear(d.prefixes)
		}
		d.prefixes[h.sum] = struct{}{}
	}
	u.PromptTokensDetails.CachedTokens = min(cached, u.PromptTokens)
}

type prefixHash struct {
	tokens int
	sum    uint64
}

// prefixHashes are the hashes of the cacheable prefixes of a prompt to
// the model name: its first CacheMinTokens units, then each CacheBlockTokens more,
// counting a unit as 4 bytes as usage does.
func (d *usageDetails) prefixHashes(name string, msgs []model.Message) []prefixHash {
	var h maphash.Hash
	h.SetSeed(d.seed)
	_, _ = h.WriteString(name)
	_ = h.WriteByte(0)
	var out []prefixHash
	next, written := d.cfg.CacheMinTokens*4, 0
	for _, m := range msgs {
		text := m.Content
		for written+len(text) >= next {
			_, _ = h.WriteString(text[:next-written])
			text, written = text[next-written:], next
			out = append(out, prefixHash{tokens: next / 4, sum: h.Sum64()})
			next += d.cfg.CacheBlockTokens * 4
		}
		_, _ = h.WriteString(text)
		written += len(text)
	}
	return out
}

// routeUsageDetails serves GET, POST and DELETE /sim/usage-details.
func (s *Server) routeUsageDetails() {
	s.mux.HandleFunc("GET /sim/usage-details", func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, http.StatusOK, s.UsageDetails())
	})
	s.mux.HandleFunc("POST /sim/usage-details", func(w http.ResponseWriter, r *http.Request) {
		var d UsageDetails
		b, err := io.ReadAll(http.MaxBytesReader(w, r.Body, 1<<20))
		if err == nil {
			err = strictUnmarshal(b, &d)
		}
		if err == nil {
			err = s.SetUsageDetails(d)
		}
		if err != nil {
			writeError(w, http.StatusBadRequest, "invalid_request_error", "invalid_usage_details", err.Error())
			return
		}
		writeJSON(w, http.StatusOK, s.UsageDetails())
	})
	s.mux.HandleFunc("DELETE /sim/usage-details", func(w http.ResponseWriter, r *http.Request) {
		_ = s.SetUsageDetails(UsageDetails{})
		w.WriteHeader(http.StatusNoContent)
	})
}
