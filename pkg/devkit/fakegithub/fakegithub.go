// Package fakegithub is a GitHub REST API in memory, serving the shapes
// assay uses: installation tokens, check runs, pull request reviews with
// their comments, review comments and conversation comments (the
// publisher), and pull request diffs (ingress), each readable only with a
// token that may read its repository. It counts what was made, and can
// answer with a fault (a 5xx, a secondary rate limit), be down until told
// otherwise, stop answering after it has made something, as a dying
// publisher would see it, or hold each installation to GitHub's limits on
// content-creating requests.
package fakegithub

import (
	"crypto"
	"crypto/rsa"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"
)

// CheckRun is a check run as stored.
type CheckRun struct {
	ID         int64  `json:"id"`
	Name       string `json:"name"`
	HeadSHA    string `json:"head_sha"`
	ExternalID string `json:"external_id"`
	Status     string `json:"status"`
	Conclusion string `json:"conclusion"`
	Output     struct {
		Title   string `json:"title"`
		Summary string `json:"summary"`
	} `json:"output"`
	Repo  string `json:"-"`
	Edits int    `json:"-"`
}

// Comment is a review comment (Path set) or a conversation comment. A
// review comment made by a review names it (ReviewID).
type Comment struct {
	ID       int64  `json:"id"`
	Body     string `json:"body"`
	Path     string `json:"path,omitempty"`
	Line     int    `json:"line,omitempty"`
	CommitID string `json:"commit_id,omitempty"`
	Side     string `json:"side,omitempty"`
	ReviewID int64  `json:"pull_request_review_id,omitempty"`
	Repo     string `json:"-"`
	Number   int64  `json:"-"`
	Review   bool   `json:"-"`
	Edits    int    `json:"-"`
}

// Review is a pull request review as stored; its comments are stored as
// review comments (Comment.ReviewID).
type Review struct {
	ID       int64  `json:"id"`
	Body     string `json:"body"`
	CommitID string `json:"commit_id"`
	State    string `json:"state"`
	Repo     string `json:"-"`
	Number   int64  `json:"-"`
	// Comments is how many comments the review was made with.
	Comments int `json:"-"`
}

// reviewRequest is the body of a request that makes a review.
type reviewRequest struct {
	CommitID string    `json:"commit_id"`
	Body     string    `json:"body"`
	Event    string    `json:"event"`
	Comments []Comment `json:"comments"`
}

// Fault is an answer given instead of the real one.
type Fault struct {
	Status     int
	RetryAfter string // the Retry-After header, "" for none
	Body       string
	// Method and Path, when set, keep the fault for the first request of
	// that method whose path ends with Path (the faults queued after it
	// wait for it); when unset, the next request gets it.
	Method, Path string
}

// fits reports whether f is for r.
func (f Fault) fits(r *http.Request) bool {
	return (f.Method == "" || f.Method == r.Method) && strings.HasSuffix(r.URL.Path, f.Path)
}

// Request is one request the server got.
type Request struct {
	Method, Path string
	At           time.Time
	Status       int
}

// Server is the fake API.
type Server struct {
	*httptest.Server

	mu       sync.Mutex
	nextID   int64
	runs     []*CheckRun
	comments []*Comment
	reviews  []*Review
	faults   []Fault
	down     *Fault // answers every request but token ones while set
	hangs    int    // after making this many more things, hang instead of answering (0: never)
	hung     chan struct{}
	log      []Request

	appID    int64
	appKey   *rsa.PublicKey
	installs map[int64][]string // installation -> repository patterns
	static   string             // a token that reads every repository
	pulls    map[string]pull    // "owner/repo#n" -> the pull request

	clock      func() time.Time
	perMinute  int                   // content-creating requests an installation may make a minute (0: no limit)
	perHour    int                   // and an hour
	taken      map[int64][]time.Time // installation -> its content-creating requests taken, oldest first
	limited    int                   // requests refused for a secondary rate limit
	writes     []write               // content-creating requests that succeeded
	writesByID map[int64]int         // installation -> its writes
}

// write is one content-creating request that succeeded, and what it
// touched: a pull request (number), or a check run (run) whose pull
// request is found when asked.
type write struct {
	repo   string
	number int64
	run    int64
}

// pull is a pull request whose diff is served.
type pull struct {
	base, head, diff string
}

// New starts a fake API; Close stops it.
func New() *Server {
	s := &Server{nextID: 1000}
	mux := http.NewServeMux()
	mux.HandleFunc("POST /app/installations/{id}/access_tokens", s.token)
	mux.HandleFunc("GET /repos/{owner}/{repo}/commits/{sha}/check-runs", s.listRuns)
	mux.HandleFunc("POST /repos/{owner}/{repo}/check-runs", s.createRun)
	mux.HandleFunc("PATCH /repos/{owner}/{repo}/check-runs/{id}", s.editRun)
	mux.HandleFunc("GET /repos/{owner}/{repo}/pulls/{n}/comments", s.listComments(true))
	mux.HandleFunc("POST /repos/{owner}/{repo}/pulls/{n}/comments", s.createComment(true))
	mux.HandleFunc("PATCH /repos/{owner}/{repo}/pulls/comments/{id}", s.editComment(true))
	mux.HandleFunc("GET /repos/{owner}/{repo}/pulls/{n}/reviews", s.listReviews)
	mux.HandleFunc("POST /repos/{owner}/{repo}/pulls/{n}/reviews", s.createReview)
	mux.HandleFunc("GET /repos/{owner}/{repo}/pulls/{n}/reviews/{id}/comments", s.listReviewComments)
	mux.HandleFunc("GET /repos/{owner}/{repo}/issues/{n}/comments", s.listComments(false))
	mux.HandleFunc("POST /repos/{owner}/{repo}/issues/{n}/comments", s.createComment(false))
	mux.HandleFunc("PATCH /repos/{owner}/{repo}/issues/comments/{id}", s.editComment(false))
	mux.HandleFunc("GET /repos/{owner}/{repo}/compare/{basehead}", s.diff)
	mux.HandleFunc("GET /repos/{owner}/{repo}/pulls/{n}", s.diff)
	s.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		rec := &recorder{ResponseWriter: w, status: http.StatusOK}
		s.mu.Lock()
		var f *Fault
		if !strings.HasPrefix(r.URL.Path, "/app/") {
			if s.down != nil {
				f = s.down
			} else if len(s.faults) > 0 && s.faults[0].fits(r) {
				f = &s.faults[0]
				s.faults = s.faults[1:]
			}
		}
		s.mu.Unlock()
		if f != nil {
			if f.RetryAfter != "" {
				w.Header().Set("Retry-After", f.RetryAfter)
			}
			rec.WriteHeader(f.Status)
			fmt.Fprint(rec, f.Body)
		} else if tokenOf(r) == "" && !strings.HasPrefix(r.URL.Path, "/app/") {
			rec.WriteHeader(http.StatusUnauthorized)
			fmt.Fprint(rec, `{"message":"Bad credentials"}`)
		} else if wait, ok := s.admit(r); !ok {
			rec.Header().Set("Retry-After", strconv.Itoa(wait))
			rec.WriteHeader(http.StatusForbidden)
			fmt.Fprint(rec, secondaryLimit)
		} else {
			mux.ServeHTTP(rec, r)
		}
		s.mu.Lock()
		if f == nil && writes(r) && rec.status/100 == 2 {
			s.wrote(r, rec.run)
		}
		s.log = append(s.log, Request{Method: r.Method, Path: r.URL.Path, At: s.now(), Status: rec.status})
		s.mu.Unlock()
	}))
	return s
}

// secondaryLimit is the body of GitHub's answer to a request over a
// secondary rate limit.
const secondaryLimit = `{"message":"You have exceeded a secondary rate limit. Please wait a few minutes before you try again."}`

// writes reports whether r is a content-creating request, as GitHub's
// secondary limits count them: a POST, PATCH, PUT or DELETE to a
// repository.
func writes(r *http.Request) bool {
	switch r.Method {
	case http.MethodPost, http.MethodPatch, http.MethodPut, http.MethodDelete:
		return strings.HasPrefix(r.URL.Path, "/repos/")
	}
	return false
}

// installationOf is the installation whose token r carries: the id an
// installation token names, 0 for the static token or any other.
func installationOf(r *http.Request) int64 {
	id, err := strconv.ParseInt(strings.TrimPrefix(tokenOf(r), tokenPrefix), 10, 64)
	if !strings.HasPrefix(tokenOf(r), tokenPrefix) || err != nil {
		return 0
	}
	return id
}

func (s *Server) now() time.Time {
	if s.clock != nil {
		return s.clock()
	}
	return time.Now()
}

// Limit holds each installation to perMinute content-creating requests in
// any 60 seconds and perHour in any 3600 seconds of the server's clock (0
// for no limit of that window). A request past either is refused with 403,
// a Retry-After of the seconds until both windows allow one more, and the
// body GitHub gives for a secondary rate limit. A refused request does not
// count against the windows.
func (s *Server) Limit(perMinute, perHour int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.perMinute, s.perHour = perMinute, perHour
}

// SetClock makes now the server's clock, for Limit's windows and the
// times of Requests. The default is time.Now.
func (s *Server) SetClock(now func() time.Time) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.clock = now
}

// SecondaryLimited is how many requests Limit refused.
func (s *Server) SecondaryLimited() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.limited
}

// Writes is how many content-creating requests of installation succeeded
// (0 for the static token).
func (s *Server) Writes(installation int64) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.writesByID[installation]
}

// WritesTo is how many content-creating requests that succeeded touched
// pull request number of repo ("owner/repo"): its reviews and comments,
// and the check runs of its works. A check run counts for the pull request
// that carries a review or comment with the marker of the run's external
// id (the work), or else for a pull request added with AddPull whose head
// the run is on.
func (s *Server) WritesTo(repo string, number int64) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := 0
	for _, w := range s.writes {
		if w.repo == repo && (w.number == number || (w.run != 0 && s.pullOfRun(w.run) == number)) {
			n++
		}
	}
	return n
}

// pullOfRun is the pull request number check run id is for, 0 when none
// is known. Called with mu held.
func (s *Server) pullOfRun(id int64) int64 {
	var run *CheckRun
	for _, c := range s.runs {
		if c.ID == id {
			run = c
		}
	}
	if run == nil {
		return 0
	}
	if run.ExternalID != "" {
		mark := "<!-- assay:work=" + run.ExternalID + " "
		for _, v := range s.reviews {
			if v.Repo == run.Repo && strings.Contains(v.Body, mark) {
				return v.Number
			}
		}
		for _, c := range s.comments {
			if c.Repo == run.Repo && strings.Contains(c.Body, mark) {
				return c.Number
			}
		}
	}
	for key, p := range s.pulls {
		repo, num, _ := strings.Cut(key, "#")
		if repo == run.Repo && p.head == run.HeadSHA {
			n, _ := strconv.ParseInt(num, 10, 64)
			return n
		}
	}
	return 0
}

// admit takes a content-creating request into its installation's windows,
// or says how many seconds until it may be made.
func (s *Server) admit(r *http.Request) (wait int, ok bool) {
	if !writes(r) {
		return 0, true
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.perMinute <= 0 && s.perHour <= 0 {
		return 0, true
	}
	inst, now := installationOf(r), s.now()
	if s.taken == nil {
		s.taken = map[int64][]time.Time{}
	}
	// Requests an hour old leave both windows.
	taken := slices.DeleteFunc(s.taken[inst], func(t time.Time) bool { return !t.After(now.Add(-time.Hour)) })
	var until time.Duration
	for _, win := range []struct {
		limit int
		size  time.Duration
	}{{s.perMinute, time.Minute}, {s.perHour, time.Hour}} {
		if win.limit <= 0 {
			continue
		}
		var in []time.Time
		for _, t := range taken {
			if t.After(now.Add(-win.size)) {
				in = append(in, t)
			}
		}
		if len(in) >= win.limit {
			// The window allows one more once all but limit-1 of its
			// requests, the oldest, have left it.
			slices.SortFunc(in, time.Time.Compare)
			until = max(until, in[len(in)-win.limit].Add(win.size).Sub(now))
		}
	}
	if until > 0 {
		s.taken[inst] = taken
		s.limited++
		return int((until + time.Second - 1) / time.Second), false
	}
	s.taken[inst] = append(taken, now)
	return 0, true
}

// wrote counts a content-creating request that succeeded; run is the
// check run it made, if any. The request's path says what it touched:
// /repos/{owner}/{repo}/ then pulls/{n}/…, issues/{n}/…, pulls/comments/{id},
// issues/comments/{id} or check-runs[/{id}]. Called with mu held.
func (s *Server) wrote(r *http.Request, run int64) {
	if s.writesByID == nil {
		s.writesByID = map[int64]int{}
	}
	s.writesByID[installationOf(r)]++
	parts := strings.Split(strings.TrimPrefix(r.URL.Path, "/repos/"), "/")
	if len(parts) < 3 {
		return
	}
	w := write{repo: parts[0] + "/" + parts[1], run: run}
	at := func(i int) int64 {
		if i >= len(parts) {
			return 0
		}
		n, _ := strconv.ParseInt(parts[i], 10, 64)
		return n
	}
	switch {
	case parts[2] == "check-runs" && run == 0:
		w.run = at(3)
	case (parts[2] == "pulls" || parts[2] == "issues") && len(parts) > 3 && parts[3] == "comments":
		for _, c := range s.comments {
			if c.ID == at(4) {
				w.number = c.Number
			}
		}
	case parts[2] == "pulls" || parts[2] == "issues":
		w.number = at(3)
	}
	s.writes = append(s.writes, w)
}

type recorder struct {
	http.ResponseWriter
	status int
	run    int64 // the check run the request made, if any
}

func (r *recorder) WriteHeader(code int) { r.status = code; r.ResponseWriter.WriteHeader(code) }

// FailNext answers the next requests (other than token requests) with the
// faults, in order; a fault that names a method and path waits for such a
// request.
func (s *Server) FailNext(f ...Fault) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.faults = append(s.faults, f...)
}

// Down answers every request other than token requests with f until
// Down(nil): GitHub in an incident.
func (s *Server) Down(f *Fault) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.down = f
}

// App makes token requests prove they come from app id: a JWT it issued,
// signed with the private key of pub. Without it any JWT buys a token.
func (s *Server) App(id int64, pub *rsa.PublicKey) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.appID, s.appKey = id, pub
}

// Install records an installation of the App that may read the
// repositories patterns name ("owner/repo", or "owner/*" for all of an
// owner's): its token reads their diffs and no others.
func (s *Server) Install(id int64, patterns ...string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.installs == nil {
		s.installs = map[int64][]string{}
	}
	s.installs[id] = patterns
}

// StaticToken is a token that reads every repository's diffs, as one
// person's token would.
func (s *Server) StaticToken(token string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.static = token
}

// AddPull serves the diff of pull request number of repo ("owner/repo")
// from base to head, as compare/{base}...{head} and as pulls/{number}.
func (s *Server) AddPull(repo string, number int64, base, head, diff string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.pulls == nil {
		s.pulls = map[string]pull{}
	}
	s.pulls[fmt.Sprintf("%s#%d", repo, number)] = pull{base: base, head: head, diff: diff}
}

// HangAfter makes the server, once it has made n more check runs, reviews
// or comments (a review with its comments is one), keep the n-th and never
// answer for it: the caller sees a timeout after GitHub acted. The
// returned channel is closed when it hangs.
func (s *Server) HangAfter(n int) <-chan struct{} {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.hangs, s.hung = n, make(chan struct{})
	return s.hung
}

// Requests is every request so far.
func (s *Server) Requests() []Request {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]Request(nil), s.log...)
}

// CheckRuns are the check runs made.
func (s *Server) CheckRuns() []CheckRun {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]CheckRun, len(s.runs))
	for i, r := range s.runs {
		out[i] = *r
	}
	return out
}

// Comments are the comments made on pull requests, review comments (those
// a review made among them) and conversation ones.
func (s *Server) Comments() []Comment {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]Comment, len(s.comments))
	for i, c := range s.comments {
		out[i] = *c
	}
	return out
}

// Reviews are the pull request reviews made.
func (s *Server) Reviews() []Review {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]Review, len(s.reviews))
	for i, v := range s.reviews {
		out[i] = *v
	}
	return out
}

// CommentsOf counts the comments carrying a work's marker.
func (s *Server) CommentsOf(workID string) int {
	n := 0
	for _, c := range s.Comments() {
		if strings.Contains(c.Body, "<!-- assay:work="+workID+" ") {
			n++
		}
	}
	return n
}

func (s *Server) token(w http.ResponseWriter, r *http.Request) {
	jwt, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
	if !ok || strings.Count(jwt, ".") != 2 {
		http.Error(w, `{"message":"A JSON web token could not be decoded"}`, http.StatusUnauthorized)
		return
	}
	s.mu.Lock()
	id, pub := s.appID, s.appKey
	s.mu.Unlock()
	if pub != nil && !signedBy(jwt, id, pub) {
		http.Error(w, `{"message":"'Issuer' claim ('iss') must be an Integer"}`, http.StatusUnauthorized)
		return
	}
	w.WriteHeader(http.StatusCreated)
	writeJSON(w, map[string]any{"token": tokenPrefix + r.PathValue("id"), "expires_at": time.Now().Add(time.Hour).UTC()})
}

// tokenPrefix starts every installation token the server hands out; the
// installation's id follows.
const tokenPrefix = "ghs_fake_"

// signedBy reports whether jwt is an RS256 token issued by app id and
// signed with the key of pub.
func signedBy(jwt string, id int64, pub *rsa.PublicKey) bool {
	parts := strings.Split(jwt, ".")
	sig, err := base64.RawURLEncoding.DecodeString(parts[2])
	if err != nil {
		return false
	}
	sum := sha256.Sum256([]byte(parts[0] + "." + parts[1]))
	if rsa.VerifyPKCS1v15(pub, crypto.SHA256, sum[:], sig) != nil {
		return false
	}
	raw, err := base64.RawURLEncoding.DecodeString(parts[1])
	var claims struct {
		Iss string `json:"iss"`
	}
	return err == nil && json.Unmarshal(raw, &claims) == nil && claims.Iss == strconv.FormatInt(id, 10)
}

// tokenOf is the token a request carries ("token X" or "Bearer X"), "" for
// none.
func tokenOf(r *http.Request) string {
	a := r.Header.Get("Authorization")
	if t, ok := strings.CutPrefix(a, "token "); ok {
		return t
	}
	t, _ := strings.CutPrefix(a, "Bearer ")
	return t
}

// reads reports whether token may read repo: the static token reads every
// one, an installation's token those its patterns cover.
func (s *Server) reads(token, repo string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.static != "" && token == s.static {
		return true
	}
	id, err := strconv.ParseInt(strings.TrimPrefix(token, tokenPrefix), 10, 64)
	if !strings.HasPrefix(token, tokenPrefix) || err != nil {
		return false
	}
	owner, _, _ := strings.Cut(repo, "/")
	for _, p := range s.installs[id] {
		if p == repo || p == owner+"/*" {
			return true
		}
	}
	return false
}

// diff serves a pull request's diff to a token that may read its
// repository; to any other it is not found, as GitHub hides a private
// repository.
func (s *Server) diff(w http.ResponseWriter, r *http.Request) {
	repo := repoOf(r)
	if !s.reads(tokenOf(r), repo) || r.Header.Get("Accept") != "application/vnd.github.diff" {
		http.Error(w, `{"message":"Not Found"}`, http.StatusNotFound)
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	for key, p := range s.pulls {
		if !strings.HasPrefix(key, repo+"#") {
			continue
		}
		if r.PathValue("basehead") == p.base+"..."+p.head || key == repo+"#"+r.PathValue("n") {
			w.Header().Set("Content-Type", "text/plain; charset=utf-8")
			fmt.Fprint(w, p.diff)
			return
		}
	}
	http.Error(w, `{"message":"Not Found"}`, http.StatusNotFound)
}

func repoOf(r *http.Request) string { return r.PathValue("owner") + "/" + r.PathValue("repo") }

// listRuns lists a commit's check runs a page at a time, as GitHub does
// (per_page 30 unless given, at most 100).
func (s *Server) listRuns(w http.ResponseWriter, r *http.Request) {
	s.mu.Lock()
	var all []CheckRun
	for _, c := range s.runs {
		if c.Repo == repoOf(r) && c.HeadSHA == r.PathValue("sha") && (r.URL.Query().Get("check_name") == "" || c.Name == r.URL.Query().Get("check_name")) {
			all = append(all, *c)
		}
	}
	s.mu.Unlock()
	from, to := page(r, len(all))
	writeJSON(w, map[string]any{"total_count": len(all), "check_runs": append([]CheckRun{}, all[from:to]...)})
}

// AddCheckRun records a check run made by someone else on a commit of repo
// (owner/name).
func (s *Server) AddCheckRun(repo string, c CheckRun) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.nextID++
	c.ID, c.Repo = s.nextID, repo
	s.runs = append(s.runs, &c)
}

func (s *Server) createRun(w http.ResponseWriter, r *http.Request) {
	var c CheckRun
	if json.NewDecoder(r.Body).Decode(&c) != nil || c.Name == "" || c.HeadSHA == "" {
		http.Error(w, `{"message":"Invalid request"}`, http.StatusUnprocessableEntity)
		return
	}
	c.Repo = repoOf(r)
	s.mu.Lock()
	s.nextID++
	c.ID = s.nextID
	s.runs = append(s.runs, &c)
	hang := s.made()
	s.mu.Unlock()
	if rec, ok := w.(*recorder); ok {
		rec.run = c.ID
	}
	if hang {
		<-r.Context().Done()
		return
	}
	w.WriteHeader(http.StatusCreated)
	writeJSON(w, c)
}

func (s *Server) editRun(w http.ResponseWriter, r *http.Request) {
	id, _ := strconv.ParseInt(r.PathValue("id"), 10, 64)
	var in CheckRun
	if json.NewDecoder(r.Body).Decode(&in) != nil {
		http.Error(w, `{"message":"Invalid request"}`, http.StatusUnprocessableEntity)
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, c := range s.runs {
		if c.ID == id && c.Repo == repoOf(r) {
			c.Status, c.Conclusion, c.Output, c.Edits = in.Status, in.Conclusion, in.Output, c.Edits+1
			writeJSON(w, c)
			return
		}
	}
	http.Error(w, `{"message":"Not Found"}`, http.StatusNotFound)
}

func (s *Server) listComments(review bool) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		n, _ := strconv.ParseInt(r.PathValue("n"), 10, 64)
		s.mu.Lock()
		var all []Comment
		for _, c := range s.comments {
			if c.Review == review && c.Repo == repoOf(r) && c.Number == n {
				all = append(all, *c)
			}
		}
		s.mu.Unlock()
		from, to := page(r, len(all))
		writeJSON(w, append([]Comment{}, all[from:to]...))
	}
}

func (s *Server) createComment(review bool) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		n, _ := strconv.ParseInt(r.PathValue("n"), 10, 64)
		var c Comment
		if json.NewDecoder(r.Body).Decode(&c) != nil || c.Body == "" || (review && (c.Path == "" || c.Line <= 0 || c.CommitID == "")) {
			http.Error(w, `{"message":"Validation Failed"}`, http.StatusUnprocessableEntity)
			return
		}
		c.Repo, c.Number, c.Review = repoOf(r), n, review
		s.mu.Lock()
		s.nextID++
		c.ID = s.nextID
		s.comments = append(s.comments, &c)
		hang := s.made()
		s.mu.Unlock()
		if hang {
			<-r.Context().Done()
			return
		}
		w.WriteHeader(http.StatusCreated)
		writeJSON(w, c)
	}
}

func (s *Server) editComment(review bool) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		id, _ := strconv.ParseInt(r.PathValue("id"), 10, 64)
		var in Comment
		if json.NewDecoder(r.Body).Decode(&in) != nil || in.Body == "" {
			http.Error(w, `{"message":"Validation Failed"}`, http.StatusUnprocessableEntity)
			return
		}
		s.mu.Lock()
		defer s.mu.Unlock()
		for _, c := range s.comments {
			if c.ID == id && c.Review == review && c.Repo == repoOf(r) {
				c.Body, c.Edits = in.Body, c.Edits+1
				writeJSON(w, c)
				return
			}
		}
		http.Error(w, `{"message":"Not Found"}`, http.StatusNotFound)
	}
}

// page is the part of n items a list request asks for, as GitHub pages
// (per_page 30 unless given, at most 100): items from to to.
func page(r *http.Request, n int) (from, to int) {
	page, _ := strconv.Atoi(r.URL.Query().Get("page"))
	per, _ := strconv.Atoi(r.URL.Query().Get("per_page"))
	page, per = max(page, 1), min(max(per, 1), 100)
	if r.URL.Query().Get("per_page") == "" {
		per = 30
	}
	return min((page-1)*per, n), min(page*per, n)
}

// listReviews lists a pull request's reviews a page at a time.
func (s *Server) listReviews(w http.ResponseWriter, r *http.Request) {
	n, _ := strconv.ParseInt(r.PathValue("n"), 10, 64)
	s.mu.Lock()
	var all []Review
	for _, v := range s.reviews {
		if v.Repo == repoOf(r) && v.Number == n {
			all = append(all, *v)
		}
	}
	s.mu.Unlock()
	from, to := page(r, len(all))
	writeJSON(w, append([]Review{}, all[from:to]...))
}

// listReviewComments lists the comments a review made, a page at a time.
func (s *Server) listReviewComments(w http.ResponseWriter, r *http.Request) {
	n, _ := strconv.ParseInt(r.PathValue("n"), 10, 64)
	id, _ := strconv.ParseInt(r.PathValue("id"), 10, 64)
	s.mu.Lock()
	found := false
	for _, v := range s.reviews {
		found = found || (v.ID == id && v.Repo == repoOf(r) && v.Number == n)
	}
	var all []Comment
	for _, c := range s.comments {
		if c.ReviewID == id && c.Repo == repoOf(r) && c.Number == n {
			all = append(all, *c)
		}
	}
	s.mu.Unlock()
	if !found {
		http.Error(w, `{"message":"Not Found"}`, http.StatusNotFound)
		return
	}
	from, to := page(r, len(all))
	writeJSON(w, append([]Comment{}, all[from:to]...))
}

// createReview makes a submitted review (event COMMENT) at a commit, and
// each of its comments as a review comment of the pull request.
func (s *Server) createReview(w http.ResponseWriter, r *http.Request) {
	n, _ := strconv.ParseInt(r.PathValue("n"), 10, 64)
	var in reviewRequest
	ok := json.NewDecoder(r.Body).Decode(&in) == nil && in.CommitID != "" && in.Event == "COMMENT" &&
		(in.Body != "" || len(in.Comments) > 0)
	for _, c := range in.Comments {
		ok = ok && c.Path != "" && c.Line > 0 && c.Body != "" && (c.Side == "" || c.Side == "RIGHT" || c.Side == "LEFT")
	}
	if !ok {
		http.Error(w, `{"message":"Validation Failed"}`, http.StatusUnprocessableEntity)
		return
	}
	v := Review{Body: in.Body, CommitID: in.CommitID, State: "COMMENTED", Repo: repoOf(r), Number: n, Comments: len(in.Comments)}
	s.mu.Lock()
	s.nextID++
	v.ID = s.nextID
	s.reviews = append(s.reviews, &v)
	for _, c := range in.Comments {
		s.nextID++
		s.comments = append(s.comments, &Comment{ID: s.nextID, Body: c.Body, Path: c.Path, Line: c.Line, CommitID: in.CommitID,
			Side: c.Side, ReviewID: v.ID, Repo: v.Repo, Number: n, Review: true})
	}
	hang := s.made()
	s.mu.Unlock()
	if hang {
		<-r.Context().Done()
		return
	}
	writeJSON(w, v)
}

// made counts one thing made against HangAfter; true means hang. Called
// with mu held.
func (s *Server) made() bool {
	if s.hangs == 0 {
		return false
	}
	s.hangs--
	if s.hangs == 0 {
		close(s.hung)
		return true
	}
	return false
}

func writeJSON(w http.ResponseWriter, v any) {
	if w.Header().Get("Content-Type") == "" {
		w.Header().Set("Content-Type", "application/json; charset=utf-8")
	}
	_ = json.NewEncoder(w).Encode(v)
}
